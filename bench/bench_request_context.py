"""The request id's and trace propagation's own cost per call, in-process (prints numbers, never asserts).

    python bench/bench_request_context.py

A request pays ``adopt`` once per service (the gateway makes an id: ``adopt(None)``; each runner
takes the one it was sent) and ``outgoing`` once per internal call; with ``GSAGE_TRACING`` on,
``outgoing`` also injects ``traceparent`` (BentoML's span middleware is the larger cost then:
``python -m bench.suite.ab --variant GSAGE_TRACING=1`` measures the whole of it). A request whose
item waits in a batcher's queue also pays a context copy (the batch runs in its first caller's),
and every batch call ``merged`` (nothing unless tracing merges several).
"""

from __future__ import annotations

import contextvars
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import request_context

CALLS = 200_000


def per_call_us(fn: object) -> float:
    return timeit.timeit(fn, number=CALLS) / CALLS * 1e6  # type: ignore[arg-type]


def main() -> None:
    request_context.enable_tracing(False)
    made = per_call_us(lambda: request_context.adopt(None))
    given = per_call_us(lambda: request_context.adopt("req-123"))
    out = per_call_us(request_context.outgoing)
    request_context.enable_tracing(True)
    out_traced = per_call_us(request_context.outgoing)
    request_context.enable_tracing(False)
    copied = per_call_us(contextvars.copy_context)
    members = [contextvars.copy_context()] * 4
    merge = per_call_us(lambda: request_context.merged(members).__enter__())
    per_request = made + 2 * given + 2 * out
    print(f"adopt, id made:            {made:6.2f} us")
    print(f"adopt, id given:           {given:6.2f} us")
    print(f"outgoing:                  {out:6.2f} us")
    print(f"outgoing, tracing on:      {out_traced:6.2f} us (no span open: the injection's own work)")
    print(f"queued item's context:     {copied:6.2f} us")
    print(f"merged, tracing off:       {merge:6.2f} us (per batch)")
    print(f"per request, tracing off:  {per_request:6.2f} us (gateway + two runners, two internal calls)")


if __name__ == "__main__":
    main()
