"""Plots (PNG) and the Markdown report (``report.md``, beside the plots) from the suite's JSON.

    python -m bench.suite --report-from bench/results/suite.json   # re-render without re-running

What it judges is data: the scenarios in ``bench/suite/scenarios.py`` (the rows are found by
those objects) and the targets and baselines in ``bench/suite/targets.py`` (each target's verdict
and "missed by" come from its checks). The report is the only thing written about a run;
docs/performance.md explains the targets and links to it.
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import sys
from collections.abc import Callable, Mapping
from typing import Any

from bench.suite import scenarios as sc
from bench.suite.layers import B5_WORK
from bench.suite.scenarios import Scenario
from bench.suite.targets import (
    B1,
    B2,
    B3,
    B3_CALLERS,
    B3_IDLE,
    B3_NO_L1,
    B3_WITH_L1,
    B4,
    B4_ALL_THREADS,
    B4_CALLERS,
    B4_ONE_THREAD,
    B5,
    BASELINES,
    T1,
    T2,
    T3,
    T4,
    T5,
    T6,
    T7,
    TARGETS,
    Baseline,
    Target,
)

NAN = float("nan")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(ROOT, "docs", "performance.md")


def _pyplot():
    """matplotlib, imported on first plot: the targets' logic must not need the bench extra."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def by_name(res: dict) -> dict[str, dict]:
    return {s["name"]: s for s in res["scenarios"]}


def f(x: Any, fmt: str = "{:.2f}") -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "n/a"
    return fmt.format(x)


def ms(stage: dict | None, key: str = "mean_s") -> float:
    if not stage or stage.get(key) is None:
        return NAN
    return stage[key] * 1e3


def retrieval_p99(row: dict | None) -> tuple[float, bool]:
    """A window's feature-retrieval P99 in ms and whether it was measured: from the FeatureRunner's
    whole-fetch histogram where it has one, else bounded by the sum of the levels' P99s (older
    runs)."""
    st = (row or {}).get("stages", {})
    whole = ms(st.get("feature_fetch"), "p99_s")
    if whole == whole:
        return whole, True
    return sum(v for v in (ms(st.get(f"feature_{k}"), "p99_s") for k in ("l1", "l2", "origin")) if v == v), False


def paired_or_own(s: dict[str, dict], app: Scenario, base: Scenario) -> tuple[dict | None, dict | None, dict | None]:
    """The app's and the baseline's rows a target is judged on: the interleaved "(paired)" windows
    when the run has both, else the scenarios' own windows; and the app's own window (its CPU)."""
    pa, pb = s.get(app.paired_name), s.get(base.paired_name)
    if pa and pb and pa.get("ok") and pb.get("ok"):
        return pa, pb, s.get(app.name)
    return s.get(app.name), s.get(base.name), s.get(app.name)


def pairing_note(
    s: dict[str, dict], a: dict, b: dict, app: Scenario, base: Scenario, figure: Callable[[dict], float | None]
) -> str:
    """How the judged ratio was measured, the interleaved windows' own spread, and the ratio of
    the separate windows for comparison."""
    if a.get("group") != "paired":
        return " (separate windows)"
    per = [wa_v / wb_v for wa, wb in zip(a["windows"], b["windows"]) if (wa_v := figure(wa)) and (wb_v := figure(wb))]
    note = f" (interleaved, {len(a['windows'])} windows each"
    if per:
        note += f"; per window pair {min(per):.2f}-{max(per):.2f}x"
    own_a, own_b = s.get(app.name), s.get(base.name)
    if own_a and own_b and figure(own_b):
        note += f"; separate windows {figure(own_a) / figure(own_b):.2f}x"
    return note + ")"


# -- targets ---------------------------------------------------------------------------------------
#
# Each target's renderer picks the rows it is judged on (``Target.app``, its baselines) and words
# the figures; ``_verdict`` judges them by the target's checks.


def _cpu(row: dict | None) -> str:
    if not row:
        return ""
    u = row.get("cpu_util", {})
    return ", ".join(f"{k} {v:.0%}" for k, v in sorted(u.items(), key=lambda kv: -kv[1]))


def _verdict(
    t: Target,
    row: Mapping,
    base_rows: Mapping[Baseline, Mapping],
    *,
    figure: str,
    baseline: str,
    floor: str = "",
    note: str = "",
    cpu: str = "",
) -> dict:
    """The table row of target ``t``: judged by its checks on ``row`` (and ``base_rows`` for the
    ratios); ``floor`` is appended to a miss (a baseline missed the bound too)."""
    values = t.values(row, base_rows)
    ok, miss = t.judge(values)
    ratio = ", ".join(f"{v:.2f}x {c.vs.id}" for c, v in zip(t.checks, values) if c.vs is not None and v is not None)
    return {
        "id": t.id,
        "what": t.title,
        "pass": ok,
        "figure": figure,
        "baseline": baseline,
        "ratio": ratio + note,
        "miss_by": None if ok else miss + floor,
        "cpu": cpu,
        "target": t,
    }


def _pair_note(t: Target, s: dict[str, dict], a: dict, b: dict) -> str:
    metric = t.ratio_metric
    return pairing_note(s, a, b, t.app[0], t.pairing.against, lambda r: r.get(metric))


def _target_single_c1(t: Target, res: dict, s: dict[str, dict]) -> dict | None:
    app, b1, own = paired_or_own(s, t.app[0], t.pairing.against)
    if not (app and b1):
        return None
    base = t.baselines[0]
    return _verdict(
        t,
        app,
        {base: b1},
        figure=f"P99 {app['p99_ms']:.2f} ms (P50 {app['p50_ms']:.2f})",
        baseline=f"{base.id} P99 {b1['p99_ms']:.2f} ms (P50 {b1['p50_ms']:.2f})",
        note=_pair_note(t, s, app, b1),
        cpu=_cpu(own),
        floor=floor_note(f"{base.id}, doing no work,", b1["p99_ms"], app["p99_ms"], t.absolute("p99_ms").bound),
    )


def _target_single_c32(t: Target, res: dict, s: dict[str, dict]) -> dict | None:
    app, b2, own = paired_or_own(s, t.app[0], t.pairing.against)
    if not (app and b2):
        return None
    base = t.baselines[0]
    b1 = s.get(sc.B1_C32.name)  # the three trivial services at the same concurrency, for comparison
    return _verdict(
        t,
        app,
        {base: b2},
        figure=f"{app['req_per_s']:.0f} req/s, P99 {app['p99_ms']:.1f} ms, {app['error_count']} errors"
        f"{', ' + str(app['degraded']) + ' degraded' if app['degraded'] else ''}",
        baseline=f"{base.id} {b2['req_per_s']:.0f} req/s (P99 {b2['p99_ms']:.1f} ms)"
        + (f"; {B1.id} {b1['req_per_s']:.0f} req/s (P99 {b1['p99_ms']:.1f} ms)" if b1 else ""),
        note=_pair_note(t, s, app, b2),
        cpu=_cpu(own),
        floor=floor_note(f"{base.id}, doing no work,", b2["p99_ms"], app["p99_ms"], t.absolute("p99_ms").bound),
    )


def _target_bulk(t: Target, res: dict, s: dict[str, dict]) -> dict | None:
    bulk = [s[x.name] for x in t.app if x.name in s]
    inproc = res.get("baselines", {}).get("inproc", {})
    best_base = {b: best_of(inproc, b) for b in t.baselines}
    if not (bulk and all(best_base.values())):
        return None
    best = max(bulk, key=lambda r: r["nodes_per_s"])
    b3, b4 = (best_base[b] for b in t.baselines)
    return _verdict(
        t,
        best,
        best_base,
        figure=f"{best['nodes_per_s']:,.0f} nodes/s ({best['name']}, P50 {best['p50_ms']:.1f} ms)",
        baseline=f"{t.baselines[0].id} {b3['nodes_per_s']:,.0f} nodes/s (P50 {b3['p50_ms']:.1f} ms; "
        f"{_variant(b3)}); {t.baselines[1].id} {b4['nodes_per_s']:,.0f} nodes/s ({_variant(b4)})",
        cpu=_cpu(best),
    )


def _target_retrieval(t: Target, res: dict, s: dict[str, dict]) -> dict | None:
    warmest, first_sc = t.app
    app = s.get(warmest.name) or s.get(first_sc.name)
    first = s.get(first_sc.name)
    if not app:
        return None
    st = app.get("stages", {})
    p99 = {k: ms(st.get(f"feature_{k}"), "p99_s") for k in ("l1", "l2", "origin")}
    share = {
        k: (st.get(f"feature_{k}", {}).get("count", 0) / max(st.get("feature_l1", {}).get("count", 1), 1))
        for k in ("l1", "l2", "origin")
    }
    fetch_p99, measured = retrieval_p99(app)
    first_p99 = retrieval_p99(first)[0] if first is not None and first is not app else NAN
    rel = "=" if measured else "<="  # the whole fetch's histogram, or the sum of the levels' P99s
    hr = app.get("hit_ratio") or {}
    combined = hr.get("combined", NAN)
    judged = max(fetch_p99, first_p99) if first_p99 == first_p99 else fetch_p99
    nr = s.get(sc.NOREDIS_C1.name)
    nr_p99, nr_measured = retrieval_p99(nr) if nr else (NAN, False)
    return _verdict(
        t,
        {"retrieval_p99_ms": judged, "hit_pct": combined * 100},
        {},
        figure=f"retrieval P99 {rel} {fetch_p99:.3f} ms (per level: L1 {f(p99['l1'], '{:.3f}')}, "
        f"L2 {f(p99['l2'], '{:.3f}')} in {share['l2']:.0%} of batches, origin "
        f"{f(p99['origin'], '{:.3f}')} in {share['origin']:.0%}); hit L1+L2 {combined:.1%} "
        f"(L1 {hr.get('l1', NAN):.1%}, L2 {hr.get('l2', NAN):.1%}; {app['name']}, "
        f"{app.get('redis_keys_after', 0):,} rows in Redis)"
        + (
            f"; first warm window: retrieval P99 {rel} {first_p99:.3f} ms, hit {first['hit_ratio']['combined']:.1%}"
            if first is not app and first.get("hit_ratio")
            else ""
        ),
        baseline=t.reference
        + (
            f"; without Redis (L1 + memory-mapped origin) retrieval P99 {'=' if nr_measured else '<='} {nr_p99:.3f} ms"
            if nr
            else ""
        )
        + mget_line(res.get("baselines", {}).get("redis_mget", {})),
        floor=floor_note("a bare MGET after idle", mget_idle_p99(res), judged, t.absolute("retrieval_p99_ms").bound),
    )


def _target_scale(t: Target, res: dict, s: dict[str, dict]) -> dict | None:
    window = t.app[0]
    rows = [r for r in res["scenarios"] if r.get("graph") == window.graph]
    if not rows:
        return {
            "id": t.id,
            "what": t.title,
            "pass": None,
            "target": t,
            "figure": "not run (" + "; ".join(x for x in res.get("skipped", []) if window.graph in x) + ")",
            "baseline": "",
            "ratio": "",
            "miss_by": None,
            "cpu": "",
        }
    errs = sum(r["error_count"] for r in rows)
    w = s.get(window.name)
    return _verdict(
        t,
        {"error_count": errs} if w is not None else {},
        {},  # no c=1 window: not met
        figure=f"{sum(r['ok'] for r in rows):,} requests, {errs} errors; c=1 P99 {f(w and w.get('p99_ms'))} ms",
        baseline=f"{sc.SINGLE_C1.graph}: c=1 P99 " + f(s.get(sc.SINGLE_C1.name, {}).get("p99_ms")) + " ms",
    )


# Which rows each target is judged on and how its figures read; the bounds are the target's own.
RENDER: dict[str, Callable[[Target, dict, dict[str, dict]], dict | None]] = {
    T1.id: _target_single_c1,
    T6.id: _target_single_c1,
    T2.id: _target_single_c32,
    T7.id: _target_single_c32,
    T3.id: _target_bulk,
    T4.id: _target_retrieval,
    T5.id: _target_scale,
}


def targets(res: dict, defs: tuple[Target, ...] | None = None) -> list[dict]:
    """One table row per target of ``defs`` (default ``TARGETS``) the run measured, judged by the
    target's checks."""
    s = by_name(res)
    return [row for t in (TARGETS if defs is None else defs) if (row := RENDER[t.id](t, res, s)) is not None]


def what_if(s: dict[str, dict], scenario: Scenario) -> dict | None:
    """The batching-window what-if of ``scenario`` (named after the delay it ran with)."""
    return next((r for n, r in s.items() if n.startswith(scenario.what_if_prefix)), None)


def top_parts(row: dict | None, k: int = 3) -> str:
    if not row or not row.get("stages"):
        return ""
    parts = sorted(breakdown(row).items(), key=lambda kv: -kv[1])[:k]
    return ", ".join(f"{name} {v:.1f} ms" for name, v in parts)


def cpu_extra(app: dict | None, base: dict | None) -> str:
    """ms of CPU per request each service spends beyond the baseline's (psutil, same run)."""
    if not app or not base or not app.get("req_per_s") or not base.get("req_per_s"):
        return ""
    per = {
        k: 1e3 * (app["cpu_util"].get(k, 0.0) / app["req_per_s"] - base["cpu_util"].get(k, 0.0) / base["req_per_s"])
        for k in ("gateway", "feature", "model")
        if k in app.get("cpu_util", {})
    }
    return ", ".join(f"{k} {v:+.2f} ms" for k, v in per.items())


def machine_line(cfg: dict) -> str:
    speeds = cfg.get("machine_speed") or []
    if not speeds:
        return ""
    when = ["at start", "at end"][: len(speeds)]
    return (
        "Machine speed ("
        + ", ".join(when)
        + "): a pure-Python loop of 10M additions "
        + " / ".join(f"{x['python_loop_s']:.2f}" for x in speeds)
        + " s, a wake-up round trip between two processes (pipe ping-pong) "
        + " / ".join(f"{x['ping_pong_us']:.1f}" for x in speeds)
        + " us. "
    )


def mget_line(mget: dict) -> str:
    """T4's floor: the bare MGET from the suite process, back to back and after idle gaps."""
    if not mget.get("calls"):
        return ""
    line = (
        f"; a bare MGET of {mget['keys_per_call']} cached rows from the suite process: P50 "
        f"{mget['p50_ms']:.2f} ms, P99 {mget['p99_ms']:.2f} ms back to back"
    )
    idle = mget.get("idle", {})
    if idle.get("calls"):
        line += f", P50 {idle['p50_ms']:.2f} ms, P99 {idle['p99_ms']:.2f} ms after {idle['idle_ms']:g} ms idle"
    return line


def limited_by(res: dict, tg: list[dict]) -> None:
    """Attach a measured 'what limits it' line to each missed target."""
    s = by_name(res)
    for t in tg:
        if t["pass"] is False and t["id"] in LIMITS:
            LIMITS[t["id"]](t, res, s)


def _limit_single_c1(t: dict, res: dict, s: dict[str, dict]) -> None:
    target: Target = t["target"]
    app, b1 = s.get(target.app[0].name), s.get(target.pairing.against.name)
    parts = breakdown(app)
    work = sum(
        v
        for k, v in parts.items()
        if k
        in ("feature: sample", "feature: L1", "feature: L2", "feature: origin", "feature: assemble", "model: compute")
    )
    t["limit"] = (
        f"mean {app['mean_ms']:.2f} ms vs {B1.id} {b1['mean_ms']:.2f} ms: +{app['mean_ms'] - b1['mean_ms']:.2f} ms, "
        f"of which sampling+fetch+assemble+forward {work:.2f} ms and the model batcher's wait "
        f"{parts['model: queue']:.2f} ms (GSAGE_MAX_BATCH_DELAY_MS); largest: {top_parts(app)}"
    )
    inproc = res.get("baselines", {}).get("inproc", {})
    b3, idle = inproc.get(B3_WITH_L1.key, {}).get("1"), inproc.get(B3_IDLE.key, {}).get("1")
    if b3:
        t["limit"] += (
            f"; the same work in one process ({B3.id}, 1 node, sampler + ONNX Runtime, L1): mean "
            f"{b3['mean_ms']:.2f} ms back to back, {work / b3['mean_ms']:.1f}x less than its "
            "stages in the services"
        )
    if b3 and idle:
        t["limit"] += (
            f", but {idle['mean_ms']:.2f} ms ({idle['mean_ms'] / b3['mean_ms']:.1f}x) with "
            f"{inproc.get('idle_ms', 0):g} ms of idle before each call, as a service at c=1 "
            "waits between requests"
        )
    extra = cpu_extra(app, b1)
    if extra:
        t["limit"] += f"; CPU per request beyond {B1.id}'s: {extra}"
    for p in (sc.PROFILE_FEATURE_C1, sc.PROFILE_MODEL_C1):
        prof = res.get("profiles", {}).get(p.key)
        if prof:
            t["limit"] += f"; {p.service} profile at c={p.scenario.concurrency}: " + ", ".join(
                f"{k} {v:.0%}" for k, v in list(prof["by_component"].items())[:5]
            )
    d0 = what_if(s, target.app[0])
    if d0:
        t["limit"] += (
            f"; {d0['name']}: P99 {d0['p99_ms']:.2f} ms (P50 {d0['p50_ms']:.2f}), model queue "
            f"{ms(d0.get('stages', {}).get('model_queue')):.2f} ms"
        )


def _limit_colocated_c1(t: dict, res: dict, s: dict[str, dict]) -> None:
    """T1: what the co-located request spends beyond B5's, by stage (the services' own histograms,
    all three in one process) and by layer (its profile at c=1: each sample charged to the
    innermost layer of the app's it is in, ``bench.suite.layers``)."""
    target: Target = t["target"]
    app, base = s.get(target.app[0].name), s.get(target.pairing.against.name)
    if not (app and base):
        return
    t["limit"] = (
        f"in their own windows, P50 {app['p50_ms']:.2f} ms vs {B5.id} {base['p50_ms']:.2f} ms: "
        f"+{app['p50_ms'] - base['p50_ms']:.2f} ms (mean +{app['mean_ms'] - base['mean_ms']:.2f} ms); largest "
        f"stages: {top_parts(app)}"
    )
    mine, theirs = (sum(v for k, v in cpu_per_request(row).items() if k != "loadgen") for row in (app, base))
    if mine and theirs:
        t["limit"] += f"; CPU per request {mine:.2f} ms vs {B5.id}'s {theirs:.2f} ms"
    prof = res.get("profiles", {}).get(sc.PROFILE_COLOCATED_C1.key)
    if prof and prof.get("by_layer"):
        own = {k: v for k, v in prof["by_layer"].items() if k not in B5_WORK}
        t["limit"] += (
            f"; its profile at c=1 (on-CPU {prof['busy_fraction']:.0%} of wall time): the work {B5.id} does too "
            f"{sum(prof['by_layer'].get(k, 0.0) for k in B5_WORK):.0%} of samples, then "
            + ", ".join(f"{k} {v:.0%}" for k, v in list(own.items())[:6])
        )


def _limit_single_c32(t: dict, res: dict, s: dict[str, dict]) -> None:
    target: Target = t["target"]
    app = s.get(target.app[0].name)
    u = sorted(app["cpu_util"].items(), key=lambda kv: -kv[1])
    total = sum(v for _, v in u)
    p = sc.PROFILE_GATEWAY_C32
    prof = res.get("profiles", {}).get(p.key)
    t["limit"] = (
        f"CPU: our processes used {total:.2f} of 2 cores ("
        + ", ".join(f"{k} {v:.2f}" for k, v in u)
        + f"); largest stages: {top_parts(app)}"
    )
    if prof:
        t["limit"] += f"; {p.service} profile: " + ", ".join(
            f"{k} {v:.0%}" for k, v in list(prof["by_component"].items())[:4]
        )
    d0 = what_if(s, target.app[0])
    if d0:
        t["limit"] += f"; {d0['name']}: {d0['req_per_s']:.0f} req/s, P99 {d0['p99_ms']:.1f} ms"


def _limit_bulk(t: dict, res: dict, s: dict[str, dict]) -> None:
    target: Target = t["target"]
    rows = [s[x.name] for x in target.app if x.name in s]
    best = max(rows, key=lambda r: r["nodes_per_s"])
    b1 = s.get(sc.B1_BULK_256.name)
    t["limit"] = f"{best['name']}: largest stages {top_parts(s.get(target.app[0].name))}"
    if b1:
        t["limit"] += f"; the empty 3-service chain alone moves 256 nodes in {b1['mean_ms']:.1f} ms ({B1.id})"
    l2 = best.get("cache_counters", {}).get("l2", {})
    if l2.get("errors") or l2.get("skipped") or l2.get("writes_dropped"):
        t["limit"] += (
            f"; L2 under bulk load: {l2.get('errors', 0)} read timeouts, {l2.get('skipped', 0)} "
            f"reads skipped (circuit open), {l2.get('writes_dropped', 0):,} rows of write-back dropped"
        )


def _limit_retrieval(t: dict, res: dict, s: dict[str, dict]) -> None:
    target: Target = t["target"]
    app = s.get(target.app[0].name) or s.get(target.app[1].name)
    st = app.get("stages", {})
    t["limit"] = (
        "per-stage P99 (bucket-interpolated): "
        + ", ".join(
            f"{k} {ms(st.get('feature_' + k), 'p99_s'):.2f} ms"
            for k in ("l1", "l2", "origin")
            if st.get("feature_" + k)
        )
        + "; an L2 read is one MGET round trip to Redis for the L1 misses"
    )
    idle = res.get("baselines", {}).get("redis_mget", {}).get("idle", {})
    if idle.get("calls"):
        t["limit"] += (
            f"; with no service around it, that round trip alone reads P50 {idle['p50_ms']:.2f} "
            f"ms, P99 {idle['p99_ms']:.2f} ms after {idle['idle_ms']:g} ms idle (the gap between "
            "requests at c=1)"
        )


LIMITS: dict[str, Callable[[dict, dict, dict[str, dict]], None]] = {
    T1.id: _limit_colocated_c1,
    T6.id: _limit_single_c1,
    T2.id: _limit_single_c32,
    T7.id: _limit_single_c32,
    T3.id: _limit_bulk,
    T4.id: _limit_retrieval,
}


def best_of(inproc: dict, baseline: Baseline) -> dict | None:
    """An in-process baseline's figure: its fastest variant at 256 nodes."""
    return _best(inproc, tuple(v.key for v in baseline.variants))


def _best(inproc: dict, keys: tuple[str, ...]) -> dict | None:
    """The fastest in-process variant at 256 nodes, with its key as ``variant``."""
    rows = [{**inproc[k]["256"], "variant": k} for k in keys if "256" in inproc.get(k, {})]
    return max(rows, key=lambda r: r["nodes_per_s"]) if rows else None


def _variant(r: dict) -> str:
    """The variant of ``r`` and those it was the best of (its baseline's)."""
    base = next(b for b in BASELINES if any(v.key == r["variant"] for v in b.variants))
    label = next(v.label for v in base.variants if v.key == r["variant"])
    return f"{label}, the best of: {'; '.join(v.label for v in base.variants)}"


def floor_note(what: str, base_p99_ms: float, app_p99_ms: float, bound_ms: float) -> str:
    """When the app misses an absolute bound that a baseline of the same run misses too, say so:
    that part of the miss is the machine's at that moment, not the app's."""
    if app_p99_ms <= bound_ms or not base_p99_ms > bound_ms:  # the app within it, or NaN / within
        return ""
    return f"; {what} read P99 {base_p99_ms:.2f} ms itself, over the {bound_ms:g} ms bound"


def mget_idle_p99(res: dict) -> float:
    idle = res.get("baselines", {}).get("redis_mget", {}).get("idle", {})
    return float(idle["p99_ms"]) if idle.get("calls") else NAN


# -- plots -----------------------------------------------------------------------------------------

TRIVIAL = (sc.TRIVIAL_3, sc.TRIVIAL_1, sc.ONE_PROCESS)  # the baselines' topologies: dashed


def plot_cdf(res: dict, path: str) -> None:
    plt = _pyplot()
    s = by_name(res)
    one_m = list(dict.fromkeys(r["name"] for r in res["scenarios"] if r.get("graph") == sc.G1M))
    panels = [
        (
            f"single node ({sc.G100K})",
            (
                sc.SINGLE_C1,
                sc.SINGLE_C8,
                sc.SINGLE_C32,
                sc.UNIFORM_C1,
                sc.UNIFORM_C32,
                sc.COLD_REDIS,
                sc.NOREDIS_C1,
                sc.B1_C1,
                sc.B1_C32,
                sc.B2_C1,
                sc.B2_C32,
                *sc.COLOCATED_WARM,
                *sc.ONE_PROCESS_WARM,
            ),
        ),
        (f"bulk and open loop ({sc.G100K})", (*sc.BULK, sc.B1_BULK_256, *sc.OPEN)),
    ]
    panels = [(title, [x.name for x in scs]) for title, scs in panels]
    panels.append(
        (f"1M nodes / 10M edges (vs {sc.G100K})", one_m + ([sc.SINGLE_C1.name, sc.SINGLE_C32.name] if one_m else []))
    )
    panels = [(t, [n for n in names if n in s]) for t, names in panels]
    panels = [p for p in panels if p[1]]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 4.6), squeeze=False)
    for ax, (title, names) in zip(axes[0], panels):
        for n in names:
            c = s[n]["cdf"]
            style = "--" if s[n].get("topology") in TRIVIAL else ":" if s[n].get("cache") == "cold" else "-"
            ax.plot(c["ms"], c["q"], style, label=f"{n} (P99 {s[n].get('p99_ms', NAN):.1f})", lw=1.4)
        ax.set_xscale("log")
        ax.set_xlabel("latency, ms (log)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(title)
        ax.axhline(0.99, color="grey", lw=0.6)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_throughput(res: dict, path: str) -> None:
    plt = _pyplot()
    s = by_name(res)
    series = {
        "app (Redis on)": (sc.SINGLE_C1, sc.SINGLE_C8, sc.SINGLE_C32),
        "app co-located": sc.COLOCATED_WARM,
        f"{B5.id} {B5.label}": sc.ONE_PROCESS_WARM,
        f"{B1.id} {B1.label}": (sc.B1_C1, sc.B1_C8, sc.B1_C32),
        f"{B2.id} {B2.label}": (sc.B2_C1, sc.B2_C8, sc.B2_C32),
    }
    ticks = [x.concurrency for x in series["app (Redis on)"]]
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(16, 4.2))
    for label, scs in series.items():
        rows = [(x.concurrency, s[x.name]) for x in scs if x.name in s]
        if not rows:
            continue
        a1.plot([c for c, _ in rows], [r["req_per_s"] for _, r in rows], "o-", label=label)
        a2.plot([c for c, _ in rows], [r["p99_ms"] for _, r in rows], "o-", label=label)
    for ax, yl in ((a1, "req/s (closed loop)"), (a2, "P99 latency, ms")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(c) for c in ticks])
        ax.set_xlabel("concurrency (single-node requests)")
        ax.set_ylabel(yl)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    p99_bound = T2.absolute("p99_ms").bound
    a2.axhline(p99_bound, color="red", lw=0.8, ls="--")
    _plot_bulk(a3, res, s)
    a1.set_title("throughput vs concurrency")
    a2.set_title(f"P99 vs concurrency (red: {T2.id}'s {p99_bound:g} ms)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_bulk(ax, res: dict, s: dict) -> None:
    """T3: bulk-256 nodes/s of the app per concurrency, the monoliths' best as lines."""
    for topology, label in ((sc.APP, "app, bulk 256 (Redis on)"), (sc.COLOCATED, "app co-located, bulk 256")):
        rows = [(x.concurrency, s[x.name]) for x in T3.app if x.name in s and x.topology == topology]
        ax.plot([c for c, _ in rows], [r["nodes_per_s"] for _, r in rows], "o-", label=label)
    inproc = res.get("baselines", {}).get("inproc", {})
    for base, colour in zip(T3.baselines, ("tab:green", "tab:red")):
        best = best_of(inproc, base)
        if best:
            label = next(v.label for v in base.variants if v.key == best["variant"])
            ax.axhline(best["nodes_per_s"], color=colour, lw=0.9, ls="--", label=f"{base.id} best ({label})")
    ticks = sorted({x.concurrency for x in T3.app})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(c) for c in ticks])
    ax.set_xlabel("concurrency (256-node requests)")
    ax.set_ylabel("nodes/s")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{T3.id}: bulk nodes/s vs concurrency")


BREAKDOWN = (
    "feature: sample",
    "feature: L1",
    "feature: L2",
    "feature: origin",
    "feature: assemble",
    "feature: rest + model hop",
    "model: queue",
    "model: compute",
    "model: server rest",
    "gateway: hops + own work",
    "gateway: BentoML in/out",
    "client + transport",
)


def breakdown(row: dict) -> dict[str, float]:
    """Mean ms per component; the feature/model stages are means per batch (= per request at c=1)."""
    st = row.get("stages", {})
    g = lambda k: ms(st.get(k))  # noqa: E731
    # a stage not consulted in some batches: its mean per batch is sum / (number of batches)
    batches = st.get("feature_l1", {}).get("count") or 1
    per_batch = lambda k: (st[k]["sum_s"] * 1e3 / batches) if k in st else 0.0  # noqa: E731
    f_stages = {
        "feature: sample": per_batch("feature_sample"),
        "feature: L1": per_batch("feature_l1"),
        "feature: L2": per_batch("feature_l2"),
        "feature: origin": per_batch("feature_origin"),
        "feature: assemble": per_batch("feature_assemble"),
    }
    fs, msrv, gc, gs = g("feature_server"), g("model_server"), g("gateway_core"), g("gateway_server")
    out = dict(f_stages)
    # The FeatureRunner's /predict time holds its call to the model runner (the chain topology).
    out["feature: rest + model hop"] = fs - sum(f_stages.values()) - msrv
    out["model: queue"] = g("model_queue")
    out["model: compute"] = g("model_compute")
    out["model: server rest"] = msrv - out["model: queue"] - out["model: compute"]
    out["gateway: hops + own work"] = gc - fs
    out["gateway: BentoML in/out"] = gs - gc
    out["client + transport"] = row.get("mean_ms", NAN) - gs
    return {k: (v if v == v else 0.0) for k, v in out.items()}


BREAKDOWN_ROWS = (
    sc.SINGLE_C1,
    sc.SINGLE_C8,
    sc.SINGLE_C32,
    sc.UNIFORM_C1,
    sc.NOREDIS_C1,
    sc.COLD_REDIS,
    sc.BULK_64,
    sc.BULK_256,
    sc.BULK_1024,
    sc.ONE_M_C1,
    sc.ONE_M_C32,
    sc.ONE_M_BULK_256,
)


def plot_breakdown(res: dict, path: str) -> list[tuple[str, dict[str, float], float]]:
    plt = _pyplot()
    s = by_name(res)
    names = [x.name for x in BREAKDOWN_ROWS if x.name in s and s[x.name].get("stages")]
    rows = [(n, breakdown(s[n]), s[n].get("mean_ms", NAN)) for n in names]
    if not rows:
        return rows
    fig, ax = plt.subplots(figsize=(11, 0.45 * len(rows) + 2))
    cmap = plt.get_cmap("tab20")
    for i, (_, parts, total) in enumerate(rows):
        left = 0.0
        for j, comp in enumerate(BREAKDOWN):
            v = max(parts.get(comp, 0.0), 0.0) / total * 100 if total else 0
            ax.barh(i, v, left=left, color=cmap(j), label=comp if i == 0 else None)
            left += v
        ax.text(min(left, 100) + 0.5, i, f"{total:.1f} ms", va="center", fontsize=7)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("share of the client's mean latency, % (label: mean ms)")
    ax.set_xlim(0, 115)
    ax.set_title("where the time goes (services' own /metrics, mean per stage; stages per batch)")
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return rows


# -- markdown --------------------------------------------------------------------------------------


def scenario_table(res: dict) -> list[str]:
    lines = [
        "| scenario | graph | Redis | cache | mode | ok | req/s | nodes/s | P50 | P90 | P99 | P99.9 | errors | "
        "L1+L2 hit |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in res["scenarios"]:
        mode = f"c={r['concurrency']}" if r["mode"] == "closed" else f"{r['rate']:.0f}/s open"
        hr = r.get("hit_ratio")
        lines.append(
            f"| {r['name']} | {r.get('graph', '')} | {r.get('redis', '-')} | {r.get('cache', '-')} | {mode} | "
            f"{r['ok']:,} | {r['req_per_s']:.0f} | {r['nodes_per_s']:,.0f} | {f(r.get('p50_ms'))} | "
            f"{f(r.get('p90_ms'))} | {f(r.get('p99_ms'))} | {f(r.get('p999_ms'))} | "
            f"{r['errors'] if r['error_count'] else 0} | {f(hr and hr['combined'] * 100, '{:.1f}%')} |"
        )
    return lines


def cpu_per_request(row: dict) -> dict[str, float]:
    """CPU milliseconds per successful request, per process (from psutil CPU-time diffs)."""
    ok = max(row.get("ok", 0), 1)
    return {k: v * row["elapsed_s"] / ok * 1e3 for k, v in row.get("cpu_util", {}).items()}


# (scenario, True: its batching-window what-ifs instead of itself)
CPU_ROWS = (
    (sc.SINGLE_C1, False),
    (sc.COLOCATED_C1, False),
    (sc.B5_C1, False),
    (sc.SINGLE_C32, False),
    (sc.COLOCATED_C32, False),
    (sc.B5_C32, False),
    (sc.SINGLE_C32, True),
    (sc.NOREDIS_C32, False),
    (sc.B1_C1, False),
    (sc.B1_C32, False),
    (sc.B2_C1, False),
    (sc.B2_C32, False),
    (sc.BULK_256, False),
    (sc.COLOCATED_BULK_256_C4, False),
    (sc.B5_BULK_256_C4, False),
    (sc.NOREDIS_BULK_256, False),
    (sc.B1_BULK_256, False),
    (sc.ONE_M_C32, False),
)


def cpu_table(res: dict) -> list[str]:
    s = by_name(res)
    rows = [n for x, what_ifs in CPU_ROWS for n in s if (n.startswith(x.what_if_prefix) if what_ifs else n == x.name)]
    if not rows:
        return []
    lines = [
        "| scenario | req/s | gateway | feature | model | services total | loadgen | "
        "2 cores / services total = req/s ceiling |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in rows:
        c = cpu_per_request(s[n])
        svc = {k: v for k, v in c.items() if k != "loadgen"}
        total = sum(svc.values())
        gw = c.get("gateway", c.get("single", c.get("one", NAN)))  # the one process of B2, B5
        lines.append(
            f"| {n} | {s[n]['req_per_s']:.0f} | {gw:.2f} | {f(c.get('feature'))} | {f(c.get('model'))} | "
            f"{total:.2f} | {c.get('loadgen', NAN):.2f} | {2000 / total if total else NAN:,.0f} |"
        )
    return lines


def scale_table(res: dict) -> list[str]:
    s = by_name(res)
    mem = res.get("memory", {})
    pairs = [
        (sc.G100K, sc.SINGLE_C1.name, sc.SINGLE_C32.name, sc.BULK_256.name),
        (sc.G1M, sc.ONE_M_C1.name, sc.ONE_M_C32.name, sc.ONE_M_BULK_256.name),
    ]
    lines = [
        "| graph | sample, 1 node (mean / P99 ms) | sample, 256 nodes (mean ms) | e2e P99 c=1 | e2e P99 c=32 | "
        "e2e P50 bulk 256 | RSS gateway | RSS feature | RSS model | Redis used | L1+L2 hit c=1 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for graph, c1, c32, bulk in pairs:
        if c1 not in s:
            continue
        st1 = s[c1].get("stages", {}).get("feature_sample")
        stb = s.get(bulk, {}).get("stages", {}).get("feature_sample")
        m = mem.get(graph, {})
        rss = lambda k, m=m: f(m.get(k, {}).get("rss_mib"), "{:.0f} MiB")  # noqa: E731
        hr = s[c1].get("hit_ratio") or {}
        lines.append(
            f"| {graph} | {f(ms(st1))} / {f(ms(st1, 'p99_s'))} | {f(ms(stb))} | {f(s[c1].get('p99_ms'))} | "
            f"{f(s.get(c32, {}).get('p99_ms'))} | {f(s.get(bulk, {}).get('p50_ms'))} | {rss('gateway')} | "
            f"{rss('feature')} | {rss('model')} | {f(m.get('redis', {}).get('used_mib'), '{:.0f} MiB')} | "
            f"{f(hr.get('combined', NAN) * 100, '{:.1f}%')} |"
        )
    return lines


def profile_lines(res: dict) -> list[str]:
    lines = []
    for key, p in res.get("profiles", {}).items():
        comps = ", ".join(f"{k} {v:.0%}" for k, v in list(p["by_component"].items())[:8])
        leaf = ", ".join(f"`{short(k)}` {v:.0%}" for k, v in p["top_leaf"][:6])
        generic = (
            "Middleware",
            "wrapped_app",
            "Router",
            "Route.handle",
            "request_response",
            "HttpGuard",
            "send",
            "Handle._run",
            "BaseEventLoop",
            "Runner.run",
            "asyncio_run",
            "Server.run",
            "Command.",
            "Context.",
            "_run_module_as_main",
            "_run_code",
            "<module>",
            "process ",
        )
        incl = ", ".join(
            f"`{k}` {v:.0%}" for k, v in p["top_inclusive"] if k != "main" and not any(g in k for g in generic)
        )
        cpu = ", ".join(f"{k} {v:.0%}" for k, v in sorted(p["cpu_util"].items(), key=lambda kv: -kv[1]))
        lines += [
            f"- **{key}** ({p['scenario']}: {p['req_per_s']:.0f} req/s, P99 {f(p.get('p99_ms'))} ms while "
            f"profiled): the profiled process was on-CPU in {p['busy_fraction']:.0%} of the samples "
            f"(100% = one core saturated). CPU per process (1.0 = one core): {cpu}.",
            f"  - self time by component: {comps}",
            f"  - hottest leaf functions (self): {leaf}",
            f"  - inclusive (function and its callees): {incl}",
        ]
    return lines


def short(frame: str) -> str:
    """``func (/long/path/site-packages/pkg/mod.py`` -> ``func (pkg/mod.py)``."""
    name, _, path = frame.partition(" (")
    for marker in ("site-packages/", "/work/main/", "lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{name} ({path.rstrip(')')})" if path else name


def breakdown_table(rows: list[tuple[str, dict[str, float], float]]) -> list[str]:
    if not rows:
        return []
    head = "| scenario | mean e2e | " + " | ".join(BREAKDOWN) + " |"
    lines = [head, "|---|" + "---:|" * (len(BREAKDOWN) + 1)]
    for n, parts, total in rows:
        lines.append(f"| {n} | {total:.2f} | " + " | ".join(f"{parts[c]:.2f}" for c in BREAKDOWN) + " |")
    return lines


def write(res: dict, out_dir: str) -> str:
    """Plots and ``report.md`` into ``out_dir``; returns the report's path."""
    os.makedirs(out_dir, exist_ok=True)
    plot_cdf(res, os.path.join(out_dir, "latency_cdf.png"))
    plot_throughput(res, os.path.join(out_dir, "throughput_vs_concurrency.png"))
    rows = plot_breakdown(res, os.path.join(out_dir, "stage_breakdown.png"))
    tg = targets(res)
    limited_by(res, tg)
    cfg = res["config"]
    inproc = res.get("baselines", {}).get("inproc", {})
    quick = cfg.get("quick")
    docs = docs_link(out_dir)
    L: list[str] = []
    L += [
        f"# Performance{' (quick run)' if quick else ''}",
        "",
        f"Generated by `{run_command(cfg)}` on "
        f"{cfg.get('started_at') or datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}, {cfg['machine']['cpus']} CPUs, Python "
        f"{cfg['machine']['python']}; wall time {res.get('elapsed_s', 0):.0f} s. Load average (1/5/15 min) "
        f"at start {'/'.join(f'{x:.2f}' for x in cfg['loadavg_start'])}, at end "
        f"{'/'.join(f'{x:.2f}' for x in cfg.get('loadavg_end', [NAN] * 3))}: other work shared the machine. "
        + machine_line(cfg)
        + "Everything ran on loopback; the load generator (asyncio + aiohttp) shares the same 2 cores with the "
        "services, and its CPU is reported with theirs.",
        "",
        code_line(cfg),
        "",
        "Set-up: the composed app as separate processes (Gateway -> FeatureRunner -> GraphSAGERunner; one worker "
        "each, BentoML `start-http-server --depends`, as the container runs them), auth off, no rate limit, "
        f"L1 = 10% of the feature bytes (`GSAGE_L1_BYTES={cfg.get('app_env', {}).get('GSAGE_L1_BYTES', '?')}`), "
        "L2 = a redis-server started by the suite on a free port (or none), fanout [25, 10], ONNX Runtime with 1 "
        "intra-op thread, adaptive batching defaults; the app's hot APIs answered past BentoML's per-request "
        "dispatch (`common/endpoints.py`'s router), the baselines' through `@bentoml.api`. Target ids: Zipf(1.0) over a random permutation of the "
        "node ids, or uniform. Closed loop = N workers back to back; open loop = Poisson arrivals, latency "
        "from the scheduled start. Every load loop is bounded in time and count.",
        "",
        "## Targets",
        "",
        f"The bounds are data (`bench/suite/targets.py`); what each target is for and how it is judged: "
        f"[docs/performance.md]({docs}).",
        "",
        "| target | result | measured | baseline (same run) | ratio | missed by |",
        "|---|---|---|---|---|---|",
    ]
    for t in tg:
        verdict = "n/a" if t["pass"] is None else ("PASS" if t["pass"] else "MISS")
        L.append(
            f"| **{t['id']}** {t['what']} | **{verdict}** | {t['figure']} | {t['baseline']} | {t['ratio']} | "
            f"{t['miss_by'] or ''} |"
        )
    L += ["", "What limits each missed target (measured in this run):", ""]
    for t in tg:
        if t.get("limit"):
            L.append(f"- **{t['id']}**: {t['limit']}.")
    L += ["", "## What limits it (measured)", ""]
    L += analysis(res, tg, rows)
    L += [
        "",
        "## CPU cost per request (ms of CPU per request, per process)",
        "",
        "From psutil CPU-time diffs of each service's processes (arbiter + worker) over the scenario, divided by "
        "the requests answered. Less sensitive to other tenants than latency; the last column is the throughput "
        "2 dedicated cores could sustain at that cost (load generator excluded).",
        "",
    ]
    L += cpu_table(res)
    L += [
        "",
        "## Plots",
        "",
        "![latency CDF](latency_cdf.png)",
        "",
        "![throughput vs concurrency](throughput_vs_concurrency.png)",
        "",
        "![per-stage breakdown](stage_breakdown.png)",
        "",
        "## Per-stage breakdown (mean ms, from the services' /metrics diffed around each scenario)",
        "",
        "Feature stages are means per merged batch (equal to per request at c=1); `feature: rest + model hop` = "
        "the FeatureRunner's BentoML request time minus its stages and the model runner's request time "
        "(validation, encoding, batcher queue, framework, its HTTP call to the model runner); `model: server "
        "rest` = the model runner's request time minus queue and compute (decode, encode, framework); "
        "`gateway: hops + own work` = `gateway_request_seconds` minus the FeatureRunner's request time (its HTTP "
        "client hop, JSON building); "
        "`gateway: BentoML in/out` = the gateway's BentoML request time minus `gateway_request_seconds` "
        "(request parsing, response serialisation); `client + transport` = the client's mean minus the "
        "gateway's server time. Under concurrency the batch means and request means differ, so rows need not "
        "add up exactly.",
        "",
    ]
    L += breakdown_table(rows)
    L += ["", "## All scenarios", ""]
    L += scenario_table(res)
    if inproc:
        L += [
            "",
            f"## In-process baselines ({B3.id}, {B4.id})",
            "",
            f"Graph {inproc.get('num_nodes', 0):,} nodes / {inproc.get('num_edges', 0):,} edges, "
            f"model `{inproc.get('model')}`. B3: project sampler + tiered store (L1 holding every row) + "
            "`run_batch` on ONNX Runtime (1 thread). B4: `sample_tree` -> `mfg_tensors` -> `PygGraphSAGE` "
            "(state_dict from the store) -> softmax, torch with 1 thread and with all cores. `callers`: one "
            "caller thread per core, each with 1 compute thread (B3 without L1), over the same wall time. "
            "`after N ms idle`: B3 with a sleep before each call, as a service at c=1 waits between "
            "requests.",
            "",
            "| baseline | nodes/request | P50 ms | P99 ms | nodes/s |",
            "|---|---:|---:|---:|---:|",
        ]
        for v in INPROC_TABLE:
            label = v.table.format(idle_ms=inproc.get("idle_ms", 0))
            for n, r in inproc.get(v.key, {}).items():
                L.append(f"| {label} | {n} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['nodes_per_s']:,.0f} |")
    L += ["", f"## Scale ({T5.id})", ""]
    L += scale_table(res)
    L += ["", scale_paragraph(res)]
    if res.get("profiles"):
        L += ["", "## Profiles (py-spy, sampling, non-blocking)", ""]
        L += profile_lines(res)
    if res.get("skipped"):
        L += ["", "Skipped: " + "; ".join(res["skipped"])]
    if res.get("worker_restarts"):
        L += [
            "",
            "Service workers restarted during the run (from their logs; requests in flight then fail and "
            "caches restart cold): " + "; ".join(f"{k} at {', '.join(v)}" for k, v in res["worker_restarts"].items()),
        ]
    L += ["", "## Reproduce", ""] + reproduce_lines(res, out_dir)
    md = os.path.join(out_dir, "report.md")
    with open(md, "w") as fh:
        fh.write("\n".join(L) + "\n")
    return md


INPROC_TABLE = (B3_WITH_L1, B3_NO_L1, B3_IDLE, B4_ONE_THREAD, B3_CALLERS, B4_ALL_THREADS, B4_CALLERS)  # row order


def run_command(cfg: dict) -> str:
    """The command line of the run (recorded since the suite records ``argv``; else from ``quick``)."""
    if "argv" in cfg:
        return " ".join(["python -m bench.suite", *(shlex.quote(a) for a in cfg["argv"])])
    return f"python -m bench.suite{' --quick' if cfg.get('quick') else ''}"


def reproduce_lines(res: dict, out_dir: str) -> list[str]:
    """The command that produced this run and the one that re-renders it; the rest is in the docs."""
    rel = os.path.relpath(out_dir, ROOT)
    where = out_dir if rel.startswith("..") else rel
    json_name = "suite_quick.json" if res["config"].get("quick") else "suite.json"
    return [
        "```bash",
        f"{run_command(res['config'])}   # this run",
        f"python -m bench.suite --report-from {os.path.join(where, json_name)}   # re-render this report and its "
        "plots beside it (nothing is run)",
        "```",
        "",
        f"Outputs in `{where}/`: `{json_name}` (every figure above), the PNGs, this report, service logs in "
        "`logs/`, py-spy stacks `profile-*.txt` (raw, collapsed). The suite's options, durations and demo "
        f"stores: [docs/performance.md]({docs_link(out_dir)}#running-the-suite).",
    ]


def docs_link(out_dir: str) -> str:
    """docs/performance.md from a report in ``out_dir``: relative inside the checkout, else absolute."""
    rel = os.path.relpath(DOCS, out_dir)
    return DOCS if os.path.relpath(out_dir, ROOT).startswith("..") else rel


def code_line(cfg: dict) -> str:
    c = cfg.get("code")
    if not c:
        return "Code under test: the working tree (not recorded)."
    line = (
        f"Code under test: a {'snapshot of the working tree' if c['mode'] == 'worktree' else 'snapshot of HEAD'} "
        f"taken at the start, commit `{c['git_head'][:10]}` ({c['git_head_subject']})"
    )
    if c.get("uncommitted_in_code"):
        line += "; with uncommitted changes in " + ", ".join(f"`{x}`" for x in c["uncommitted_in_code"])
    if c.get("uncommitted_ignored"):
        line += "; uncommitted changes in " + ", ".join(f"`{x}`" for x in c["uncommitted_ignored"]) + " not included"
    return line + "."


def analysis(res: dict, tg: list[dict], rows: list) -> list[str]:
    """Data-driven sentences: which process was busy, which stage dominated, what the profile says."""
    s = by_name(res)
    out = []
    c32 = s.get(sc.SINGLE_C32.name)
    if c32:
        u = c32["cpu_util"]
        total = sum(u.values())
        top = max(u.items(), key=lambda kv: kv[1])
        out.append(
            f"- **c=32 single node**: {c32['req_per_s']:.0f} req/s; the processes used {total:.2f} of 2 cores "
            f"({', '.join(f'{k} {v:.2f}' for k, v in sorted(u.items(), key=lambda kv: -kv[1]))}). "
            f"Busiest: {top[0]} at {top[1]:.0%} of one core"
            + (" — a single-worker process at ~100% of a core is the ceiling." if top[1] > 0.85 else ".")
        )
        st = c32.get("stages", {})
        fb, mb = st.get("feature_batch_targets"), st.get("model_batch_targets")
        if fb and mb:
            out.append(
                f"  Batching under load: {fb['sum_s'] / fb['count']:.1f} targets per feature batch, "
                f"{mb['sum_s'] / mb['count']:.1f} per forward pass; model compute mean "
                f"{f(ms(st.get('model_compute')))} ms, queue {f(ms(st.get('model_queue')))} ms; gateway core "
                f"mean {f(ms(st.get('gateway_core')))} ms vs its BentoML request time "
                f"{f(ms(st.get('gateway_server')))} ms."
            )
    for key in (sc.B1_C32.name, sc.B2_C32.name):
        r = s.get(key)
        if r:
            u = r["cpu_util"]
            out.append(
                f"- **{key}** (no work at all): {r['req_per_s']:.0f} req/s, P99 {r['p99_ms']:.1f} ms; CPU "
                + ", ".join(f"{k} {v:.2f}" for k, v in sorted(u.items(), key=lambda kv: -kv[1]))
                + "."
            )
    c1 = s.get(sc.SINGLE_C1.name)
    if c1 and rows:
        parts = dict((n, p) for n, p, _ in rows).get(sc.SINGLE_C1.name)
        if parts:
            work = sum(
                v
                for k, v in parts.items()
                if k.startswith(
                    ("feature: sample", "feature: L", "feature: origin", "feature: assemble", "model: compute")
                )
            )
            out.append(
                f"- **c=1 single node**: mean {c1['mean_ms']:.2f} ms of which the actual work (sampling, "
                f"feature fetch, assemble, forward pass) is {work:.2f} ms ({work / c1['mean_ms']:.0%}); the "
                "rest is HTTP hops, (de)serialisation and framework time (see the breakdown table)."
            )
    b = s.get(sc.BULK_256.name)
    if b and rows:
        parts = dict((n, p) for n, p, _ in rows).get(sc.BULK_256.name)
        if parts:
            top3 = sorted(parts.items(), key=lambda kv: -kv[1])[:3]
            out.append(
                f"- **bulk 256**: mean {b['mean_ms']:.1f} ms; largest components: "
                + ", ".join(f"{k} {v:.1f} ms" for k, v in top3)
                + "."
            )
    for key, p in res.get("profiles", {}).items():
        comps = ", ".join(f"{k} {v:.0%}" for k, v in list(p["by_component"].items())[:5])
        out.append(f"- **profile {key}**: on-CPU {p['busy_fraction']:.0%} of wall time; self time: {comps}.")
    return out


def scale_paragraph(res: dict) -> str:
    s = by_name(res)
    mem = res.get("memory", {})
    a, b = s.get(sc.SINGLE_C1.name), s.get(sc.ONE_M_C1.name)
    if not (a and b and sc.G1M in mem and sc.G100K in mem):
        return f"The {sc.G1M} graph was not run in this invocation (the full run covers it)."
    sa, sb = a["stages"].get("feature_sample"), b["stages"].get("feature_sample")
    ma, mb = mem[sc.G100K], mem[sc.G1M]

    def snap_mib(key: str) -> float:
        c = res["config"].get(key, {})
        n, e = c.get("nodes", 0), c.get("edges", 0)
        return (n * 128 * 4 + (n + 1) * 8 + e * 4) / 2**20

    return (
        f"What grows with the graph: the snapshot (CSR + 128-dim float32 features: {snap_mib('store_100k'):.0f} -> "
        f"{snap_mib('store_1m'):.0f} MiB), which the FeatureRunner memory-maps — its RSS went {ma['feature']['rss_mib']:.0f} -> "
        f"{mb['feature']['rss_mib']:.0f} MiB (pages touched so far, shared page cache), the L1 budget (10% of "
        f"features: {int(res['config'].get('app_env', {}).get('GSAGE_L1_BYTES', 0)) / 2**20:.1f} MiB -> 10x that) "
        f"and the Redis working set ({ma.get('redis', {}).get('used_mib', NAN):.0f} -> "
        f"{mb.get('redis', {}).get('used_mib', NAN):.0f} MiB); with Zipf over 10x more ids the hit ratio at c=1 is "
        f"{(a.get('hit_ratio') or {}).get('combined', NAN):.1%} -> {(b.get('hit_ratio') or {}).get('combined', NAN):.1%}. "
        f"What does not grow: sampling is O(fanout) per target over the CSR, never a scan "
        f"({ms(sa):.3f} -> {ms(sb):.3f} ms mean per batch at c=1), the FeatureTensor size per request, the model "
        f"runner (RSS {ma['model']['rss_mib']:.0f} -> {mb['model']['rss_mib']:.0f} MiB; it never sees the graph) "
        f"and the gateway ({ma['gateway']['rss_mib']:.0f} -> {mb['gateway']['rss_mib']:.0f} MiB). End-to-end P99 at "
        f"c=1 went {a['p99_ms']:.2f} -> {b['p99_ms']:.2f} ms: the per-request cost is the hops, not the graph, and "
        "the difference between the two is within the run-to-run noise of this shared machine."
    )


def main() -> None:
    """``python -m bench.suite.report SUITE_JSON``: as ``python -m bench.suite --report-from SUITE_JSON``,
    the report and plots beside the JSON."""
    path = sys.argv[1] if len(sys.argv) > 1 else "bench/results/suite.json"
    with open(path) as fh:
        res = json.load(fh)
    print(write(res, os.path.dirname(os.path.abspath(path))))


if __name__ == "__main__":
    main()
