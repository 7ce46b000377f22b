"""Plots (PNG) and the Markdown report from the suite's JSON.

    python -m bench.suite.report bench/results/suite.json   # re-render without re-running
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import sys
from collections.abc import Callable
from typing import Any

NAN = float("nan")


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


def paired_or_own(s: dict[str, dict], app: str, base: str) -> tuple[dict | None, dict | None, dict | None]:
    """The app's and the baseline's rows a target is judged on: the interleaved "(paired)" windows
    when the run has both, else the scenarios' own windows; and the app's own window (its CPU)."""
    pa, pb = s.get(f"{app} (paired)"), s.get(f"{base} (paired)")
    if pa and pb and pa.get("ok") and pb.get("ok"):
        return pa, pb, s.get(app)
    return s.get(app), s.get(base), s.get(app)


def pairing_note(s: dict[str, dict], a: dict, b: dict, app: str, base: str,
                 figure: Callable[[dict], float]) -> str:
    """How the judged ratio was measured, the interleaved windows' own spread, and the ratio of
    the separate windows for comparison."""
    if a.get("group") != "paired":
        return " (separate windows)"
    per = [wa_v / wb_v for wa, wb in zip(a["windows"], b["windows"])
           if (wa_v := figure(wa)) and (wb_v := figure(wb))]
    note = f" (interleaved, {len(a['windows'])} windows each"
    if per:
        note += f"; per window pair {min(per):.2f}-{max(per):.2f}x"
    own_a, own_b = s.get(app), s.get(base)
    if own_a and own_b and figure(own_b):
        note += f"; separate windows {figure(own_a) / figure(own_b):.2f}x"
    return note + ")"


# -- targets ---------------------------------------------------------------------------------------


def targets(res: dict) -> list[dict]:
    s = by_name(res)
    out = []
    inproc = res.get("baselines", {}).get("inproc", {})

    def cpu(row: dict | None) -> str:
        if not row:
            return ""
        u = row.get("cpu_util", {})
        return ", ".join(f"{k} {v:.0%}" for k, v in sorted(u.items(), key=lambda kv: -kv[1]))

    # T1
    app, b1, own = paired_or_own(s, "single zipf c=1", "B1 single c=1")
    if app and b1:
        ratio = app["p99_ms"] / b1["p99_ms"]
        ok = ratio <= 1.3 and app["p99_ms"] <= 10.0
        out.append({"id": "T1", "what": "single node, c=1: e2e P99 <= 1.3x B1 P99 and <= 10 ms", "pass": ok,
                    "figure": f"P99 {app['p99_ms']:.2f} ms (P50 {app['p50_ms']:.2f})",
                    "baseline": f"B1 P99 {b1['p99_ms']:.2f} ms (P50 {b1['p50_ms']:.2f})",
                    "ratio": f"{ratio:.2f}x B1" + pairing_note(s, app, b1, "single zipf c=1", "B1 single c=1",
                                                            lambda r: r["p99_ms"]),
                    "miss_by": None if ok else _miss([("ratio", ratio, 1.3, "x"), ("P99", app["p99_ms"], 10.0, " ms")])
                    + floor_note("B1, doing no work,", b1["p99_ms"], app["p99_ms"], 10.0),
                    "cpu": cpu(own)})
    # T2
    app, b2, own = paired_or_own(s, "single zipf c=32", "B2 single c=32")
    if app and b2:
        ratio = app["req_per_s"] / b2["req_per_s"]
        errs = app["error_count"]
        ok = ratio >= 0.6 and app["p99_ms"] <= 45.0 and errs == 0
        b1 = s.get("B1 single c=32")
        out.append({"id": "T2", "what": "single node, c=32: req/s >= 0.6x B2, P99 <= 45 ms, zero errors", "pass": ok,
                    "figure": f"{app['req_per_s']:.0f} req/s, P99 {app['p99_ms']:.1f} ms, {errs} errors"
                              f"{', ' + str(app['degraded']) + ' degraded' if app['degraded'] else ''}",
                    "baseline": f"B2 {b2['req_per_s']:.0f} req/s (P99 {b2['p99_ms']:.1f} ms)"
                                + (f"; B1 {b1['req_per_s']:.0f} req/s (P99 {b1['p99_ms']:.1f} ms)" if b1 else ""),
                    "ratio": f"{ratio:.2f}x B2" + pairing_note(s, app, b2, "single zipf c=32", "B2 single c=32",
                                                            lambda r: r["req_per_s"]),
                    "miss_by": None if ok else _miss([("req/s ratio", ratio, 0.6, "x", True),
                                                      ("P99", app["p99_ms"], 45.0, " ms"),
                                                      ("errors", errs, 0, "")])
                    + floor_note("B2, doing no work,", b2["p99_ms"], app["p99_ms"], 45.0),
                    "cpu": cpu(own)})
    # T3
    bulk = [s[k] for k in BULK_256 if k in s]
    # The app's best concurrency against each monolith's best way to use the cores: with and
    # without L1, compute threads, concurrent caller threads.
    b3 = _best(inproc, ("b3", "b3_no_l1", "b3_callers"))
    b4 = _best(inproc, ("b4", "b4_threads_all", "b4_callers"))
    if bulk and b3 and b4:
        best = max(bulk, key=lambda r: r["nodes_per_s"])
        r3, r4 = best["nodes_per_s"] / b3["nodes_per_s"], best["nodes_per_s"] / b4["nodes_per_s"]
        ok = r3 >= 0.5 and r4 >= 1.0
        out.append({"id": "T3", "what": "bulk 256 nodes: nodes/s >= 0.5x B3 and >= 1.0x B4", "pass": ok,
                    "figure": f"{best['nodes_per_s']:,.0f} nodes/s ({best['name']}, P50 {best['p50_ms']:.1f} ms)",
                    "baseline": f"B3 {b3['nodes_per_s']:,.0f} nodes/s (P50 {b3['p50_ms']:.1f} ms; {_variant(b3)}); "
                                f"B4 {b4['nodes_per_s']:,.0f} nodes/s ({_variant(b4)})",
                    "ratio": f"{r3:.2f}x B3, {r4:.2f}x B4",
                    "miss_by": None if ok else _miss([("vs B3", r3, 0.5, "x", True), ("vs B4", r4, 1.0, "x", True)]),
                    "cpu": cpu(best)})
    # T4: the warmest Zipf c=1 window (the end of the 100k phase), the first warm window beside it
    app = s.get("single zipf c=1 (end of phase)") or s.get("single zipf c=1")
    first = s.get("single zipf c=1")
    if app:
        st = app.get("stages", {})
        p99 = {k: ms(st.get(f"feature_{k}"), "p99_s") for k in ("l1", "l2", "origin")}
        share = {k: (st.get(f"feature_{k}", {}).get("count", 0) / max(st.get("feature_l1", {}).get("count", 1), 1))
                 for k in ("l1", "l2", "origin")}
        fetch_p99, measured = retrieval_p99(app)
        first_p99 = retrieval_p99(first)[0] if first is not None and first is not app else NAN
        rel = "=" if measured else "<="  # the whole fetch's histogram, or the sum of the levels' P99s
        hr = app.get("hit_ratio") or {}
        combined = hr.get("combined", NAN)
        judged = max(fetch_p99, first_p99) if first_p99 == first_p99 else fetch_p99
        ok = judged <= 1.0 and combined >= 0.95
        nr = s.get("single zipf c=1 (no redis)")
        nr_p99, nr_measured = retrieval_p99(nr) if nr else (NAN, False)
        out.append({"id": "T4", "what": "feature retrieval in the FeatureRunner: P99 <= 1 ms warm; "
                                        "L1+L2 hit ratio >= 95% on Zipf(1.0), L1 = 10% of features", "pass": ok,
                    "figure": f"retrieval P99 {rel} {fetch_p99:.3f} ms (per level: L1 {f(p99['l1'], '{:.3f}')}, "
                              f"L2 {f(p99['l2'], '{:.3f}')} in {share['l2']:.0%} of batches, origin "
                              f"{f(p99['origin'], '{:.3f}')} in {share['origin']:.0%}); hit L1+L2 {combined:.1%} "
                              f"(L1 {hr.get('l1', NAN):.1%}, L2 {hr.get('l2', NAN):.1%}; {app['name']}, "
                              f"{app.get('redis_keys_after', 0):,} rows in Redis)"
                              + (f"; first warm window: retrieval P99 {rel} {first_p99:.3f} ms, hit "
                                 f"{first['hit_ratio']['combined']:.1%}" if first is not app and first.get("hit_ratio")
                                 else ""),
                    "baseline": "SLO of the design: P99 < 10 ms, hit rate > 90%"
                                + (f"; without Redis (L1 + memory-mapped origin) retrieval P99 "
                                   f"{'=' if nr_measured else '<='} {nr_p99:.3f} ms" if nr else "")
                                + mget_line(res.get("baselines", {}).get("redis_mget", {})),
                    "ratio": "",
                    "miss_by": None if ok else _miss([("retrieval P99 (worse window)", judged, 1.0, " ms"),
                                                      ("hit ratio", combined * 100, 95.0, "%", True)])
                    + floor_note("a bare MGET after idle", mget_idle_p99(res), judged, 1.0),
                    "cpu": ""})
    # T5
    one_m = [r for r in res["scenarios"] if r.get("graph") == "1M/10M"]
    if one_m:
        errs = sum(r["error_count"] for r in one_m)
        w = s.get("1M single zipf c=1")
        out.append({"id": "T5", "what": "scale: the 1M/10M graph served", "pass": errs == 0 and w is not None,
                    "figure": f"{sum(r['ok'] for r in one_m):,} requests, {errs} errors; c=1 P99 "
                              f"{f(w and w.get('p99_ms'))} ms",
                    "baseline": "100k/1M: c=1 P99 " + f(s.get("single zipf c=1", {}).get("p99_ms")) + " ms",
                    "ratio": "", "miss_by": None, "cpu": ""})
    else:
        out.append({"id": "T5", "what": "scale: the 1M/10M graph served", "pass": None,
                    "figure": "not run (" + "; ".join(x for x in res.get("skipped", []) if "1M" in x) + ")",
                    "baseline": "", "ratio": "", "miss_by": None, "cpu": ""})
    return out


def what_if(s: dict[str, dict], c: int) -> dict | None:
    """The batching-window what-if at concurrency ``c`` (named after the delay it ran with)."""
    return next((r for n, r in s.items() if n.startswith(f"single zipf c={c} (batch delay")), None)


def top_parts(row: dict | None, k: int = 3) -> str:
    if not row or not row.get("stages"):
        return ""
    parts = sorted(breakdown(row).items(), key=lambda kv: -kv[1])[:k]
    return ", ".join(f"{name} {v:.1f} ms" for name, v in parts)


def cpu_extra(app: dict | None, base: dict | None) -> str:
    """ms of CPU per request each service spends beyond the baseline's (psutil, same run)."""
    if not app or not base or not app.get("req_per_s") or not base.get("req_per_s"):
        return ""
    per = {k: 1e3 * (app["cpu_util"].get(k, 0.0) / app["req_per_s"] - base["cpu_util"].get(k, 0.0) / base["req_per_s"])
           for k in ("gateway", "feature", "model") if k in app.get("cpu_util", {})}
    return ", ".join(f"{k} {v:+.2f} ms" for k, v in per.items())


def machine_line(cfg: dict) -> str:
    speeds = cfg.get("machine_speed") or []
    if not speeds:
        return ""
    when = ["at start", "at end"][:len(speeds)]
    return ("Machine speed (" + ", ".join(when) + "): a pure-Python loop of 10M additions "
            + " / ".join(f"{x['python_loop_s']:.2f}" for x in speeds) + " s, a wake-up round trip between two processes (pipe ping-pong) "
            + " / ".join(f"{x['ping_pong_us']:.1f}" for x in speeds) + " us. ")


def mget_line(mget: dict) -> str:
    """T4's floor: the bare MGET from the suite process, back to back and after idle gaps."""
    if not mget.get("calls"):
        return ""
    line = (f"; a bare MGET of {mget['keys_per_call']} cached rows from the suite process: P50 "
            f"{mget['p50_ms']:.2f} ms, P99 {mget['p99_ms']:.2f} ms back to back")
    idle = mget.get("idle", {})
    if idle.get("calls"):
        line += f", P50 {idle['p50_ms']:.2f} ms, P99 {idle['p99_ms']:.2f} ms after {idle['idle_ms']:g} ms idle"
    return line


def limited_by(res: dict, tg: list[dict]) -> None:
    """Attach a measured 'what limits it' line to each missed target."""
    s = by_name(res)
    for t in tg:
        if t["pass"] is not False:
            continue
        if t["id"] == "T1":
            app, b1 = s.get("single zipf c=1"), s.get("B1 single c=1")
            parts = breakdown(app)
            work = sum(v for k, v in parts.items() if k in ("feature: sample", "feature: L1", "feature: L2",
                                                            "feature: origin", "feature: assemble", "model: compute"))
            t["limit"] = (f"mean {app['mean_ms']:.2f} ms vs B1 {b1['mean_ms']:.2f} ms: +{app['mean_ms'] - b1['mean_ms']:.2f} ms, "
                          f"of which sampling+fetch+assemble+forward {work:.2f} ms and the model batcher's wait "
                          f"{parts['model: queue']:.2f} ms (GSAGE_MAX_BATCH_DELAY_MS); largest: {top_parts(app)}")
            inproc = res.get("baselines", {}).get("inproc", {})
            b3, idle = inproc.get("b3", {}).get("1"), inproc.get("b3_idle", {}).get("1")
            if b3:
                t["limit"] += (f"; the same work in one process (B3, 1 node, sampler + ONNX Runtime, L1): mean "
                               f"{b3['mean_ms']:.2f} ms back to back, {work / b3['mean_ms']:.1f}x less than its "
                               "stages in the services")
            if b3 and idle:
                t["limit"] += (f", but {idle['mean_ms']:.2f} ms ({idle['mean_ms'] / b3['mean_ms']:.1f}x) with "
                               f"{inproc.get('idle_ms', 0):g} ms of idle before each call, as a service at c=1 "
                               "waits between requests")
            extra = cpu_extra(app, b1)
            if extra:
                t["limit"] += f"; CPU per request beyond B1's: {extra}"
            for svc in ("feature", "model"):
                prof = res.get("profiles", {}).get(f"{svc}_c1")
                if prof:
                    t["limit"] += (f"; {svc} profile at c=1: " + ", ".join(
                        f"{k} {v:.0%}" for k, v in list(prof["by_component"].items())[:5]))
            d0 = what_if(s, 1)
            if d0:
                t["limit"] += (f"; {d0['name']}: P99 {d0['p99_ms']:.2f} ms (P50 {d0['p50_ms']:.2f}), model queue "
                               f"{ms(d0.get('stages', {}).get('model_queue')):.2f} ms")
        elif t["id"] == "T2":
            app = s.get("single zipf c=32")
            u = sorted(app["cpu_util"].items(), key=lambda kv: -kv[1])
            total = sum(v for _, v in u)
            prof = res.get("profiles", {}).get("gateway_c32")
            t["limit"] = (f"CPU: our processes used {total:.2f} of 2 cores (" + ", ".join(f"{k} {v:.2f}" for k, v in u)
                          + f"); largest stages: {top_parts(app)}")
            if prof:
                t["limit"] += ("; gateway profile: " + ", ".join(f"{k} {v:.0%}" for k, v in
                                                                 list(prof["by_component"].items())[:4]))
            d0 = what_if(s, 32)
            if d0:
                t["limit"] += f"; {d0['name']}: {d0['req_per_s']:.0f} req/s, P99 {d0['p99_ms']:.1f} ms"
        elif t["id"] == "T3":
            rows = [s[k] for k in BULK_256 if k in s]
            best = max(rows, key=lambda r: r["nodes_per_s"])
            b1 = s.get("B1 bulk 256 c=1")
            t["limit"] = f"{best['name']}: largest stages {top_parts(s.get('bulk 256 zipf c=1'))}"
            if b1:
                t["limit"] += f"; the empty 3-service chain alone moves 256 nodes in {b1['mean_ms']:.1f} ms (B1)"
            l2 = best.get("cache_counters", {}).get("l2", {})
            if l2.get("errors") or l2.get("skipped") or l2.get("writes_dropped"):
                t["limit"] += (f"; L2 under bulk load: {l2.get('errors', 0)} read timeouts, {l2.get('skipped', 0)} "
                               f"reads skipped (circuit open), {l2.get('writes_dropped', 0):,} rows of write-back dropped")
        elif t["id"] == "T4":
            app = s.get("single zipf c=1 (end of phase)") or s.get("single zipf c=1")
            st = app.get("stages", {})
            t["limit"] = ("per-stage P99 (bucket-interpolated): " + ", ".join(
                f"{k} {ms(st.get('feature_' + k), 'p99_s'):.2f} ms" for k in ("l1", "l2", "origin") if st.get("feature_" + k))
                + f"; an L2 read is one MGET round trip to Redis for the L1 misses")
            idle = res.get("baselines", {}).get("redis_mget", {}).get("idle", {})
            if idle.get("calls"):
                t["limit"] += (f"; with no service around it, that round trip alone reads P50 {idle['p50_ms']:.2f} "
                               f"ms, P99 {idle['p99_ms']:.2f} ms after {idle['idle_ms']:g} ms idle (the gap between "
                               "requests at c=1)")


BULK_256 = ("bulk 256 zipf c=1", "bulk 256 zipf c=4", "bulk 256 zipf c=16")  # T3: the best of these


INPROC_VARIANTS = {"b3": "with L1", "b3_no_l1": "without L1", "b3_callers": "concurrent callers, without L1",
                   "b4": "1 thread", "b4_threads_all": "all threads", "b4_callers": "concurrent callers"}


def _best(inproc: dict, keys: tuple[str, ...]) -> dict | None:
    """The fastest in-process variant at 256 nodes, with its key as ``variant``."""
    rows = [{**inproc[k]["256"], "variant": k} for k in keys if "256" in inproc.get(k, {})]
    return max(rows, key=lambda r: r["nodes_per_s"]) if rows else None


def _variant(r: dict) -> str:
    tried = [v for k, v in INPROC_VARIANTS.items() if k[:2] == r["variant"][:2]]
    return f"{INPROC_VARIANTS[r['variant']]}, the best of: {'; '.join(tried)}"


def floor_note(what: str, base_p99_ms: float, app_p99_ms: float, bound_ms: float) -> str:
    """When the app misses an absolute bound that a baseline of the same run misses too, say so:
    that part of the miss is the machine's at that moment, not the app's."""
    if app_p99_ms <= bound_ms or not base_p99_ms > bound_ms:  # the app within it, or NaN / within
        return ""
    return f"; {what} read P99 {base_p99_ms:.2f} ms itself, over the {bound_ms:g} ms bound"


def mget_idle_p99(res: dict) -> float:
    idle = res.get("baselines", {}).get("redis_mget", {}).get("idle", {})
    return float(idle["p99_ms"]) if idle.get("calls") else NAN


def _miss(checks: list[tuple]) -> str:
    parts = []
    for c in checks:
        name, value, limit, unit = c[:4]
        higher_is_better = len(c) > 4 and c[4]
        bad = value < limit if higher_is_better else value > limit
        if bad:
            if limit:
                parts.append(f"{name} {value:.2f}{unit} vs {limit:g}{unit} ({abs(value / limit - 1):.0%} "
                             f"{'short' if higher_is_better else 'over'})")
            else:
                parts.append(f"{name} {value:g} vs {limit:g}")
    return "; ".join(parts)


# -- plots -----------------------------------------------------------------------------------------

def plot_cdf(res: dict, path: str) -> None:
    plt = _pyplot()
    s = by_name(res)
    panels = [
        ("single node (100k/1M)", ["single zipf c=1", "single zipf c=8", "single zipf c=32", "single uniform c=1",
                                   "single uniform c=32", "cold zipf c=1 (redis)", "single zipf c=1 (no redis)",
                                   "B1 single c=1", "B1 single c=32", "B2 single c=1", "B2 single c=32"]),
        ("bulk and open loop (100k/1M)", ["bulk 64 zipf c=1", "bulk 256 zipf c=1", "bulk 1024 zipf c=1",
                                          "bulk 256 zipf c=4", "bulk 256 zipf c=16", "B1 bulk 256 c=1"]
         + [n for n in s if n.startswith("open loop")]),
        ("1M nodes / 10M edges (vs 100k/1M)", [n for n in s if n.startswith("1M ")]
         + (["single zipf c=1", "single zipf c=32"] if any(n.startswith("1M ") for n in s) else [])),
    ]
    panels = [(t, [n for n in names if n in s]) for t, names in panels]
    panels = [p for p in panels if p[1]]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 4.6), squeeze=False)
    for ax, (title, names) in zip(axes[0], panels):
        for n in names:
            c = s[n]["cdf"]
            style = "--" if n.startswith(("B1", "B2")) else ":" if "cold" in n else "-"
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
    series = {"app (Redis on)": "single zipf c={}", "B1 trivial 3 services": "B1 single c={}",
              "B2 trivial 1 service": "B2 single c={}"}
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(16, 4.2))
    for label, pat in series.items():
        cs = [c for c in (1, 8, 32) if pat.format(c) in s]
        if not cs:
            continue
        a1.plot(cs, [s[pat.format(c)]["req_per_s"] for c in cs], "o-", label=label)
        a2.plot(cs, [s[pat.format(c)]["p99_ms"] for c in cs], "o-", label=label)
    for ax, yl in ((a1, "req/s (closed loop)"), (a2, "P99 latency, ms")):
        ax.set_xscale("log", base=2)
        ax.set_xticks([1, 8, 32], ["1", "8", "32"])
        ax.set_xlabel("concurrency (single-node requests)")
        ax.set_ylabel(yl)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    a2.axhline(45, color="red", lw=0.8, ls="--")
    _plot_bulk(a3, res, s)
    a1.set_title("throughput vs concurrency")
    a2.set_title("P99 vs concurrency (red: 45 ms)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_bulk(ax, res: dict, s: dict) -> None:
    """T3: bulk-256 nodes/s of the app per concurrency, the monoliths' best as lines."""
    cs = [c for c in (1, 4, 16) if f"bulk 256 zipf c={c}" in s]
    ax.plot(cs, [s[f"bulk 256 zipf c={c}"]["nodes_per_s"] for c in cs], "o-", label="app, bulk 256 (Redis on)")
    inproc = res.get("baselines", {}).get("inproc", {})
    for keys, label, colour in ((("b3", "b3_no_l1", "b3_callers"), "B3 best", "tab:green"),
                                (("b4", "b4_threads_all", "b4_callers"), "B4 best", "tab:red")):
        best = _best(inproc, keys)
        if best:
            ax.axhline(best["nodes_per_s"], color=colour, lw=0.9, ls="--", label=f"{label} ({INPROC_VARIANTS[best['variant']]})")
    ax.set_xscale("log", base=2)
    ax.set_xticks([1, 4, 16], ["1", "4", "16"])
    ax.set_xlabel("concurrency (256-node requests)")
    ax.set_ylabel("nodes/s")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("T3: bulk nodes/s vs concurrency")


BREAKDOWN = ("feature: sample", "feature: L1", "feature: L2", "feature: origin", "feature: assemble",
             "feature: rest + model hop", "model: queue", "model: compute", "model: server rest",
             "gateway: hops + own work", "gateway: BentoML in/out", "client + transport")


def breakdown(row: dict) -> dict[str, float]:
    """Mean ms per component; the feature/model stages are means per batch (= per request at c=1)."""
    st = row.get("stages", {})
    g = lambda k: ms(st.get(k))  # noqa: E731
    # a stage not consulted in some batches: its mean per batch is sum / (number of batches)
    batches = st.get("feature_l1", {}).get("count") or 1
    per_batch = lambda k: (st[k]["sum_s"] * 1e3 / batches) if k in st else 0.0  # noqa: E731
    f_stages = {"feature: sample": per_batch("feature_sample"), "feature: L1": per_batch("feature_l1"),
                "feature: L2": per_batch("feature_l2"), "feature: origin": per_batch("feature_origin"),
                "feature: assemble": per_batch("feature_assemble")}
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


def plot_breakdown(res: dict, path: str) -> list[tuple[str, dict[str, float], float]]:
    plt = _pyplot()
    s = by_name(res)
    names = [n for n in ("single zipf c=1", "single zipf c=8", "single zipf c=32", "single uniform c=1",
                         "single zipf c=1 (no redis)", "cold zipf c=1 (redis)", "bulk 64 zipf c=1",
                         "bulk 256 zipf c=1", "bulk 1024 zipf c=1", "1M single zipf c=1", "1M single zipf c=32",
                         "1M bulk 256 zipf c=1") if n in s and s[n].get("stages")]
    rows = [(n, breakdown(s[n]), s[n].get("mean_ms", NAN)) for n in names]
    if not rows:
        return rows
    fig, ax = plt.subplots(figsize=(11, 0.45 * len(rows) + 2))
    cmap = plt.get_cmap("tab20")
    for i, (n, parts, total) in enumerate(rows):
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
    lines = ["| scenario | graph | Redis | cache | mode | ok | req/s | nodes/s | P50 | P90 | P99 | P99.9 | errors | "
             "L1+L2 hit |",
             "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in res["scenarios"]:
        mode = f"c={r['concurrency']}" if r["mode"] == "closed" else f"{r['rate']:.0f}/s open"
        hr = r.get("hit_ratio")
        lines.append(
            f"| {r['name']} | {r.get('graph', '')} | {r.get('redis', '-')} | {r.get('cache', '-')} | {mode} | "
            f"{r['ok']:,} | {r['req_per_s']:.0f} | {r['nodes_per_s']:,.0f} | {f(r.get('p50_ms'))} | "
            f"{f(r.get('p90_ms'))} | {f(r.get('p99_ms'))} | {f(r.get('p999_ms'))} | "
            f"{r['errors'] if r['error_count'] else 0} | {f(hr and hr['combined'] * 100, '{:.1f}%')} |")
    return lines


def cpu_per_request(row: dict) -> dict[str, float]:
    """CPU milliseconds per successful request, per process (from psutil CPU-time diffs)."""
    ok = max(row.get("ok", 0), 1)
    return {k: v * row["elapsed_s"] / ok * 1e3 for k, v in row.get("cpu_util", {}).items()}


CPU_ROWS = ("single zipf c=1", "single zipf c=32", "single zipf c=32 (batch delay", "single zipf c=32 (no redis)",
            "B1 single c=1", "B1 single c=32", "B2 single c=1", "B2 single c=32", "bulk 256 zipf c=1",
            "bulk 256 zipf c=1 (no redis)", "B1 bulk 256 c=1", "1M single zipf c=32")


def cpu_table(res: dict) -> list[str]:
    s = by_name(res)
    rows = [n for p in CPU_ROWS for n in s if n == p or (p.endswith("delay") and n.startswith(p))]
    if not rows:
        return []
    lines = ["| scenario | req/s | gateway | feature | model | services total | loadgen | "
             "2 cores / services total = req/s ceiling |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for n in rows:
        c = cpu_per_request(s[n])
        svc = {k: v for k, v in c.items() if k != "loadgen"}
        total = sum(svc.values())
        gw = c.get("gateway", c.get("single", NAN))
        lines.append(f"| {n} | {s[n]['req_per_s']:.0f} | {gw:.2f} | {f(c.get('feature'))} | {f(c.get('model'))} | "
                     f"{total:.2f} | {c.get('loadgen', NAN):.2f} | {2000 / total if total else NAN:,.0f} |")
    return lines


def scale_table(res: dict) -> list[str]:
    s = by_name(res)
    mem = res.get("memory", {})
    pairs = [("100k/1M", "", "single zipf c=1", "single zipf c=32", "bulk 256 zipf c=1"),
             ("1M/10M", "1M ", "1M single zipf c=1", "1M single zipf c=32", "1M bulk 256 zipf c=1")]
    lines = ["| graph | sample, 1 node (mean / P99 ms) | sample, 256 nodes (mean ms) | e2e P99 c=1 | e2e P99 c=32 | "
             "e2e P50 bulk 256 | RSS gateway | RSS feature | RSS model | Redis used | L1+L2 hit c=1 |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for graph, _, c1, c32, bulk in pairs:
        if c1 not in s:
            continue
        st1 = s[c1].get("stages", {}).get("feature_sample")
        stb = s.get(bulk, {}).get("stages", {}).get("feature_sample")
        m = mem.get(graph, {})
        rss = lambda k: f(m.get(k, {}).get("rss_mib"), "{:.0f} MiB")  # noqa: E731
        hr = s[c1].get("hit_ratio") or {}
        lines.append(f"| {graph} | {f(ms(st1))} / {f(ms(st1, 'p99_s'))} | {f(ms(stb))} | {f(s[c1].get('p99_ms'))} | "
                     f"{f(s.get(c32, {}).get('p99_ms'))} | {f(s.get(bulk, {}).get('p50_ms'))} | {rss('gateway')} | "
                     f"{rss('feature')} | {rss('model')} | {f(m.get('redis', {}).get('used_mib'), '{:.0f} MiB')} | "
                     f"{f(hr.get('combined', NAN) * 100, '{:.1f}%')} |")
    return lines


def profile_lines(res: dict) -> list[str]:
    lines = []
    for key, p in res.get("profiles", {}).items():
        comps = ", ".join(f"{k} {v:.0%}" for k, v in list(p["by_component"].items())[:8])
        leaf = ", ".join(f"`{short(k)}` {v:.0%}" for k, v in p["top_leaf"][:6])
        generic = ("Middleware", "wrapped_app", "Router", "Route.handle", "request_response", "HttpGuard", "send",
                   "Handle._run", "BaseEventLoop", "Runner.run", "asyncio_run", "Server.run", "Command.", "Context.",
                   "_run_module_as_main", "_run_code", "<module>", "process ")
        incl = ", ".join(f"`{k}` {v:.0%}" for k, v in p["top_inclusive"]
                         if k != "main" and not any(g in k for g in generic))
        cpu = ", ".join(f"{k} {v:.0%}" for k, v in sorted(p["cpu_util"].items(), key=lambda kv: -kv[1]))
        lines += [f"- **{key}** ({p['scenario']}: {p['req_per_s']:.0f} req/s, P99 {f(p.get('p99_ms'))} ms while "
                  f"profiled): the profiled process was on-CPU in {p['busy_fraction']:.0%} of the samples "
                  f"(100% = one core saturated). CPU per process (1.0 = one core): {cpu}.",
                  f"  - self time by component: {comps}",
                  f"  - hottest leaf functions (self): {leaf}",
                  f"  - inclusive (function and its callees): {incl}"]
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


def write(res: dict, out_dir: str, docs: str | None = None) -> str:
    os.makedirs(out_dir, exist_ok=True)
    plot_cdf(res, os.path.join(out_dir, "latency_cdf.png"))
    plot_throughput(res, os.path.join(out_dir, "throughput_vs_concurrency.png"))
    rows = plot_breakdown(res, os.path.join(out_dir, "stage_breakdown.png"))
    tg = targets(res)
    limited_by(res, tg)
    cfg = res["config"]
    inproc = res.get("baselines", {}).get("inproc", {})
    quick = cfg.get("quick")
    img = "" if docs is None else os.path.relpath(out_dir, os.path.dirname(docs)) + "/"
    L: list[str] = []
    L += [f"# Performance{' (quick run)' if quick else ''}",
          "",
          f"Generated by `python -m bench.suite{' --quick' if quick else ''}` on "
          f"{cfg.get('started_at') or datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}, {cfg['machine']['cpus']} CPUs, Python "
          f"{cfg['machine']['python']}; wall time {res.get('elapsed_s', 0):.0f} s. Load average (1/5/15 min) "
          f"at start {'/'.join(f'{x:.2f}' for x in cfg['loadavg_start'])}, at end "
          f"{'/'.join(f'{x:.2f}' for x in cfg.get('loadavg_end', [NAN] * 3))}: other work shared the machine. "
          + machine_line(cfg) +
          "Everything ran on loopback; the load generator (asyncio + aiohttp) shares the same 2 cores with the "
          "services, and its CPU is reported with theirs.",
          "",
          code_line(cfg),
          "",
          "Set-up: the composed app as separate processes (Gateway -> FeatureRunner -> GraphSAGERunner; one worker "
          "each, BentoML `start-http-server --depends`, as the container runs them), auth off, no rate limit, "
          f"L1 = 10% of the feature bytes (`GSAGE_L1_BYTES={cfg.get('app_env', {}).get('GSAGE_L1_BYTES', '?')}`), "
          "L2 = a redis-server started by the suite on a free port (or none), fanout [25, 10], ONNX Runtime with 1 "
          "intra-op thread, adaptive batching defaults; the app's hot APIs answered past BentoML's per-request "
          "dispatch (`common/bento/direct_api.py`), the baselines' through `@bentoml.api`. Target ids: Zipf(1.0) over a random permutation of the "
          "node ids, or uniform. Closed loop = N workers back to back; open loop = Poisson arrivals, latency "
          "from the scheduled start. Every load loop is bounded in time and count.",
          "",
          "## Targets",
          "",
          "| target | result | measured | baseline (same run) | ratio | missed by |",
          "|---|---|---|---|---|---|"]
    for t in tg:
        verdict = "n/a" if t["pass"] is None else ("PASS" if t["pass"] else "MISS")
        L.append(f"| **{t['id']}** {t['what']} | **{verdict}** | {t['figure']} | {t['baseline']} | {t['ratio']} | "
                 f"{t['miss_by'] or ''} |")
    L += ["", "What limits each missed target (measured in this run):", ""]
    for t in tg:
        if t.get("limit"):
            L.append(f"- **{t['id']}**: {t['limit']}.")
    L += ["", "## What limits it (measured)", ""]
    L += analysis(res, tg, rows)
    L += ["", "## CPU cost per request (ms of CPU per request, per process)", "",
          "From psutil CPU-time diffs of each service's processes (arbiter + worker) over the scenario, divided by "
          "the requests answered. Less sensitive to other tenants than latency; the last column is the throughput "
          "2 dedicated cores could sustain at that cost (load generator excluded).", ""]
    L += cpu_table(res)
    findings = os.path.join(os.path.dirname(os.path.abspath(__file__)), "findings.md")
    if os.path.exists(findings) and not quick:
        with open(findings) as fh:
            L += ["", fh.read().strip()]
    L += ["", "## Plots", "",
          f"![latency CDF]({img}latency_cdf.png)", "",
          f"![throughput vs concurrency]({img}throughput_vs_concurrency.png)", "",
          f"![per-stage breakdown]({img}stage_breakdown.png)", "",
          "## Per-stage breakdown (mean ms, from the services' /metrics diffed around each scenario)", "",
          "Feature stages are means per merged batch (equal to per request at c=1); `feature: rest + model hop` = "
          "the FeatureRunner's BentoML request time minus its stages and the model runner's request time "
          "(validation, encoding, batcher queue, framework, its HTTP call to the model runner); `model: server "
          "rest` = the model runner's request time minus queue and compute (decode, encode, framework); "
          "`gateway: hops + own work` = `gateway_request_seconds` minus the FeatureRunner's request time (its HTTP "
          "client hop, JSON building); "
          "`gateway: BentoML in/out` = the gateway's BentoML request time minus `gateway_request_seconds` "
          "(request parsing, response serialisation); `client + transport` = the client's mean minus the "
          "gateway's server time. Under concurrency the batch means and request means differ, so rows need not "
          "add up exactly.", ""]
    L += breakdown_table(rows)
    L += ["", "## All scenarios", ""]
    L += scenario_table(res)
    if inproc:
        L += ["", "## In-process baselines (B3, B4)", "",
              f"Graph {inproc.get('num_nodes', 0):,} nodes / {inproc.get('num_edges', 0):,} edges, "
              f"model `{inproc.get('model')}`. B3: project sampler + tiered store (L1 holding every row) + "
              "`run_batch` on ONNX Runtime (1 thread). B4: `sample_tree` -> `mfg_tensors` -> `PygGraphSAGE` "
              "(state_dict from the store) -> softmax, torch with 1 thread and with all cores. `callers`: one "
              "caller thread per core, each with 1 compute thread (B3 without L1), over the same wall time. "
              "`after N ms idle`: B3 with a sleep before each call, as a service at c=1 waits between "
              "requests.", "",
              "| baseline | nodes/request | P50 ms | P99 ms | nodes/s |", "|---|---:|---:|---:|---:|"]
        for key, label in (("b3", "B3 sampler + ONNX"), ("b3_no_l1", "B3 without L1 (rows from the mmap)"),
                           ("b3_idle", f"B3 after {inproc.get('idle_ms', 0):g} ms idle before each call"),
                           ("b4", "B4 PyG, 1 thread"),
                           ("b3_callers", "B3 without L1, concurrent callers"),
                           ("b4_threads_all", "B4 PyG, all threads"), ("b4_callers", "B4 PyG, concurrent callers")):
            for n, r in inproc.get(key, {}).items():
                L.append(f"| {label} | {n} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['nodes_per_s']:,.0f} |")
    L += ["", "## Scale (T5)", ""]
    L += scale_table(res)
    L += ["", scale_paragraph(res)]
    if res.get("profiles"):
        L += ["", "## Profiles (py-spy, sampling, non-blocking)", ""]
        L += profile_lines(res)
    if res.get("skipped"):
        L += ["", "Skipped: " + "; ".join(res["skipped"])]
    if res.get("worker_restarts"):
        L += ["", "Service workers restarted during the run (from their logs; requests in flight then fail and "
              "caches restart cold): " + "; ".join(f"{k} at {', '.join(v)}" for k, v in res["worker_restarts"].items())]
    L += ["", "## Reproduce", "",
          "```bash",
          ". .venv/bin/activate && pip install -e '.[bench]'   # matplotlib, py-spy (profiles), locust",
          "python -m bench.suite --quick            # ~2.5 min, no 1M graph -> bench/results/quick/",
          "python -m bench.suite                    # ~10 min (+~4 min once to build the 1M store) -> bench/results/ + docs/",
          "python -m bench.suite --code worktree    # default: a snapshot of the working tree; --code head: of HEAD",
          "python -m bench.suite.report bench/results/suite.json   # re-render this report",
          "locust -f bench/locustfile.py --host http://127.0.0.1:3000   # the same scenarios, interactive",
          "```",
          "",
          "Outputs: `bench/results/suite.json` (quick: `bench/results/quick/suite_quick.json`), the PNGs, `report.md`, "
          "service logs in `logs/`, py-spy stacks `profile-*.txt` (raw, collapsed). Only full runs rewrite "
          "`docs/performance.md`. Demo stores: `/tmp/gsage-bench-home` (100k/1M, ~80 s to build) and "
          "`/tmp/gsage-bench-home-1m` (1M/10M, ~230 s), reused when present."]
    text = "\n".join(L) + "\n"
    md = os.path.join(out_dir, "report.md")
    with open(md, "w") as fh:
        fh.write(text.replace(f"]({img}", "]("))
    if docs:
        os.makedirs(os.path.dirname(docs), exist_ok=True)
        with open(docs, "w") as fh:
            fh.write(text)
    return md


def code_line(cfg: dict) -> str:
    c = cfg.get("code")
    if not c:
        return "Code under test: the working tree (not recorded)."
    line = (f"Code under test: a {'snapshot of the working tree' if c['mode'] == 'worktree' else 'snapshot of HEAD'} "
            f"taken at the start, commit `{c['git_head'][:10]}` ({c['git_head_subject']})")
    if c.get("uncommitted_in_code"):
        line += "; with uncommitted changes in " + ", ".join(f"`{x}`" for x in c["uncommitted_in_code"])
    if c.get("uncommitted_ignored"):
        line += "; uncommitted changes in " + ", ".join(f"`{x}`" for x in c["uncommitted_ignored"]) + " not included"
    return line + "."


def analysis(res: dict, tg: list[dict], rows: list) -> list[str]:
    """Data-driven sentences: which process was busy, which stage dominated, what the profile says."""
    s = by_name(res)
    out = []
    c32 = s.get("single zipf c=32")
    if c32:
        u = c32["cpu_util"]
        total = sum(u.values())
        top = max(u.items(), key=lambda kv: kv[1])
        out.append(f"- **c=32 single node**: {c32['req_per_s']:.0f} req/s; the processes used {total:.2f} of 2 cores "
                   f"({', '.join(f'{k} {v:.2f}' for k, v in sorted(u.items(), key=lambda kv: -kv[1]))}). "
                   f"Busiest: {top[0]} at {top[1]:.0%} of one core"
                   + (" — a single-worker process at ~100% of a core is the ceiling." if top[1] > 0.85 else "."))
        st = c32.get("stages", {})
        fb, mb = st.get("feature_batch_targets"), st.get("model_batch_targets")
        if fb and mb:
            out.append(f"  Batching under load: {fb['sum_s'] / fb['count']:.1f} targets per feature batch, "
                       f"{mb['sum_s'] / mb['count']:.1f} per forward pass; model compute mean "
                       f"{f(ms(st.get('model_compute')))} ms, queue {f(ms(st.get('model_queue')))} ms; gateway core "
                       f"mean {f(ms(st.get('gateway_core')))} ms vs its BentoML request time "
                       f"{f(ms(st.get('gateway_server')))} ms.")
    for key in ("B1 single c=32", "B2 single c=32"):
        r = s.get(key)
        if r:
            u = r["cpu_util"]
            out.append(f"- **{key}** (no work at all): {r['req_per_s']:.0f} req/s, P99 {r['p99_ms']:.1f} ms; CPU "
                       + ", ".join(f"{k} {v:.2f}" for k, v in sorted(u.items(), key=lambda kv: -kv[1])) + ".")
    c1 = s.get("single zipf c=1")
    if c1 and rows:
        parts = dict((n, p) for n, p, _ in rows).get("single zipf c=1")
        if parts:
            work = sum(v for k, v in parts.items() if k.startswith(("feature: sample", "feature: L", "feature: origin",
                                                                    "feature: assemble", "model: compute")))
            out.append(f"- **c=1 single node**: mean {c1['mean_ms']:.2f} ms of which the actual work (sampling, "
                       f"feature fetch, assemble, forward pass) is {work:.2f} ms ({work / c1['mean_ms']:.0%}); the "
                       "rest is HTTP hops, (de)serialisation and framework time (see the breakdown table).")
    b = s.get("bulk 256 zipf c=1")
    if b and rows:
        parts = dict((n, p) for n, p, _ in rows).get("bulk 256 zipf c=1")
        if parts:
            top3 = sorted(parts.items(), key=lambda kv: -kv[1])[:3]
            out.append(f"- **bulk 256**: mean {b['mean_ms']:.1f} ms; largest components: "
                       + ", ".join(f"{k} {v:.1f} ms" for k, v in top3) + ".")
    for key, p in res.get("profiles", {}).items():
        comps = ", ".join(f"{k} {v:.0%}" for k, v in list(p["by_component"].items())[:5])
        out.append(f"- **profile {key}**: on-CPU {p['busy_fraction']:.0%} of wall time; self time: {comps}.")
    return out


def scale_paragraph(res: dict) -> str:
    s = by_name(res)
    mem = res.get("memory", {})
    a, b = s.get("single zipf c=1"), s.get("1M single zipf c=1")
    if not (a and b and "1M/10M" in mem and "100k/1M" in mem):
        return "The 1M/10M graph was not run in this invocation (the full run covers it)."
    sa, sb = a["stages"].get("feature_sample"), b["stages"].get("feature_sample")
    ma, mb = mem["100k/1M"], mem["1M/10M"]
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
        "the difference between the two is within the run-to-run noise of this shared machine.")


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else "bench/results/suite.json"
    with open(path) as fh:
        res = json.load(fh)
    out_dir = os.path.dirname(os.path.abspath(path))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    full = not res.get("config", {}).get("quick")
    docs = os.path.join(root, "docs", "performance.md") if full and "--no-docs" not in sys.argv else None
    print(write(res, out_dir, docs))


if __name__ == "__main__":
    main()
