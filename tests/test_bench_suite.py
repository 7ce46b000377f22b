"""The benchmark suite's pooling of interleaved windows and the report's choice of figures."""

import numpy as np
import pytest

from bench.suite.loadgen import LoadResult


def _window(lat_ms, errors=None, elapsed=1.0):
    return LoadResult("closed", 1, None, 1, np.asarray(lat_ms) / 1e3, errors or {}, 0, elapsed, len(lat_ms))


def test_pooled_windows_are_one_sample():
    a = _window([1.0, 2.0], {"503": 1}, elapsed=2.0)
    b = _window([3.0], {"503": 2, "exc:Timeout": 1}, elapsed=1.0)
    s = LoadResult.pooled([a, b]).summary()
    assert s["ok"] == 3 and s["sent"] == 3
    assert s["errors"] == {"503": 3, "exc:Timeout": 1} and s["error_count"] == 4
    assert s["req_per_s"] == pytest.approx(1.0)
    assert s["max_ms"] == pytest.approx(3.0)


def test_targets_prefer_interleaved_windows_and_the_whole_fetch_histogram():
    from bench.suite import report  # no matplotlib needed until it plots
    own_app = {"name": "single zipf c=1", "p99_ms": 20.0, "p50_ms": 5.0, "ok": 10}
    own_b1 = {"name": "B1 single c=1", "p99_ms": 10.0, "p50_ms": 4.0, "ok": 10}
    rows = {r["name"]: r for r in (own_app, own_b1)}
    assert report.paired_or_own(rows, "single zipf c=1", "B1 single c=1")[:2] == (own_app, own_b1)
    windows = [{"p99_ms": 8.0, "req_per_s": 1.0}, {"p99_ms": 9.0, "req_per_s": 1.0}]
    pa = {"name": "single zipf c=1 (paired)", "group": "paired", "p99_ms": 9.0, "ok": 5, "windows": windows}
    pb = {"name": "B1 single c=1 (paired)", "group": "paired", "p99_ms": 8.0, "ok": 5,
          "windows": [{"p99_ms": 8.0, "req_per_s": 1.0}, {"p99_ms": 6.0, "req_per_s": 1.0}]}
    rows.update({pa["name"]: pa, pb["name"]: pb})
    app, base, own = report.paired_or_own(rows, "single zipf c=1", "B1 single c=1")
    assert (app, base, own) == (pa, pb, own_app)
    note = report.pairing_note(rows, app, base, "single zipf c=1", "B1 single c=1", lambda r: r["p99_ms"])
    assert "per window pair 1.00-1.50x" in note and "separate windows 2.00x" in note

    levels = {"feature_l1": {"p99_s": 0.0005}, "feature_l2": {"p99_s": 0.001}}
    assert report.retrieval_p99({"stages": levels}) == (pytest.approx(1.5), False)
    whole = {**levels, "feature_fetch": {"p99_s": 0.0012}}
    assert report.retrieval_p99({"stages": whole}) == (pytest.approx(1.2), True)


def test_t3_takes_each_monoliths_fastest_variant_and_names_it():
    from bench.suite import report
    row = lambda nps: {"256": {"nodes_per_s": nps, "p50_ms": 1.0}}  # noqa: E731
    inproc = {"b4": row(20_000.0), "b4_threads_all": row(23_000.0), "b4_callers": row(33_000.0), "b3": row(1.0)}
    best = report._best(inproc, ("b4", "b4_threads_all", "b4_callers"))
    assert best["nodes_per_s"] == 33_000.0 and best["variant"] == "b4_callers"
    assert report._variant(best) == "concurrent callers, the best of: 1 thread; all threads; concurrent callers"
    assert report._best(inproc, ("b3_no_l1",)) is None


def test_concurrent_callers_count_every_call_over_the_wall_time():
    from bench.suite.inproc import _concurrent
    calls: list[tuple[int, int]] = []
    make = lambda k: (lambda x: calls.append((k, x)))  # noqa: E731
    out = _concurrent(make, [1, 2, 3], budget_s=0.05, callers=2, nodes=256)
    timed = len(calls) - 2  # one untimed call per caller first
    assert out["calls"] == timed > 0 and out["callers"] == 2
    assert {k for k, _ in calls} == {0, 1}
    assert out["nodes_per_s"] <= timed * 256 / 0.05  # counted over at least the budget


def test_idle_gap_precedes_each_timed_call_and_is_not_timed():
    import time

    from bench.suite.workload import time_calls
    starts: list[float] = []
    secs = time_calls(lambda x: starts.append(time.perf_counter()), [1, 2], budget_s=0.0, min_calls=5,
                      warmup=0, idle_s=0.02)
    assert len(secs) == len(starts) == 5
    assert min(np.diff(starts)) >= 0.02  # slept before every call
    assert sum(secs) < 5 * 0.02  # but the sleep is outside the timed interval


def test_ab_variant_environment_is_parsed_or_refused():
    from bench.suite.ab import parse_env

    assert parse_env("GSAGE_PREMEAN=0,GSAGE_L2_TTL_S=60") == {"GSAGE_PREMEAN": "0", "GSAGE_L2_TTL_S": "60"}
    assert parse_env("GSAGE_REDIS_URL=") == {"GSAGE_REDIS_URL": ""}
    assert parse_env("") == {}
    for bad in ("GSAGE_PREMEAN", "=1"):
        with pytest.raises(SystemExit, match="KEY=VALUE"):
            parse_env(bad)


def test_suite_refuses_to_start_without_the_plot_library(monkeypatch, tmp_path):
    """The report is written last: a missing matplotlib must stop the suite before its ~10 min of
    load, not after (a clean install without the bench extra crashed at the report)."""
    import importlib.util

    from bench.suite import runner

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    monkeypatch.setattr(runner, "Suite", lambda *a: pytest.fail("the suite started"))
    with pytest.raises(SystemExit, match="matplotlib"):
        runner.main(["--quick", "--out", str(tmp_path)])
    assert runner.missing_bench_extra(profiles=False) == ["matplotlib"]


def test_an_absolute_miss_names_a_baseline_that_missed_the_bound_too():
    from bench.suite import report
    assert report.floor_note("B1", 19.6, 21.0, 10.0) == "; B1 read P99 19.60 ms itself, over the 10 ms bound"
    assert report.floor_note("B1", 8.0, 21.0, 10.0) == ""  # the baseline met it: the miss is the app's
    assert report.floor_note("B1", 19.6, 9.0, 10.0) == ""  # the app met it
    assert report.floor_note("B1", float("nan"), 21.0, 10.0) == ""  # not measured
    assert np.isnan(report.mget_idle_p99({})) and report.mget_idle_p99(
        {"baselines": {"redis_mget": {"idle": {"calls": 5, "p99_ms": 3.15}}}}) == 3.15


def test_closed_loop_warm_up_opens_every_connection_before_timing():
    import asyncio

    from aiohttp import web

    from bench.suite import loadgen

    peers: list[int] = []  # client port per answered request, in order: the 8 warm-up ones first

    async def handle(request):
        await asyncio.sleep(0.005)  # long enough that concurrent requests need their own connections
        peers.append(request.transport.get_extra_info("peername")[1])
        return web.Response(body=b"{}")

    async def main():
        runner = web.AppRunner(web.Application())
        runner.app.router.add_post("/predict", handle)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            return await loadgen.closed_loop(f"http://127.0.0.1:{port}/predict", [b"{}"], 8, 0.2, warmup_requests=8)
        finally:
            await runner.cleanup()

    res = asyncio.run(main())
    warm, timed = set(peers[:8]), set(peers[8:])
    assert res.ok > 8 and len(warm) == 8  # the warm-up ran 8 at once: 8 connections
    assert timed <= warm  # the timed part opened none of its own
