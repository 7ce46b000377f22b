"""The routing table's command line: show it, set weights, promote (behind the shadow's
agreement bar), roll back, set or clear a shadow, print the shadow figures. The table and its
file format: ``services.routing``.

CLI::

    python -m services.routing_cli --file r.json show
    python -m services.routing_cli --file r.json set-weights graphsage graphsage:v1=90 graphsage:v2=10
    python -m services.routing_cli --file r.json promote graphsage graphsage:v2
    python -m services.routing_cli --file r.json rollback graphsage
    python -m services.routing_cli --file r.json set-shadow graphsage graphsage:v3 --share 0.5
    python -m services.routing_cli --file r.json shadow        # the figures of every (primary, shadow) pair
    python -m services.routing_cli --file r.json promote graphsage graphsage:v3 --min-agreement 0.98 --min-compared 500
    python -m services.routing_cli --file r.json clear-shadow graphsage

``promote`` with a bar refuses (exit 1, the figures in the message) unless the version, as the
shadow of the versions now routed, agreed on at least that share of at least that many compared
predictions, read from the gateway workers' stats files (``--stats-dir``, by default
``<file>.shadow``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from services.promotion import PromotionBar, PromotionRefused, require_agreement
from services.routing import (
    DEFAULT_VERSION,
    InvalidWeights,
    RoutingError,
    RoutingTable,
    model_name,
    normalise_version,
)
from services.shadow_stats import load_stats, merge_stats, pairs_report, stats_dir


def _parse_assignments(model: str, items: Sequence[str]) -> dict[str, float]:
    weights: dict[str, float] = {}
    for item in items:
        version, sep, weight = item.rpartition("=")
        if not sep or not version:
            raise InvalidWeights(f"expected VERSION=WEIGHT, got {item!r}")
        try:
            value = float(weight)
        except ValueError:
            raise InvalidWeights(f"{item!r}: weight {weight!r} is not a number") from None
        tag = normalise_version(model_name(model), version)
        if tag in weights:
            raise InvalidWeights(f"{tag} is listed twice")
        weights[tag] = value
    return weights


def _print_routes(table: RoutingTable, model: str) -> None:
    for r in table.routes(model):
        print(f"{r.version}\t{r.weight * 100:.2f}%")
    shadow = table.shadow(model)
    if shadow is not None:
        print(f"{shadow.version}\tshadow {shadow.share * 100:.2f}%")


def _shadow_report(table: RoutingTable, directory: str | None) -> dict[str, Any]:
    parts = load_stats(directory)
    return {
        "shadows": {m: s.to_json() for m in table.models() if (s := table.shadow(m)) is not None},
        "stats_dir": directory,
        "workers_reporting": len(parts),
        "pairs": pairs_report(merge_stats(parts)),
    }


def _check_promotion(
    table: RoutingTable, model: str, version: str, args: argparse.Namespace, directory: str | None
) -> None:
    """The ``--min-agreement`` / ``--min-compared`` bar, on every worker's figures in ``directory``."""
    if args.min_agreement is None and args.min_compared is None:
        return
    name = model_name(model)
    bar = PromotionBar(args.min_agreement or 0.0, args.min_compared or 0)
    figures = require_agreement(
        merge_stats(load_stats(directory)), normalise_version(name, version), bar, primaries=table.routes_in_use(name)
    )
    shown = "none" if figures.agreement is None else f"{figures.agreement:.4f}"
    print(
        f"agreement {shown} over {figures.predictions} predictions compared: "
        f"meets agreement >= {bar.min_agreement} over >= {bar.min_compared}",
        file=sys.stderr,
    )


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not in [0, 1]")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.routing_cli", description="Show or change model routing.")
    parser.add_argument(
        "--file",
        default=os.environ.get("GSAGE_ROUTING_FILE") or None,
        help="the routing file (default: $GSAGE_ROUTING_FILE)",
    )
    parser.add_argument(
        "--default-version", default=DEFAULT_VERSION, help="the single route of a table that has no file yet"
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("show", help="print the table as JSON")
    p = sub.add_parser("set-weights", help="e.g. graphsage graphsage:v1=90 graphsage:v2=10")
    p.add_argument("model")
    p.add_argument("weights", nargs="+", metavar="VERSION=WEIGHT")
    parser.add_argument(
        "--stats-dir",
        default=os.environ.get("GSAGE_SHADOW_STATS_DIR") or None,
        help="the gateway workers' shadow figures (default: $GSAGE_SHADOW_STATS_DIR, else <file>.shadow)",
    )
    p = sub.add_parser("promote", help="all traffic to one version")
    p.add_argument("model")
    p.add_argument("version")
    p.add_argument(
        "--min-agreement",
        type=_share,
        default=None,
        help="refuse unless the version, as the shadow, agreed on at least this share (0..1)",
    )
    p.add_argument("--min-compared", type=int, default=None, help="... of at least this many compared predictions")
    p = sub.add_parser("rollback", help="restore the routes before the last change")
    p.add_argument("model")
    p = sub.add_parser("set-shadow", help="a version that also scores a share of the model's requests")
    p.add_argument("model")
    p.add_argument("version")
    p.add_argument("--share", type=_share, default=1.0, help="share of the answered requests (0..1, default 1)")
    p = sub.add_parser("clear-shadow", help="end the model's shadow")
    p.add_argument("model")
    sub.add_parser("shadow", help="print the shadow figures of every (primary, shadow) pair as JSON")
    args = parser.parse_args(argv)

    if args.cmd not in ("show", "shadow") and not args.file:
        print("error: --file (or GSAGE_ROUTING_FILE) is required to change routing", file=sys.stderr)
        return 2
    directory = stats_dir(args.stats_dir or "", args.file or "")
    try:
        table = RoutingTable(args.file, default_version=args.default_version)
        if args.cmd == "show":
            print(json.dumps(table.to_json(), indent=2))
        elif args.cmd == "shadow":
            print(json.dumps(_shadow_report(table, directory), indent=2))
        elif args.cmd == "set-weights":
            table.set_weights(args.model, _parse_assignments(args.model, args.weights))
            _print_routes(table, args.model)
        elif args.cmd == "promote":
            _check_promotion(table, args.model, args.version, args, directory)
            table.promote(args.model, args.version)
            _print_routes(table, args.model)
        elif args.cmd == "set-shadow":
            table.set_shadow(args.model, args.version, args.share)
            _print_routes(table, args.model)
        elif args.cmd == "clear-shadow":
            table.clear_shadow(args.model)
            _print_routes(table, args.model)
        else:
            table.rollback(args.model)
            _print_routes(table, args.model)
    except (OSError, RoutingError, PromotionRefused) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    sys.exit(main())
