"""harness.app.SplitApp: a start that fails halfway stops what it had started (no orphaned
service keeps a port or a model store busy for the tests after it)."""

from __future__ import annotations

import pytest

from harness.app import SplitApp


class FakeService:
    def __init__(self, name: str, events: list[str], fails: bool = False) -> None:
        self.name, self.events, self.fails = name, events, fails

    def start(self) -> None:
        self.events.append(f"start {self.name}")
        if self.fails:
            raise RuntimeError(f"{self.name} did not become ready")

    def stop(self) -> None:
        self.events.append(f"stop {self.name}")


@pytest.mark.parametrize("failing", ["GraphSAGERunner", "FeatureRunner", "Gateway"])
def test_a_start_that_fails_stops_what_it_started(tmp_path, failing):
    app = SplitApp(str(tmp_path))
    events: list[str] = []
    app.model, app.feature, app.gateway = (
        FakeService(n, events, fails=n == failing) for n in ("GraphSAGERunner", "FeatureRunner", "Gateway")
    )
    with pytest.raises(RuntimeError, match=failing):
        app.start()
    order = ["GraphSAGERunner", "FeatureRunner", "Gateway"]
    started = order[: order.index(failing) + 1]
    assert [e for e in events if e.startswith("start")] == [f"start {n}" for n in started]
    # Every service is stopped (stopping one that never started is a no-op for a real Service).
    assert {e for e in events if e.startswith("stop")} == {f"stop {n}" for n in order}
