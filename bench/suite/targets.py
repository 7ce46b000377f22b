"""The suite's baselines and targets, as data: each bound defined once, here.

The report (``bench/suite/report.py``) judges every target by its ``checks``: it measures each
check's ``metric`` on the row the target is judged on (``Check.value``), and the verdict and the
"missed by" column come from ``Target.judge``. Changing a bound here changes the verdict, the
target's title and the report's lines drawn at it. The runner (``bench/suite/runner.py``) runs the
scenarios named here (``bench/suite/scenarios.py``) and the interleaved windows of each target
that has a ``pairing``. docs/performance.md explains what each target is for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bench.suite import scenarios as sc
from bench.suite.scenarios import Scenario


@dataclass(frozen=True)
class Variant:
    """One way an in-process baseline ran; ``key``: its entry in the output of ``bench.suite.inproc``
    (``results["baselines"]["inproc"]``)."""

    key: str
    label: str  # as "the best of" names it
    table: str  # its row in the report's in-process table ({idle_ms}: the idle gap)


@dataclass(frozen=True)
class Baseline:
    id: str
    label: str
    description: str
    scenarios: tuple[Scenario, ...] = ()  # B1, B2: trivial services measured as scenarios of the run
    variants: tuple[Variant, ...] = ()  # B3, B4: in process; the baseline is the fastest at 256 nodes


B1 = Baseline(
    "B1",
    "trivial 3 services",
    "Gateway -> FeatureRunner -> GraphSAGERunner as BentoML services that "
    "do no work, as separate processes like the app",
    (sc.B1_C1, sc.B1_C8, sc.B1_C32, sc.B1_BULK_256),
)
B2 = Baseline("B2", "trivial 1 service", "one BentoML service that does no work", (sc.B2_C1, sc.B2_C8, sc.B2_C32))
B3_WITH_L1 = Variant("b3", "with L1", "B3 sampler + ONNX")
B3_NO_L1 = Variant("b3_no_l1", "without L1", "B3 without L1 (rows from the mmap)")
B3_CALLERS = Variant("b3_callers", "concurrent callers, without L1", "B3 without L1, concurrent callers")
# B3 at 1 node with an idle gap before each call: not a contender for B3's figure, the floor of
# a service at c=1 that waits between requests (T1's "what limits it").
B3_IDLE = Variant("b3_idle", "after an idle gap before each call", "B3 after {idle_ms:g} ms idle before each call")
B4_ONE_THREAD = Variant("b4", "1 thread", "B4 PyG, 1 thread")
B4_ALL_THREADS = Variant("b4_threads_all", "all threads", "B4 PyG, all threads")
B4_CALLERS = Variant("b4_callers", "concurrent callers", "B4 PyG, concurrent callers")
B3 = Baseline(
    "B3",
    "sampler + ONNX in-process",
    "the project's sampler, feature store and ONNX Runtime forward in one process, no HTTP",
    variants=(B3_WITH_L1, B3_NO_L1, B3_CALLERS),
)
B4 = Baseline(
    "B4",
    "PyG in-process",
    "PyG's GraphSAGE on the same sample and weights in one process",
    variants=(B4_ONE_THREAD, B4_ALL_THREADS, B4_CALLERS),
)
B5 = Baseline(
    "B5",
    "one-process server",
    "the app's work (sampler, tiered store, forward) in one process behind uvicorn and one route",
    (sc.B5_C1, sc.B5_C32, sc.B5_BULK_256_C4),
)
BASELINES = (B1, B2, B3, B4, B5)
INPROC_VARIANTS = B3.variants + B4.variants + (B3_IDLE,)


@dataclass(frozen=True)
class Check:
    """``metric`` of the judged row ``op`` ``bound``; with ``vs``, the ratio of the row's
    ``metric`` to the same metric of that baseline's row."""

    label: str  # how the "missed by" column names it
    metric: str  # a field of the judged row ("p99_ms", "req_per_s", ...)
    op: str  # "<=" (at most) or ">=" (at least)
    bound: float
    unit: str = ""
    vs: Baseline | None = None

    def __post_init__(self) -> None:
        if self.op not in ("<=", ">="):
            raise ValueError(f"op must be <= or >=, not {self.op!r}")

    def value(self, row: Mapping, baselines: Mapping[Baseline, Mapping]) -> float | None:
        v = row.get(self.metric)
        if v is None or self.vs is None:
            return v
        base = baselines.get(self.vs, {}).get(self.metric)
        return v / base if base else None

    def passes(self, value: float | None) -> bool:
        """Not measured (None, NaN) is not met."""
        if value is None:
            return False
        return value <= self.bound if self.op == "<=" else value >= self.bound

    def missed_by(self, value: float | None) -> str:
        """How far ``value`` is on the wrong side of the bound; "" when it is not (or not measured)."""
        if value is None or not (value > self.bound if self.op == "<=" else value < self.bound):
            return ""
        if not self.bound:
            return f"{self.label} {value:g} vs {self.bound:g}"
        return (
            f"{self.label} {value:.2f}{self.unit} vs {self.bound:g}{self.unit} ({abs(value / self.bound - 1):.0%} "
            f"{'over' if self.op == '<=' else 'short'})"
        )


@dataclass(frozen=True)
class Pairing:
    """The runner measures the target's first app scenario and ``against`` in alternating windows
    (``Suite.paired``), so that both meet the same background load; the report judges on those
    windows when the run has them."""

    against: Scenario
    seed: int


@dataclass(frozen=True)
class Target:
    id: str
    what: str  # the title; ``{0}``, ``{1}``, ...: the checks' bounds, in order
    checks: tuple[Check, ...]
    app: tuple[Scenario, ...]  # the app's windows it is judged on (see each target below)
    baselines: tuple[Baseline, ...] = ()
    pairing: Pairing | None = None
    reference: str = ""  # a fixed figure shown beside the baselines

    @property
    def title(self) -> str:
        return self.what.format(*(c.bound for c in self.checks))

    def absolute(self, metric: str) -> Check:
        """The check of ``metric`` itself (not of its ratio to a baseline)."""
        return next(c for c in self.checks if c.metric == metric and c.vs is None)

    @property
    def ratio_metric(self) -> str | None:
        """The metric the target compares with a baseline, if it does."""
        return next((c.metric for c in self.checks if c.vs is not None), None)

    def values(self, row: Mapping, baselines: Mapping[Baseline, Mapping] | None = None) -> list[float | None]:
        return [c.value(row, baselines or {}) for c in self.checks]

    def judge(self, values: Sequence[float | None]) -> tuple[bool, str]:
        """(every check met, what missed and by how much)."""
        ok = all(c.passes(v) for c, v in zip(self.checks, values, strict=True))
        return ok, "" if ok else "; ".join(m for c, v in zip(self.checks, values) if (m := c.missed_by(v)))


# T1: the co-located deployment (the single-machine choice) at c=1 against B5, on their interleaved
# windows when the run has both, else their own scenarios; the first ratio (P50) is the one the
# report's pairing note spreads over the windows.
T1 = Target(
    "T1",
    "single node, c=1, co-located: e2e P50 <= {0:g}x B5 P50, P99 <= {1:g}x B5 P99 and <= {2:g} ms",
    (
        Check("P50 ratio", "p50_ms", "<=", 1.2, "x", vs=B5),
        Check("P99 ratio", "p99_ms", "<=", 1.3, "x", vs=B5),
        Check("P99", "p99_ms", "<=", 10.0, " ms"),
    ),
    app=(sc.COLOCATED_C1,),
    baselines=(B5,),
    pairing=Pairing(sc.B5_C1, seed=33),
)
# T2: the co-located deployment at c=32 against B2, interleaved as T1.
T2 = Target(
    "T2",
    "single node, c=32, co-located: req/s >= {0:g}x B2, P99 <= {1:g} ms, zero errors",
    (
        Check("req/s ratio", "req_per_s", ">=", 1.5, "x", vs=B2),
        Check("P99", "p99_ms", "<=", 30.0, " ms"),
        Check("errors", "error_count", "<=", 0),
    ),
    app=(sc.COLOCATED_C32,),
    baselines=(B2,),
    pairing=Pairing(sc.B2_C32, seed=34),
)
# T3: the app's best way to move 256-node requests (split at c=1, 4, 16; co-located at c=4) against
# each monolith's best way to use the cores (B3 with and without L1 and with concurrent callers; B4
# with 1 thread, all threads, concurrent callers).
T3 = Target(
    "T3",
    "bulk 256 nodes: nodes/s >= {0:g}x B3 and >= {1:.1f}x B4",
    (Check("vs B3", "nodes_per_s", ">=", 0.8, "x", vs=B3), Check("vs B4", "nodes_per_s", ">=", 1.0, "x", vs=B4)),
    app=(sc.BULK_256, sc.BULK_256_C4, sc.BULK_256_C16, sc.COLOCATED_BULK_256_C4),
    baselines=(B3, B4),
)
# T4: the warmest Zipf c=1 window (the end of the 100k phase) and the first warm one; the
# retrieval P99 judged is the worse of the two, the hit ratio the warmest window's.
T4 = Target(
    "T4",
    "feature retrieval in the FeatureRunner: P99 <= {0:g} ms warm; L1+L2 hit ratio >= {1:g}% on "
    "Zipf(1.0), L1 = 10% of features",
    (
        Check("retrieval P99 (worse window)", "retrieval_p99_ms", "<=", 1.0, " ms"),
        Check("hit ratio", "hit_pct", ">=", 95.0, "%"),
    ),
    app=(sc.END_OF_PHASE, sc.SINGLE_C1),
    reference="SLO of the design: P99 < 10 ms, hit rate > 90%",
)
# T5: every request of the 1M/10M phase answered, and its c=1 window measured.
T5 = Target("T5", "scale: the 1M/10M graph served", (Check("errors", "error_count", "<=", 0),), app=(sc.ONE_M_C1,))
# T6, T7: the split deployment (each service its own process, as it scales out) at c=1 against the
# three empty hops (B1) and at c=32 against B2, interleaved as T1: what the work adds over the hops,
# and that the hops do not cost the throughput.
T6 = Target(
    "T6",
    "single node, c=1, split: e2e P99 <= {0:g}x B1 P99 and <= {1:g} ms",
    (Check("ratio", "p99_ms", "<=", 1.3, "x", vs=B1), Check("P99", "p99_ms", "<=", 10.0, " ms")),
    app=(sc.SINGLE_C1,),
    baselines=(B1,),
    pairing=Pairing(sc.B1_C1, seed=31),
)
T7 = Target(
    "T7",
    "single node, c=32, split: req/s >= {0:g}x B2, P99 <= {1:g} ms, zero errors",
    (
        Check("req/s ratio", "req_per_s", ">=", 0.6, "x", vs=B2),
        Check("P99", "p99_ms", "<=", 45.0, " ms"),
        Check("errors", "error_count", "<=", 0),
    ),
    app=(sc.SINGLE_C32,),
    baselines=(B2,),
    pairing=Pairing(sc.B2_C32, seed=32),
)
TARGETS = (T1, T2, T3, T4, T5, T6, T7)
