"""services.metrics: the gateway's Prometheus observer."""

from __future__ import annotations

from common.metrics import labelled
from services.metrics import GatewayPrometheus, gateway_metrics


def test_the_breaker_gauges_are_written_when_a_state_changes(monkeypatch):
    """The core reports both breakers after every request; a gauge is written on the first
    report and whenever a state differs from the one it holds, so it always shows the last one."""
    m = gateway_metrics()
    writes = []
    for dependency in ("feature-runner", "model-runner"):
        child = labelled(m.breaker, dependency)
        monkeypatch.setattr(child, "set", lambda value, d=dependency: writes.append((d, value)))
    observer = GatewayPrometheus()
    for states in ((0, 0), (0, 0), (2, 0), (2, 0), (2, 1), (0, 0), (0, 0)):
        observer.breakers(*states)
    pairs = [(0, 0), (2, 0), (2, 1), (0, 0)]
    assert writes == [w for f, md in pairs for w in (("feature-runner", f), ("model-runner", md))]
