"""An OTLP/HTTP receiver for tests: what a collector would get, decoded with opentelemetry-proto."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    return None if which is None else getattr(value, which)


@dataclass
class Span:
    """One exported span, decoded."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    resource: dict[str, Any]
    status: int
    links: list[tuple[str, str]] = field(default_factory=list)  # (trace id, span id)

    @property
    def node(self) -> str | None:
        """The node that exported it (its resource's ``skilld.node``)."""
        return self.resource.get("skilld.node")

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (for the docs' waterfall)."""
        return {
            "trace_id": self.trace_id,
            "span_id": self.span_id,
            "parent_id": self.parent_id,
            "name": self.name,
            "kind": self.kind,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "node": self.node,
            "attributes": self.attributes,
        }


@dataclass
class Receiver:
    """What arrived: spans, metric names, and the raw request bodies."""

    url: str
    spans: list[Span] = field(default_factory=list)
    metrics: set[str] = field(default_factory=set)
    bodies: list[bytes] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def wait(self, ok: Callable[[list[Span]], bool], timeout: float = 30) -> list[Span]:
        """The spans once ``ok(spans)`` holds, polled until ``timeout``.

        Raises:
            AssertionError: it did not hold in time (the spans seen are in the message).
        """
        end = time.monotonic() + timeout
        while True:
            with self.lock:
                seen = list(self.spans)
            if ok(seen):
                return seen
            if time.monotonic() > end:
                names = sorted((s.node or "?", s.name) for s in seen)
                raise AssertionError(f"the spans expected did not arrive; got {names}")
            time.sleep(0.05)


def _decode_traces(body: bytes) -> list[Span]:
    request = trace_service_pb2.ExportTraceServiceRequest()
    request.ParseFromString(body)
    out = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope in resource_spans.scope_spans:
            for s in scope.spans:
                out.append(
                    Span(
                        s.trace_id.hex(),
                        s.span_id.hex(),
                        s.parent_span_id.hex(),
                        s.name,
                        KINDS.get(s.kind, str(s.kind)),
                        s.start_time_unix_nano,
                        s.end_time_unix_nano,
                        {a.key: _value(a.value) for a in s.attributes},
                        [
                            (e.name, {a.key: _value(a.value) for a in e.attributes})
                            for e in s.events
                        ],
                        resource,
                        s.status.code,
                        [(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                    )
                )
    return out


def _decode_metrics(body: bytes) -> set[str]:
    request = metrics_service_pb2.ExportMetricsServiceRequest()
    request.ParseFromString(body)
    return {
        m.name for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    """An OTLP/HTTP (protobuf) receiver on 127.0.0.1 and a free port, for the block."""
    holder: list[Receiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            receiver = holder[0]
            if self.path == "/v1/traces":
                spans = _decode_traces(body)
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                with receiver.lock:
                    receiver.spans.extend(spans)
                    receiver.bodies.append(body)
            elif self.path == "/v1/metrics":
                names = _decode_metrics(body)
                reply = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
                with receiver.lock:
                    receiver.metrics |= names
                    receiver.bodies.append(body)
            else:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    holder.append(Receiver(f"http://127.0.0.1:{server.server_address[1]}"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield holder[0]
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def otlp_grpc_receiver() -> Iterator[Receiver]:
    """An OTLP/gRPC trace receiver on 127.0.0.1 and a free port, for the block (insecure:
    the exporter needs ``OTEL_EXPORTER_OTLP_INSECURE=true``)."""
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    holder: list[Receiver] = []

    class Service(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
        def Export(  # the gRPC service's method name
            self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
        ) -> trace_service_pb2.ExportTraceServiceResponse:
            body = request.SerializeToString()
            receiver = holder[0]
            with receiver.lock:
                receiver.spans.extend(_decode_traces(body))
                receiver.bodies.append(body)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    holder.append(Receiver(f"http://127.0.0.1:{port}"))
    server.start()
    try:
        yield holder[0]
    finally:
        server.stop(grace=None)
