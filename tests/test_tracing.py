"""One request (over HTTP, then over gRPC) followed across the three services: the split app with
``GSAGE_TRACING`` exporting to an OTLP/HTTP receiver on loopback (this test's), the client's
``X-Request-Id`` answered back and found on a span of every service, all of them in one trace,
each hop's span a child of its caller's."""

from __future__ import annotations

import http.server
import threading
import time
import uuid
from typing import ClassVar

import httpx
import pytest

from common import request_context
from harness.app import SplitApp, running
from harness.ports import free_port
from services.grpc_client import build_request, channel
from services.grpc_client import pb_grpc as stubs
from tests.conftest import private_store

SERVICES = {"Gateway", "FeatureRunner", "GraphSAGERunner"}


def test_a_request_id_is_adopted_when_plain_and_made_otherwise():
    assert request_context.adopt("req-1.a:b") == "req-1.a:b" == request_context.current()
    assert request_context.outgoing() == {"X-Request-Id": "req-1.a:b"}
    for bad in (None, "", "x" * 65, "two words", "a\r\nb"):
        made = request_context.adopt(bad)
        assert made != bad and len(made) == 32 and request_context.current() == made
        assert uuid.UUID(hex=made).version == 4 and uuid.UUID(hex=made).variant == uuid.RFC_4122


def test_a_merged_batch_is_a_span_that_links_every_member_and_each_member_leads_to_it(monkeypatch):
    """Three requests' items merged into one call (the batchers): the call runs in a ``batch``
    span in the first request's trace, naming all three ids and linking to each one's span; the
    other two spans record which span served them."""
    import asyncio

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from common.batching import AdaptiveBatcher
    from common.bento import tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "tracer", provider.get_tracer)
    monkeypatch.setattr(request_context, "_tracing", {"on": True})
    outgoing: list[dict] = []

    async def handler(items: list) -> list:
        outgoing.append(request_context.outgoing())
        return items

    async def main() -> None:
        batcher = AdaptiveBatcher(handler, max_batch_size=8, max_delay_s=0.01)

        async def request(request_id: str) -> None:
            with provider.get_tracer("test").start_as_current_span(f"request {request_id}"):
                request_context.adopt(request_id)
                await batcher.submit(request_id)

        await asyncio.gather(*(request(f"r{i}") for i in range(3)))

    asyncio.run(main())
    spans = {s.name: s for s in exporter.get_finished_spans()}
    batch, members = spans["batch"], [spans[f"request r{i}"] for i in range(3)]
    assert batch.parent.span_id == members[0].context.span_id  # in the first request's trace
    assert list(batch.attributes["request.ids"]) == ["r0", "r1", "r2"] and batch.attributes["batch.size"] == 3
    assert [link.context.span_id for link in batch.links] == [m.context.span_id for m in members]
    for member in members[1:]:
        (event,) = member.events
        assert event.name == "merged into batch"
        assert event.attributes["batch.span_id"] == format(batch.context.span_id, "016x")
    # The call the batch makes carries the batch span as its parent, and the first request's id.
    (headers,) = outgoing
    assert headers["X-Request-Id"] == "r0" and format(batch.context.span_id, "016x") in headers["traceparent"]


class _Receiver(http.server.BaseHTTPRequestHandler):
    spans: ClassVar[list[dict]] = []

    def do_POST(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    _Receiver.spans.append(
                        {
                            "service": resource.get("service.name", ""),
                            "name": span.name,
                            "trace": span.trace_id.hex(),
                            "id": span.span_id.hex(),
                            "parent": span.parent_span_id.hex(),
                            "attributes": {a.key: a.value.string_value for a in span.attributes},
                        }
                    )
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: object) -> None:
        return None


@pytest.mark.integration
def test_one_request_is_one_trace_across_the_three_services(demo_store, tmp_path):
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {
        "GSAGE_MODEL_TAGS": demo_store.v1,
        "GSAGE_TRACING": "true",
        "GSAGE_TRACING_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}/v1/traces",
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # export within 0.1 s, not 5 s
        "GSAGE_GRAPH_LOG_DIR": str(tmp_path / "log"),
        "GSAGE_GRPC_PORT": str(free_port()),
    }
    try:
        with running(SplitApp(private_store(demo_store, tmp_path), env, log_dir=str(tmp_path))) as app:
            answer = httpx.post(
                app.gateway.url + "/predict",
                json={"node_ids": [3, 5], "seed": 1},
                headers={"X-Request-Id": "trace-me-1"},
                timeout=30,
            )
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-request-id"] == "trace-me-1"
            deadline = time.monotonic() + 20
            tagged: list[dict] = []
            while time.monotonic() < deadline:
                tagged = [s for s in _Receiver.spans if s["attributes"].get("request.id") == "trace-me-1"]
                if {s["service"] for s in tagged} >= SERVICES:
                    break
                time.sleep(0.2)
            assert {s["service"] for s in tagged} >= SERVICES, (tagged, _Receiver.spans[:20])
            traces = {s["trace"] for s in tagged}
            assert len(traces) == 1, tagged
            trace = [s for s in _Receiver.spans if s["trace"] in traces]
            by_id = {s["id"]: s for s in trace}

            def root_service(span: dict) -> str:
                while span["parent"] in by_id:
                    span = by_id[span["parent"]]
                return span["service"]

            # Every service's spans hang under the gateway's request span: hop by hop, one tree.
            assert {root_service(s) for s in trace} == {"Gateway"}, trace

            # The same over gRPC: the id in the trailers, the three services in one trace again.
            with channel(f"127.0.0.1:{env['GSAGE_GRPC_PORT']}") as ch:
                _, call = stubs.GraphSAGEStub(ch).Predict.with_call(
                    build_request([3, 5], seed=1), metadata=[("x-request-id", "trace-me-grpc")], timeout=30
                )
            assert ("x-request-id", "trace-me-grpc") in list(call.trailing_metadata())
            grpc_tagged: list[dict] = []
            while time.monotonic() < deadline + 20:
                grpc_tagged = [s for s in _Receiver.spans if s["attributes"].get("request.id") == "trace-me-grpc"]
                if {s["service"] for s in grpc_tagged} >= SERVICES:
                    break
                time.sleep(0.2)
            assert {s["service"] for s in grpc_tagged} >= SERVICES, grpc_tagged
            assert len({s["trace"] for s in grpc_tagged}) == 1, grpc_tagged
    finally:
        server.shutdown()
