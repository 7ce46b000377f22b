"""The suite's scenarios, as data: each one defined once, here.

The runner runs them (``Suite.run_scenario``) and records each as a row of the results JSON
whose ``name`` is ``Scenario.name``; the report finds the rows it renders and judges by the
same objects (``s.get(SINGLE_C1.name)``), never by a name spelled out again. What is judged on
which scenarios, and against which bounds, is in ``bench/suite/targets.py``.

A scenario's load comes from its fields: ``concurrency`` workers back to back (closed loop), or
Poisson arrivals at ``open_loop`` times the req/s that ``OPEN_LOOP_OF`` measured in the same run;
``nodes`` target ids per request drawn from ``dist``; for ``duration`` seconds of the run's
budget (``runner.Budget``), times ``share``. Rows carry the tags ``graph``, ``redis``, ``cache``
and ``group`` (those not None).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

# Graphs: the tag of a row, and the key of ``results["memory"]``.
G100K = "100k/1M"
G1M = "1M/10M"

# Topologies: the ``procs.Topology`` names a scenario runs against (a row's ``topology``).
APP = "app"  # the composed app, L2 on a Redis of the suite's own
APP_NOREDIS = "app-noredis"  # the same without Redis (L1, then the memory-mapped snapshot)
APP_DELAY = "app-delay"  # the what-if: the model runner's batching window the other way (+ "<ms>")
APP_1M = "app-1m"  # the composed app on the 1M/10M graph
TRIVIAL_3 = "B1"  # three services that do no work (baseline B1)
TRIVIAL_1 = "B2"  # one service that does no work (baseline B2)
COLOCATED = "app-colocated"  # the composed app's three services in one process (the single-machine choice)
ONE_PROCESS = "B5"  # the app's work in one process behind uvicorn and one route (baseline B5)


@dataclass(frozen=True)
class Scenario:
    name: str
    topology: str = APP
    dist: str = "zipf"
    nodes: int = 1
    concurrency: int = 1
    duration: str = "short"  # a ``runner.Budget`` attribute
    share: float = 1.0  # of that duration
    graph: str = G100K
    redis: str | None = "on"
    cache: str | None = "warm"
    group: str | None = None
    seed: int = 0
    record: bool = True  # False: a warm-up, not a row of the results
    quick: bool = True  # run by ``--quick`` too
    open_loop: float = 0.0  # > 0: open loop at this fraction of OPEN_LOOP_OF's measured req/s

    def tags(self) -> dict[str, Any]:
        return {
            k: v
            for k, v in (("graph", self.graph), ("redis", self.redis), ("cache", self.cache), ("group", self.group))
            if v is not None
        }

    @property
    def paired_name(self) -> str:
        """The row of this scenario's interleaved windows (``Suite.paired``)."""
        return paired_name(self.name)

    @property
    def profiled_name(self) -> str:
        return f"{self.name} (profiled)"

    @property
    def what_if_prefix(self) -> str:
        """Every batching-window what-if of this scenario starts so (``batch_delay``)."""
        return f"{self.name} (batch delay"


def paired_name(side: str) -> str:
    return f"{side} (paired)"


def baseline_scenario(name: str, topology: str, **kw: Any) -> Scenario:
    """A trivial-service baseline: tagged with its graph and group only (no Redis, no cache)."""
    return Scenario(name, topology, redis=None, cache=None, group=topology, **kw)


def noredis(name: str, **kw: Any) -> Scenario:
    return Scenario(name, APP_NOREDIS, redis="off", **kw)


def one_m(name: str, **kw: Any) -> Scenario:
    return Scenario(name, APP_1M, graph=G1M, group="1m", quick=False, **kw)


def batch_delay(sc: Scenario, delay_ms: float) -> Scenario:
    """``sc`` on the app whose model runner batches with ``delay_ms`` instead of its default."""
    return replace(
        sc,
        name=f"{sc.what_if_prefix} {delay_ms:g} ms)",
        topology=f"{APP_DELAY}{delay_ms:g}",
        group="batch-delay" if sc.record else None,
        quick=False,
    )


def open_loop_name(fraction: float) -> str:
    return f"open loop {int(fraction * 100)}% of c={OPEN_LOOP_C} max"


# -- the 100k/1M phase, in the order the runner runs them ------------------------------------------

# Cold: fresh L1, empty Redis (the start-up call touched a single node).
COLD_REDIS = Scenario("cold zipf c=1 (redis)", cache="cold", group="cold", duration="cold", seed=11)
COLD_NOREDIS = noredis("cold zipf c=1 (no redis)", cache="cold", group="cold", duration="cold", seed=11)
COLD = (COLD_REDIS, COLD_NOREDIS)

# 32 targets per request: below GSAGE_SCAN_MIN_TARGETS (64), so these fill L1 and Redis as
# latency-path traffic does; bigger batches are scans and would warm nothing.
WARMUP = (
    Scenario("warm-up 32-node (redis)", nodes=32, concurrency=2, duration="warmup", share=0.6, seed=22, record=False),
    Scenario("warm-up single (redis)", concurrency=8, duration="warmup", share=0.4, seed=21, record=False),
    noredis("warm-up (no redis)", concurrency=8, duration="warmup", share=0.4, seed=21, record=False),
)

SINGLE_C1 = Scenario("single zipf c=1", group="single", duration="single")
SINGLE_C8 = Scenario("single zipf c=8", concurrency=8, group="single")
SINGLE_C32 = Scenario("single zipf c=32", concurrency=32, group="single", duration="single")
UNIFORM_C1 = Scenario("single uniform c=1", dist="uniform", group="uniform")
UNIFORM_C32 = Scenario("single uniform c=32", dist="uniform", concurrency=32, group="uniform")
WARM = (SINGLE_C1, SINGLE_C8, SINGLE_C32, UNIFORM_C1, UNIFORM_C32)

OPEN_LOOP_OF = SINGLE_C32  # the open-loop rates are fractions of its req/s in the same run
OPEN_LOOP_C = OPEN_LOOP_OF.concurrency
OPEN_50 = Scenario(open_loop_name(0.5), group="open", duration="open", open_loop=0.5)
OPEN_80 = Scenario(open_loop_name(0.8), group="open", duration="open", open_loop=0.8, quick=False)
OPEN = (OPEN_50, OPEN_80)

# The co-located deployment (the gateway started with no ``--depends`` runs both runners in its own
# worker; same Redis, same settings), warmed as the split app is, then judged by T1 and T2 and in
# bulk by T3. B5: the same work in one process, warmed the same way (its L1 is its own).
COLOCATED_WARMUP = (
    Scenario(
        "co-located warm-up 32-node",
        COLOCATED,
        nodes=32,
        concurrency=2,
        duration="warmup",
        share=0.6,
        seed=22,
        record=False,
    ),
    Scenario(
        "co-located warm-up single", COLOCATED, concurrency=8, duration="warmup", share=0.4, seed=21, record=False
    ),
    Scenario(
        "B5 warm-up 32-node", ONE_PROCESS, nodes=32, concurrency=2, duration="warmup", share=0.6, seed=22, record=False
    ),
    Scenario("B5 warm-up single", ONE_PROCESS, concurrency=8, duration="warmup", share=0.4, seed=21, record=False),
)
COLOCATED_C1 = Scenario("co-located single zipf c=1", COLOCATED, group="colocated", duration="single")
COLOCATED_C32 = Scenario("co-located single zipf c=32", COLOCATED, concurrency=32, group="colocated", duration="single")
COLOCATED_WARM = (COLOCATED_C1, COLOCATED_C32)

# What-if (full runs): GSAGE_MAX_BATCH_DELAY_MS the other way from its default, on own services.
WHAT_IF_WARMUP = Scenario("warm-up", concurrency=8, duration="warmup", share=0.3, seed=21, record=False)
WHAT_IF = tuple(replace(sc, duration="short") for sc in (SINGLE_C1, SINGLE_C32))  # as ``batch_delay(sc, ms)``

B1_C1 = baseline_scenario("B1 single c=1", TRIVIAL_3)
B1_C8 = baseline_scenario("B1 single c=8", TRIVIAL_3, concurrency=8)
B1_C32 = baseline_scenario("B1 single c=32", TRIVIAL_3, concurrency=32)
B1_BULK_256 = baseline_scenario("B1 bulk 256 c=1", TRIVIAL_3, nodes=256)
B2_C1 = baseline_scenario("B2 single c=1", TRIVIAL_1)
B2_C8 = baseline_scenario("B2 single c=8", TRIVIAL_1, concurrency=8)
B2_C32 = baseline_scenario("B2 single c=32", TRIVIAL_1, concurrency=32)
TRIVIAL = (B1_C1, B1_C8, B1_C32, B1_BULK_256, B2_C1, B2_C8, B2_C32)
# B5 is the app's own work: warm (its L1 filled by COLOCATED_WARMUP), on the suite's Redis.
B5_C1 = Scenario("B5 single zipf c=1", ONE_PROCESS, group="B5", duration="single")
B5_C32 = Scenario("B5 single zipf c=32", ONE_PROCESS, concurrency=32, group="B5")
B5_BULK_256_C4 = Scenario("B5 bulk 256 zipf c=4", ONE_PROCESS, nodes=256, concurrency=4, group="B5", duration="bulk")
ONE_PROCESS_WARM = (B5_C1, B5_C32)

NOREDIS_C1 = noredis("single zipf c=1 (no redis)", group="noredis")
NOREDIS_C32 = noredis("single zipf c=32 (no redis)", concurrency=32, group="noredis")
NOREDIS_UNIFORM_C1 = noredis("single uniform c=1 (no redis)", dist="uniform", group="noredis")
NOREDIS_BULK_256 = noredis("bulk 256 zipf c=1 (no redis)", nodes=256, group="noredis", duration="bulk")
NOREDIS = (NOREDIS_C1, NOREDIS_C32, NOREDIS_UNIFORM_C1, NOREDIS_BULK_256)

# The warmest Zipf window (T4), run before the bulk scenarios: their big L2 reads can trip the
# L2 circuit (read deadline GSAGE_L2_TIMEOUT_S), which skips Redis for a while afterwards.
END_OF_PHASE = Scenario("single zipf c=1 (end of phase)", group="single", seed=5)

BULK_64 = Scenario("bulk 64 zipf c=1", nodes=64, group="bulk", duration="bulk")
BULK_256 = Scenario("bulk 256 zipf c=1", nodes=256, group="bulk", duration="bulk")
BULK_1024 = Scenario("bulk 1024 zipf c=1", nodes=1024, group="bulk", duration="bulk")
BULK_256_C4 = Scenario("bulk 256 zipf c=4", nodes=256, concurrency=4, group="bulk", duration="bulk")
# Saturation: the gateway merges concurrent bulk requests (up to GSAGE_MAX_NODES_PER_REQUEST
# per FeatureRunner call) and all three services stay busy.
BULK_256_C16 = Scenario("bulk 256 zipf c=16", nodes=256, concurrency=16, group="bulk", duration="bulk")
COLOCATED_BULK_256_C4 = Scenario(
    "co-located bulk 256 zipf c=4", COLOCATED, nodes=256, concurrency=4, group="bulk", duration="bulk"
)
BULK = (BULK_64, BULK_256, BULK_1024, BULK_256_C4, BULK_256_C16, COLOCATED_BULK_256_C4, B5_BULK_256_C4)

# -- the 1M/10M phase (full runs) ------------------------------------------------------------------

ONE_M_COLD = one_m("1M cold zipf c=1", cache="cold", duration="cold", seed=11)
ONE_M_C1 = one_m("1M single zipf c=1", duration="single")
ONE_M_C32 = one_m("1M single zipf c=32", concurrency=32, duration="single")
ONE_M_UNIFORM_C1 = one_m("1M single uniform c=1", dist="uniform")
ONE_M_BULK_256 = one_m("1M bulk 256 zipf c=1", nodes=256, duration="bulk")
ONE_M_END = one_m("1M single zipf c=1 (end of phase)", seed=5)
ONE_M = (
    ONE_M_COLD,
    one_m("1M warm-up", concurrency=8, duration="warmup", seed=21, record=False),
    ONE_M_C1,
    ONE_M_C32,
    ONE_M_UNIFORM_C1,
    ONE_M_BULK_256,
    ONE_M_END,
)


# -- profiles (py-spy on one service while a scenario's load runs) -----------------------------------


@dataclass(frozen=True)
class Profile:
    key: str  # its entry in ``results["profiles"]``
    service: str  # "gateway" | "feature" | "model"
    scenario: Scenario
    quick: bool = False


PROFILE_GATEWAY_C32 = Profile("gateway_c32", "gateway", SINGLE_C32, quick=True)
PROFILE_FEATURE_C32 = Profile("feature_c32", "feature", SINGLE_C32)
# T1's work: what the two runners spend a single-node request on, beyond B1's.
PROFILE_FEATURE_C1 = Profile("feature_c1", "feature", SINGLE_C1)
PROFILE_MODEL_C1 = Profile("model_c1", "model", SINGLE_C1)
# T1's layers: the co-located process at c=1 (its samples charged to layers, ``bench.suite.layers``).
PROFILE_COLOCATED_C1 = Profile("colocated_c1", "gateway", COLOCATED_C1, quick=True)
PROFILES_WARM = (PROFILE_GATEWAY_C32, PROFILE_FEATURE_C32, PROFILE_FEATURE_C1, PROFILE_MODEL_C1)
# T3's scenario at saturation, each service in turn (the quick run profiles the FeatureRunner only).
PROFILES_BULK = tuple(
    Profile(f"{svc}_bulk256", svc, BULK_256_C16, quick=svc == "feature") for svc in ("gateway", "feature", "model")
)


def recorded(scenarios: tuple[Scenario, ...]) -> tuple[Scenario, ...]:
    return tuple(sc for sc in scenarios if sc.record)


# Every row a run can record under a fixed name, in run order (the what-ifs and paired rows are
# named after these).
ALL = recorded(
    COLD + WARM + OPEN + COLOCATED_WARM + ONE_PROCESS_WARM + TRIVIAL + NOREDIS + (END_OF_PHASE,) + BULK + ONE_M
)
BY_NAME = {sc.name: sc for sc in ALL}
assert len(BY_NAME) == len(ALL), "scenario names must be unique"
