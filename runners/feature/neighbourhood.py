"""The FeatureRunner's core, without BentoML: node ids -> sampled neighbourhood -> FeatureTensor.

Concurrent requests arrive here merged (``common.batching``): one vectorised sampling call per
fanout, one feature fetch for the distinct nodes of the whole batch (a node wanted by several
requests is fetched once), then one deduplicated FeatureTensor per request.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from common.errors import KindOfError
from common.feature_runner_api import random_seed
from common.feature_tensor import FeatureTensor
from common.settings import TRANSPORT_DTYPES
from runners.feature.cache.tiered import FetchStats, TieredFeatureStore
from runners.feature.graph import LiveGraph
from runners.feature.narrowing import to_dtype
from runners.feature.sampling import sample_tree
from runners.feature.snapshot import GraphSnapshot
from runners.feature.tree_layout import PremeanTree, compact


class InvalidRequest(KindOfError):
    """Bad input from the caller."""

    status_code = 400


class TooManyNodes(InvalidRequest):
    """More node ids than one call may carry (a merged call over the FeatureRunner's limit)."""

    status_code = 422


class NodeNotFound(InvalidRequest):
    """Node ids within the graph's id range that are not nodes (removed, or never added)."""

    status_code = 404


@dataclasses.dataclass(frozen=True)
class FeatureRequest:
    node_ids: np.ndarray
    fanout: tuple[int, ...]
    seed: int
    dtype: str = "float32"
    seeds: np.ndarray | None = None  # one per node: several gateway requests merged into one
    premean: bool = False  # the premean layout (common.feature_tensor): the last hop as its means


@dataclasses.dataclass
class BatchTimings:
    sample_s: float = 0.0
    fetch: FetchStats = dataclasses.field(default_factory=FetchStats)
    assemble_s: float = 0.0
    targets: int = 0
    distinct_nodes: int = 0


class NeighbourhoodBuilder:
    def __init__(
        self,
        graph: LiveGraph | GraphSnapshot,
        store: TieredFeatureStore,
        max_fanout: Sequence[int],
        max_nodes: int = 1024,
        scan_min_targets: int = 0,
    ) -> None:
        """``graph``: the live graph served (a snapshot alone: one with no updates).
        ``scan_min_targets``: batches with at least this many targets fetch as a scan
        (``TieredFeatureStore``: L1 and origin only, no cache fill); 0: never."""
        self.graph = graph if isinstance(graph, LiveGraph) else LiveGraph(graph)
        snapshot = self.graph.base
        self.scan_min_targets = scan_min_targets
        self.store = store
        self.max_fanout = tuple(int(k) for k in max_fanout)
        self.max_nodes = max_nodes
        self.last = BatchTimings()
        # Compile (or load) the kernels for this snapshot's array types now, not in the first
        # request: a read-only memory map is a numba type of its own (else seconds of compiling).
        compact(sample_tree(snapshot.indptr, snapshot.indices, np.zeros(1, np.int64), self.max_fanout, seed=0))
        if len(self.max_fanout) >= 2:
            tree = PremeanTree.sample(
                snapshot.indptr, snapshot.indices, np.zeros(1, np.int64), self.max_fanout, np.zeros(1, np.int64)
            )
            tree.tensor_parts(np.zeros((tree.unique.size, snapshot.feature_dim), np.float32))
        # Likewise ONNX Runtime's Cast session for float16 rows (runners/feature/narrowing.py):
        # importing onnx and onnxruntime in the first float16 request made it slow enough, on a slow
        # machine, that its model call missed its deadline (a 503 in CI).
        to_dtype(np.zeros((1, snapshot.feature_dim), np.float32), "float16")

    def validate(
        self,
        node_ids: object,
        fanout: Sequence[int] | None = None,
        seed: int | None = None,
        dtype: str = "float32",
        seeds: Sequence[int] | np.ndarray | None = None,
        premean: bool = False,
    ) -> FeatureRequest:
        ids = _as_ids(node_ids)
        if ids.size == 0:
            raise InvalidRequest("node_ids is empty")
        if ids.size > self.max_nodes:
            raise TooManyNodes(f"{ids.size} node ids in one request; the limit is {self.max_nodes}")
        capacity = self.graph.capacity
        bad = ids[(ids < 0) | (ids >= capacity)]
        if bad.size:
            raise InvalidRequest(f"unknown node ids {bad[:5].tolist()} (node ids are 0..{capacity - 1})")
        absent = ids[~self.graph.contains(ids)]
        if absent.size:
            raise NodeNotFound(f"node ids {absent[:5].tolist()} are not in the graph (removed, or never added)")
        if fanout is not None and not isinstance(fanout, (list, tuple, np.ndarray)):
            raise InvalidRequest(f"fanout must be a list of {len(self.max_fanout)} integers")
        fan = self.max_fanout if fanout is None else tuple(fanout)
        if len(fan) != len(self.max_fanout) or any(
            not isinstance(k, (int, np.integer)) or isinstance(k, bool) for k in fan
        ):
            raise InvalidRequest(f"fanout must be {len(self.max_fanout)} integers, got {list(fan)}")
        if any(k < 1 or k > m for k, m in zip(fan, self.max_fanout)):
            raise InvalidRequest(f"fanout {list(fan)} outside 1..{list(self.max_fanout)} per hop")
        if dtype not in TRANSPORT_DTYPES:
            raise InvalidRequest(f"dtype must be one of {TRANSPORT_DTYPES}")
        if seed is not None and not _valid_seed(seed):
            raise InvalidRequest("seed must be an integer in [0, 2^63)")
        per_node = None
        if isinstance(seeds, np.ndarray):  # int64 from a binary request: all in range but the sign
            if seeds.dtype != np.int64 or seeds.shape != ids.shape or (seeds < 0).any():
                raise InvalidRequest("seeds must hold one integer in [0, 2^63) per node id")
            per_node = seeds
        elif seeds is not None:
            if not isinstance(seeds, (list, tuple)) or len(seeds) != ids.size or not all(map(_valid_seed, seeds)):
                raise InvalidRequest("seeds must hold one integer in [0, 2^63) per node id")
            per_node = np.asarray(seeds, dtype=np.int64)
        return FeatureRequest(
            ids,
            tuple(int(k) for k in fan),
            random_seed() if seed is None else int(seed),
            dtype,
            per_node,
            bool(premean) and len(fan) >= 2,
        )  # premean needs 2+ hops

    async def build(self, requests: list[FeatureRequest]) -> list[FeatureTensor]:
        """One batch over the graph as it is now: the caller keeps updates out until it returns."""
        started = time.perf_counter()
        base, overlay = self.graph.base, self.graph.overlay
        trees: list[list[np.ndarray]] = [[] for _ in requests]
        by_fanout: dict[tuple[int, ...], list[int]] = defaultdict(list)
        premean_trees: dict[int, PremeanTree] = {}
        for i, r in enumerate(requests):
            if r.premean:  # sampled on its own: the last hop only for its distinct entries
                premean_tree = PremeanTree.sample(
                    base.indptr, base.indices, r.node_ids, r.fanout, _seeds_of(r), overlay
                )
                if premean_tree.last_rows.size:
                    premean_trees[i] = premean_tree
                    continue
                # No entry (no target has a neighbour): nothing to premean, and the model's
                # premean graph needs one; the level layout carries the same tree.
            by_fanout[r.fanout].append(i)
        for fan, members in by_fanout.items():
            targets = np.concatenate([requests[i].node_ids for i in members])
            seeds = np.concatenate([_seeds_of(requests[i]) for i in members])
            tree = sample_tree(base.indptr, base.indices, targets, fan, seed=seeds, overlay=overlay)
            lo = 0
            for i in members:
                hi = lo + requests[i].node_ids.size
                trees[i] = [layer[lo:hi] for layer in tree]
                lo = hi
        sampled = time.perf_counter()
        # Compact first: a request's distinct ids are its rows. A batch of one (every bulk request)
        # then fetches exactly those rows and uses them as they come, without a second unique over
        # the whole tree and a gather (this step is in the "assemble" stage of python -m
        # bench.suite's stage breakdown; python bench/bench_premean.py times build per batch size).
        compacted = [
            (premean_trees[i].unique, premean_trees[i]) if i in premean_trees else compact(trees[i])
            for i in range(len(requests))
        ]
        if len(compacted) == 1:
            all_ids = compacted[0][0]
        else:
            all_ids = np.unique(np.concatenate([unique for unique, _ in compacted]))
        compacted_s = time.perf_counter() - sampled
        n_targets = sum(r.node_ids.size for r in requests)
        scan = 0 < self.scan_min_targets <= n_targets
        rows, fetch_stats = await self.store.fetch_with_stats(all_ids, scan=scan)
        fetched = time.perf_counter()
        out = []
        for r, (unique, index) in zip(requests, compacted):
            feats = rows if len(compacted) == 1 else rows[np.searchsorted(all_ids, unique)]
            if isinstance(index, PremeanTree):
                kept, inner, last_rows, last_mean = index.tensor_parts(feats)
                out.append(
                    FeatureTensor(
                        to_dtype(kept, r.dtype),
                        inner,
                        base.tag,
                        last_rows,
                        to_dtype(last_mean, r.dtype),
                        r.fanout[-1],
                        unique[: index.kept],
                    )
                )
            else:
                out.append(FeatureTensor(to_dtype(feats, r.dtype), index, base.tag, node_ids=unique))
        assemble_s = compacted_s + (time.perf_counter() - fetched)
        self.last = BatchTimings(sampled - started, fetch_stats, assemble_s, n_targets, int(all_ids.size))
        return out


def _valid_seed(seed: object) -> bool:
    return isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and bool(0 <= seed < 2**63)


def _seeds_of(request: FeatureRequest) -> np.ndarray:
    if request.seeds is not None:
        return request.seeds
    return np.full(request.node_ids.size, request.seed, np.int64)


def _as_ids(node_ids: object) -> np.ndarray:
    if isinstance(node_ids, np.ndarray):
        if node_ids.dtype.kind not in "iu":
            raise InvalidRequest("node_ids must be integers")
        return node_ids.astype(np.int64).reshape(-1)
    if not isinstance(node_ids, (list, tuple)):
        raise InvalidRequest("node_ids must be a list of integers")
    if any(not isinstance(v, int) or isinstance(v, bool) for v in node_ids):
        raise InvalidRequest("node_ids must be a list of integers")
    try:
        return np.asarray(node_ids, dtype=np.int64)
    except OverflowError as exc:
        raise InvalidRequest("node id out of range") from exc
