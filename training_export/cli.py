"""Command line: ``python -m training_export <step>``.

Steps: ``generate`` (synthetic snapshot -> store), ``import`` (your graph -> store),
``train`` (train + export + verify + save a model for a stored snapshot; ``--live``: for the
living graph, the snapshot with the update log applied), ``compact`` (fold the update log into a
new snapshot the FeatureRunners switch to), ``parity`` (all three aggregators, PyG vs dense torch
vs ONNX Runtime), and ``demo``, which runs them end to end: nothing -> ``graph-snapshot:<v>`` +
``graphsage:<v>`` ready to serve.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import numpy as np

from runners.feature.snapshot import GraphSnapshot, load_snapshot, save_snapshot
from runners.graphsage.model_config import AGGREGATORS, ModelConfig
from training_export import importer
from training_export.synthetic import SyntheticGraphSpec, generate


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _graph_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=100_000)
    p.add_argument("--edges", type=int, default=1_000_000, help="directed CSR entries")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--multilabel", action="store_true", help="multi-label tags instead of one class")
    p.add_argument("--seed", type=int, default=0)


def _train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--aggregator", choices=AGGREGATORS, default="mean")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--fanout", default="25,10", help="comma-separated fanout per hop")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--max-train-nodes", type=int, default=None)


def _spec(args: argparse.Namespace) -> SyntheticGraphSpec:
    return SyntheticGraphSpec(
        num_nodes=args.nodes,
        num_edges=args.edges,
        num_classes=args.classes,
        task="multilabel" if args.multilabel else "multiclass",
        seed=args.seed,
    )


def _model_config(snapshot: GraphSnapshot, args: argparse.Namespace) -> ModelConfig:
    return ModelConfig(
        in_dim=snapshot.feature_dim,
        hidden_dim=args.hidden,
        num_classes=snapshot.num_classes,
        fanout=tuple(int(k) for k in args.fanout.split(",")),
        aggregator=args.aggregator,
        task=snapshot.task,
    )


def cmd_generate(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    snapshot = generate(_spec(args))
    tag = save_snapshot(snapshot)
    return {"graph_snapshot": tag, "seconds": round(time.perf_counter() - started, 1), **_summary(snapshot)}


def _summary(snapshot: GraphSnapshot) -> dict[str, Any]:
    meta = snapshot.metadata()
    return {
        k: meta[k]
        for k in ("num_nodes", "num_edges", "feature_dim", "num_classes", "task", "degree_mean", "degree_max")
    }


def train_and_save(snapshot: GraphSnapshot, args: argparse.Namespace) -> dict[str, Any]:
    from training_export.export import export_and_verify
    from training_export.train import TrainSpec, train_features_only, train_graphsage

    cfg = _model_config(snapshot, args)
    spec = TrainSpec(epochs=args.epochs, max_train_nodes=args.max_train_nodes)
    baseline = train_features_only(snapshot, cfg, spec)
    model, scores = train_graphsage(snapshot, cfg, spec)
    metrics: dict[str, Any] = dict(scores)
    metrics["features_only_val_score"] = baseline["val_score"]
    metrics["features_only_test_score"] = baseline["test_score"]
    metrics["metric"] = "accuracy" if cfg.task == "multiclass" else "micro_f1"
    int8 = getattr(args, "int8", False)
    _log(
        "exporting to ONNX and checking parity (PyG vs dense torch vs ONNX Runtime)"
        + ("; INT8: quantising and guarding" if int8 else "")
    )
    tag, parity = export_and_verify(model, snapshot, metrics, int8=int8)
    result = {
        "graphsage": tag,
        "graph_snapshot": snapshot.tag,
        "aggregator": cfg.aggregator,
        "metrics": metrics,
        "parity": parity,
        "passed": parity["passed"],
    }
    if int8:
        import bentoml

        result["int8"] = bentoml.models.get(tag).info.metadata.get("int8")
    return result


def _int8_arg(p: argparse.ArgumentParser) -> None:
    # On by default: calibration and the guard's scoring add seconds, not minutes, to an export
    # (the export prints its steps' times: `"int8": {..., "seconds": ...}`).
    p.add_argument(
        "--int8",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also store INT8 graphs (static quantisation calibrated on the training split), kept only "
        "if they lose <= 0.5 points of validation score (training_export/quantize.py; default: on)",
    )


def _update_log() -> Any:
    """The update log the services use (the same GSAGE_GRAPH_LOG* and GSAGE_REDIS_URL settings)."""
    from common.settings import load_settings
    from runners.feature.update_log import update_log_of

    cfg = load_settings()
    return update_log_of(cfg), cfg


def live_snapshot(tag: str) -> GraphSnapshot:
    """The living graph: ``tag`` with every update of the log after it applied, in memory; nodes
    added with a label join the training split."""
    from runners.feature.live import replay

    log_, cfg = _update_log()

    async def build() -> Any:
        try:
            return await replay(load_snapshot(tag), log_, capacity=cfg.graph_capacity)
        finally:
            await log_.close()

    graph = asyncio.run(build())
    snapshot = graph.materialize()
    added = [v for v, label in graph.labels.items() if v >= graph.base.num_nodes and graph.present[v]]
    snapshot.train = np.concatenate([snapshot.train, np.asarray(sorted(added), dtype=snapshot.train.dtype)])
    snapshot.tag = (
        f"{graph.base.tag}+{graph.sequence - graph.base.log_sequence} updates (log sequence {graph.sequence})"
    )
    _log(
        f"living graph: {graph.base.tag} + the update log up to {graph.sequence}: {snapshot.num_nodes:,} nodes, "
        f"{snapshot.num_edges:,} edges, {len(added)} new labelled nodes in the training split"
    )
    return snapshot


def cmd_train(args: argparse.Namespace) -> dict[str, Any]:
    snapshot = live_snapshot(args.snapshot) if args.live else load_snapshot(args.snapshot)
    return train_and_save(snapshot, args)


def cmd_compact(args: argparse.Namespace) -> dict[str, Any]:
    """Fold the update log into a new graph snapshot (and announce it to the FeatureRunners)."""
    from runners.feature.live import compact

    log_, cfg = _update_log()

    async def run() -> dict[str, Any]:
        try:
            return await compact(args.snapshot, log_, args.upto, cfg.graph_capacity, announce=not args.no_announce)
        finally:
            await log_.close()

    _log(f"compacting {args.snapshot} + the update log ({cfg.graph_log_kind}) up to {args.upto or 'its head'}")
    result = asyncio.run(run())
    _log(f"  {result['snapshot']}: {result['updates_folded']} updates folded in {result['seconds']} s")
    return result


def cmd_load_features(args: argparse.Namespace) -> dict[str, Any]:
    """Fill the feature cluster with a snapshot's rows (``training_export.load_features``)."""
    from training_export.load_features import run

    return run(args)


def cmd_prune_features(args: argparse.Namespace) -> dict[str, Any]:
    """Delete superseded row versions (``training_export.prune_features``)."""
    from training_export.prune_features import run

    return run(args)


def cmd_parity(args: argparse.Namespace) -> dict[str, Any]:
    """Train each aggregator briefly and check the served form against PyG."""
    import tempfile

    from training_export.export import check_parity, export_all, to_dense
    from training_export.train import TrainSpec, train_graphsage

    snapshot = load_snapshot(args.snapshot) if args.snapshot else generate(_spec(args), progress=False)
    rows = {}
    for aggregator in AGGREGATORS:
        args.aggregator = aggregator
        model, _ = train_graphsage(
            snapshot,
            _model_config(snapshot, args),
            TrainSpec(epochs=1, max_train_nodes=args.max_train_nodes or 4096, eval_nodes=512),
            progress=False,
        )
        with tempfile.TemporaryDirectory() as tmp:
            paths = export_all(to_dense(model), tmp)
            rows[aggregator] = check_parity(
                model, paths[0], snapshot, count=args.targets, premean_path=paths[1] if len(paths) > 1 else None
            )
        _log(
            f"{aggregator:5s} max|diff| torch={rows[aggregator]['max_abs_diff_torch']:.2e} "
            f"onnx={rows[aggregator]['max_abs_diff_onnx']:.2e} argmax_equal={rows[aggregator]['argmax_equal']}"
        )
    return {"parity": rows, "passed": all(r["passed"] for r in rows.values())}


def cmd_demo(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    _log(f"[1/3] generating a synthetic social graph: {args.nodes:,} nodes, {args.edges:,} edges")
    snapshot = generate(_spec(args))
    _log("[2/3] saving graph-snapshot to the BentoML model store")
    save_snapshot(snapshot)
    _log(f"      {snapshot.tag}")
    _log(f"[3/3] training GraphSAGE ({args.aggregator}) + features-only baseline, export, verify, save")
    result = train_and_save(snapshot, args)
    result["total_seconds"] = round(time.perf_counter() - started, 1)
    m = result["metrics"]
    _log(
        f"\n  graph-snapshot : {result['graph_snapshot']}\n  graphsage      : {result['graphsage']}\n"
        f"  test {m['metric']}: GraphSAGE {m['test_score']:.4f} vs features-only {m['features_only_test_score']:.4f}\n"
        f"  parity         : max|diff| onnx {result['parity']['max_abs_diff_onnx']:.1e}, passed={result['parity']['passed']}\n"
        f"  total          : {result['total_seconds']} s"
    )
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training_export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("generate", help="generate a synthetic graph snapshot and store it")
    _graph_args(p)
    p.set_defaults(func=cmd_generate)
    p = sub.add_parser("import", help="import your own graph (edge list, features, labels, splits)")
    importer.build_parser(p)
    p.set_defaults(func=importer.run)
    p = sub.add_parser("train", help="train, export, verify and store a model for a stored snapshot")
    p.add_argument("--snapshot", default="graph-snapshot:latest")
    p.add_argument(
        "--live",
        action="store_true",
        help="train on the living graph: the snapshot with the update log applied (GSAGE_GRAPH_LOG*)",
    )
    _train_args(p)
    _int8_arg(p)
    p.set_defaults(func=cmd_train)
    p = sub.add_parser("compact", help="fold the update log into a new graph snapshot the FeatureRunners switch to")
    p.add_argument("--snapshot", default="graph-snapshot:latest", help="the snapshot the updates apply to")
    p.add_argument("--upto", type=int, default=None, help="the last update to fold in (default: the log's head)")
    p.add_argument("--no-announce", action="store_true", help="save the snapshot only; the FeatureRunners keep theirs")
    p.set_defaults(func=cmd_compact)
    p = sub.add_parser("load-features", help="write a snapshot's feature rows into the feature cluster (Redis)")
    from training_export.load_features import add_arguments

    add_arguments(p)
    p.set_defaults(func=cmd_load_features)
    p = sub.add_parser(
        "prune-features", help="delete the row versions in the feature cluster that no FeatureRunner reads any more"
    )
    from training_export.prune_features import add_arguments as add_prune_arguments

    add_prune_arguments(p)
    p.set_defaults(func=cmd_prune_features)
    p = sub.add_parser("parity", help="parity of all aggregators: PyG vs dense torch vs ONNX Runtime")
    p.add_argument("--snapshot", default=None, help="stored snapshot tag; default: a small generated graph")
    p.add_argument("--targets", type=int, default=256)
    _graph_args(p)
    _train_args(p)
    p.set_defaults(func=cmd_parity, nodes=5000, edges=50_000)
    p = sub.add_parser("demo", help="generate -> store -> train -> export -> verify -> store")
    _graph_args(p)
    _train_args(p)
    _int8_arg(p)
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = args.func(args)
    if isinstance(result, int):  # the importer prints its own summary
        return result
    print(json.dumps(result, indent=2, default=str))
    return 0 if result.get("passed", True) else 1


if __name__ == "__main__":
    raise SystemExit(main())
