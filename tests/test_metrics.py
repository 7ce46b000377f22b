"""labelled(): one child per label values, the same series labels() would give."""

from prometheus_client import CollectorRegistry, Counter

from common.metrics import labelled


def test_labelled_reuses_one_child_per_label_values():
    registry = CollectorRegistry()
    requests = Counter("t_requests", "test", labelnames=["model", "outcome"], registry=registry)
    ok = labelled(requests, "m:1", "ok")
    assert labelled(requests, "m:1", "ok") is ok
    assert labelled(requests, "m:1", "503") is not ok
    ok.inc()
    labelled(requests, "m:1", "ok").inc(2)
    labelled(requests, "m:1", "503").inc()
    assert registry.get_sample_value("t_requests_total", {"model": "m:1", "outcome": "ok"}) == 3
    assert registry.get_sample_value("t_requests_total", {"model": "m:1", "outcome": "503"}) == 1
