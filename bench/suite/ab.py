"""Interleaved A/B of app configurations against a baseline (prints numbers, never asserts).

    python -m bench.suite.ab [--concurrency 1] [--nodes 1] [--rounds 6] [--window 4]
                             [--variant GSAGE_X=1,GSAGE_Y=2] [--variant-model-runner]
                             [--variant-code REF] [--variant-colocated] [--no-redis-side] [--colocated]
                             [--baseline B1|B2|B5|none]

Sides, each its own processes (split ``start-http-server``, as the suite starts them): ``app`` (the
suite's configuration: L1 at 10% of the features, Redis for L2), ``noredis`` (the same without
Redis), ``colocated`` (with ``--colocated``: the app's three services in one process, the gateway
started alone), ``variant`` (the app with ``--variant``'s environment, when given) and the baseline (B1
and B2: BentoML services that do no work, ``bench.suite.trivial_services``; B5: the app's work in
one process behind uvicorn, ``bench.suite.one_process``, with the app's environment). The
FeatureRunner + gateway pairs share one model runner (``--variant-model-runner``: the variant
starts its own, with its environment, for a variant that changes the model runner). ``--variant-code
REF``: the variant's three services (its own model runner too) run the product code of commit REF
(``git archive``) while the other sides run the working tree: a change measured against the code
before it (the same environment goes to both; older code ignores GSAGE_ names it lacks);
``--variant-colocated`` makes the variant a co-located app (so ``--colocated --variant-code REF
--variant-colocated`` is the co-located deployment before and after a change). Each side
is warmed up, then the sides take turns in short windows (A B C, C B A, ...), so that every side meets the same background load: on
this shared machine a separate window reads the neighbours of its own minute (a side measured
minutes apart moved T1 by 0.4x). Prints, per side, the pooled latency, each window's P99, the
ratios to the baseline, and the mean of each stage from the services' own /metrics.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from bench.suite import procs
from bench.suite.runner import HOME_100K, Suite, ensure_store, snapshot_counts
from harness.redis_servers import RedisServer, redis_available


def parse_env(spec: str) -> dict[str, str]:
    """``K=V,K=V`` -> dict; raises SystemExit on a malformed entry."""
    out = {}
    for item in filter(None, spec.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--variant: expected KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def sides(
    suite: Suite, redis: RedisServer, args: argparse.Namespace, variant_code: Path | None = None
) -> dict[str, procs.Topology]:
    num_nodes, _ = snapshot_counts(HOME_100K)
    env = suite.app_env(redis.url, num_nodes)
    app = procs.real_app("app", HOME_100K, env, suite.logs)
    model = app.services["model"]
    out = {"app": app}
    if not args.no_redis_side:
        out["noredis"] = procs.real_app(
            "app-noredis", HOME_100K, {**env, "GSAGE_REDIS_URL": ""}, suite.logs, model=model
        )
    if args.colocated:
        out["colocated"] = procs.colocated_app("app-colocated", HOME_100K, env, suite.logs)
    if args.variant_colocated:  # the variant as the co-located deployment: its own process
        out["variant"] = procs.colocated_app(
            "app-variant", HOME_100K, {**env, **parse_env(args.variant)}, suite.logs, code_dir=variant_code
        )
    elif args.variant or variant_code is not None:
        own_model = args.variant_model_runner or variant_code is not None
        out["variant"] = procs.real_app(
            "app-variant",
            HOME_100K,
            {**env, **parse_env(args.variant)},
            suite.logs,
            model=None if own_model else model,
            code_dir=variant_code,
        )
    if args.baseline == "B1":
        out["B1"] = procs.trivial_app(HOME_100K, suite.logs)
    elif args.baseline == "B2":
        out["B2"] = procs.trivial_single(HOME_100K, suite.logs)
    elif args.baseline == "B5":
        out["B5"] = procs.one_process(HOME_100K, env, suite.logs)
    return out


def stage_means_ms(stages: dict) -> dict[str, float]:
    return {
        k: round(v["mean_s"] * 1e3, 3)
        for k, v in stages.items()
        if k.endswith(
            (
                "_core",
                "_server",
                "_sample",
                "_l1",
                "_l2",
                "_origin",
                "_fetch",
                "_l1_fill",
                "_assemble",
                "_queue",
                "_compute",
            )
        )
    }


def run(
    suite: Suite, topologies: dict[str, procs.Topology], args: argparse.Namespace, variant_code: dict | None = None
) -> None:
    for name, topo in topologies.items():
        if not name.startswith("B"):  # as the suite warms its app: fills L1 and Redis
            suite.load(f"warm-up 32-node {name}", topo, nodes=32, concurrency=2, duration=6, record=False, seed=22)
            suite.load(f"warm-up single {name}", topo, concurrency=8, duration=5, record=False, seed=21)
    before = {k: suite.scrape_all(t) for k, t in topologies.items()}
    rows = suite.paired(
        topologies, concurrency=args.concurrency, rounds=args.rounds, window=args.window, tags={}, nodes=args.nodes
    )
    after = {k: suite.scrape_all(t) for k, t in topologies.items()}
    shared = (
        "the variant has its own model runner"
        if args.variant_model_runner or variant_code or args.variant_colocated
        else "the app sides share one model runner: its stages are pooled over them"
    )
    print(
        f"\n{args.rounds} rounds of {args.window:g} s per side, c={args.concurrency}, {args.nodes} node(s) per request"
        f" ({shared})"
    )
    if variant_code:
        print(
            f"variant code: {variant_code['commit'][:10]} ({variant_code['subject'][:80]}); "
            f"the other sides: the working tree"
        )
    for name, row in rows.items():
        windows = [round(w["p99_ms"], 1) for w in row["windows"] if w["p99_ms"] is not None]
        print(
            f"{name:8s} {row['req_per_s']:8.1f} req/s  mean {row['mean_ms']:7.2f}  P50 {row['p50_ms']:7.2f}  "
            f"P99 {row['p99_ms']:7.2f} ms  errors {row['error_count']}  window P99s {windows}"
        )
        if row.get("cpu_ms_per_request") is not None:
            print(
                f"{'':8s} CPU of its services: {row['cpu_ms_per_request']:.3f} ms per request; of the load "
                f"generator: {row['client_cpu_ms_per_request']:.3f} ms; both: {row['cores']:.2f} cores"
            )
        print(f"{'':8s} stage means (ms): {stage_means_ms(suite.stages(before[name], after[name]))}")
    base = rows.get(args.baseline)
    if base is not None:
        for name, row in rows.items():
            if row is not base:
                cpu = ""
                if row.get("cpu_ms_per_request") and base.get("cpu_ms_per_request"):
                    cpu = f", CPU per request {row['cpu_ms_per_request'] / base['cpu_ms_per_request']:.2f}x"
                print(
                    f"{name}/{args.baseline}: P50 {row['p50_ms'] / base['p50_ms']:.2f}x, P99 "
                    f"{row['p99_ms'] / base['p99_ms']:.2f}x, mean {row['mean_ms'] / base['mean_ms']:.2f}x, req/s "
                    f"{row['req_per_s'] / base['req_per_s']:.2f}x{cpu}"
                )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.suite.ab", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--nodes", type=int, default=1, help="node ids per request")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--window", type=float, default=4.0, help="seconds per side per round")
    p.add_argument("--variant", default="", help="environment of a third side: KEY=VALUE,KEY=VALUE")
    p.add_argument(
        "--variant-model-runner",
        action="store_true",
        help="the variant starts its own model runner (with its environment) instead of sharing the app's",
    )
    p.add_argument(
        "--variant-code",
        metavar="REF",
        default=None,
        help="the variant's services (its own model runner too) run the product code of git commit REF",
    )
    p.add_argument(
        "--variant-colocated",
        action="store_true",
        help="the variant is the co-located deployment (with --variant-code: the co-located app at REF)",
    )
    p.add_argument("--no-redis-side", action="store_true", help="leave out the app without Redis")
    p.add_argument(
        "--colocated", action="store_true", help="a side with the three services in one process (the gateway alone)"
    )
    p.add_argument("--baseline", choices=("B1", "B2", "B5", "none"), default="B1")
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "gsage-ab"), help="service logs")
    args = p.parse_args(argv)
    if args.variant:
        parse_env(args.variant)  # fail before starting anything
    if not redis_available():
        raise SystemExit("redis-server is not installed: the app sides need it for L2")
    suite = Suite(argparse.Namespace(quick=False, scale=1.0, out=args.out, code="worktree"))
    variant_code = None
    if args.variant_code is not None:
        try:  # fail before starting anything
            variant_code = procs.snapshot_ref(args.variant_code, tempfile.mkdtemp(prefix="gsage-ab-variant-code-"))
        except ValueError as e:
            raise SystemExit(f"--variant-code: {e}") from None
        suite.log(
            f"variant code: {variant_code['commit'][:10]} ({', '.join(variant_code['dirs'])}) in {variant_code['dir']}"
        )
    procs.snapshot_code(tempfile.mkdtemp(prefix="gsage-ab-code-"), "worktree")
    ensure_store(HOME_100K, [], suite.log)
    redis = RedisServer(os.path.join(suite.logs, "redis")).start()
    topologies: dict[str, procs.Topology] = {}
    try:
        topologies = sides(suite, redis, args, Path(variant_code["dir"]) if variant_code else None)
        suite.start(*topologies.values())
        run(suite, topologies, args, variant_code)
    finally:
        for topo in topologies.values():
            topo.stop()
        redis.stop()


if __name__ == "__main__":
    sys.exit(main())
