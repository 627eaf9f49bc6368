"""Traces and call metrics for the operator's OpenTelemetry collector; nothing when off.

The one module that knows OpenTelemetry (DESIGN.md). Every other layer calls the small
hooks below; while tracing is off (the default) each returns at once with nothing
allocated beyond a shared no-op, so the hot path costs a function call.

Tracing is on once :func:`configure` ran with ``OTEL_TRACES_EXPORTER=otlp`` (``skilld
serve`` calls it through :func:`configured`). The standard ``OTEL_*`` variables configure
the rest: ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``), the protocol
(``http/protobuf``; ``grpc`` where its exporter is installed), ``OTEL_TRACES_SAMPLER``,
``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME`` (default ``skilld``; the node's name
is the resource attribute ``skilld.node``). ``OTEL_METRICS_EXPORTER=otlp`` sends
``mcp.server.operation.duration`` and ``skilld.call.duration`` the same way, beside the
Prometheus ``/metrics``. Nothing connects at start: spans go out in batches from a
background thread, and while no collector answers they are dropped with one warning.
docs/tracing.md is the operator's page.

One trace, from the client to the script::

    tools/call notes_add            SERVER  the SDK's OpenTelemetryMiddleware; parent: the
    │                                       request's _meta.traceparent, else the HTTP
    │                                       traceparent header (mcp_middleware); the call
    │                                       it runs puts its facts on it (call_span: skill,
    │                                       method, caller, outcome): by the conventions
    │                                       it is the call's execute_tool
    ├─ skilld.gate.wait                     a slot of the skill's gate (1 ms or more)
    ├─ skilld.route notes  CLIENT           a routed call: the context rides in the sealed
    │  └─ (worker) execute_tool ...         envelope's routing facts (carrier / joined)
    ├─ skilld.instance                      fresh (1 ms or more); warm or reused: an attribute
    └─ skilld.guest.run
       └─ skilld.host kv.set                each host function; its permission decisions
          └─ execute_tool other.m           (allowed, rule) as attributes and events;
             └─ skilld.process python3      invoke nests a call; a native process gets
                                            TRACEPARENT in its environment

A call that outlives its request (it asked the client) or runs as a task has an
``execute_tool SKILL.METHOD`` span of its own beneath the request's.

Arguments and results are never recorded, unless the operator opted in for the skill in
its policy (``telemetry: {record_arguments: true}``): its calls then carry
``gen_ai.tool.call.arguments`` and ``gen_ai.tool.call.result`` (each cut to 4 KiB).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import json
import logging
import os
import random
import struct
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableSequence, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from skilld.errors import SkilldError
from skilld.types import Caller

T = TypeVar("T")

log = logging.getLogger("skilld.telemetry")

# W3C trace context, as it travels in _meta, an HTTP header, a cluster envelope's
# routing facts, and (upper case) a native script's environment.
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
# W3C caps tracestate at 32 members of at most 256 characters; a longer one is dropped.
_MAX_TRACESTATE = 512
_MAX_RECORDED = 4096
_MAX_SESSION_ID = 128  # the header is the client's to send; the server's ids are shorter
# What a request span takes of a text the client chose (its method, tool or prompt name,
# JSON-RPC id: up to a request body's 4 MiB): a span name or an attribute value of at
# most this many characters, so no request makes the server keep or export more.
_MAX_CLIENT_TEXT = 256
# Events (permission decisions) and links one span keeps, as the SDK's span limits
# (OTEL_SPAN_EVENT_COUNT_LIMIT, OTEL_SPAN_LINK_COUNT_LIMIT) default to: the rest are dropped.
_MAX_EVENTS = 128
# A stage (a gate wait, an instance, a guest's run with nothing traced inside it) shorter
# than this is no span of its own: 1 ms, or SKILLD_TRACE_STAGE_MIN_MS (configure).
STAGE_MIN_NS = 1_000_000
_STAGE_MIN_MS_MAX = 60_000.0
# A guest's run that waited (WASI clocks and polls are no host functions, so no span of
# their own) this many times the threshold is a span however little it ran (run_span).
_WAIT_FACTOR = 10
_thread_ns = time.thread_time_ns
_SHUTDOWN_S = 2.0
_HANDOFF_S = 0.2  # how often finished spans move to the batch processor


class _Noop:
    """The span of a hook while tracing is off: enters, exits, records nothing."""

    __slots__ = ()

    def __enter__(self) -> _Noop:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def result(self, value: Any) -> None:
        """Nothing (tracing is off)."""


NOOP = _Noop()


@dataclass(frozen=True, slots=True)
class _State:
    tracer: Any  # opentelemetry.trace.Tracer
    provider: Any  # opentelemetry.sdk.trace.TracerProvider
    meters: Any | None  # opentelemetry.sdk.metrics.MeterProvider, when metrics are on
    operation: Any | None  # histogram mcp.server.operation.duration
    calls: Any | None  # histogram skilld.call.duration
    trace: Any  # the opentelemetry.trace and .context modules, imported once
    context: Any
    # Where skilld's own spans go when they end: a _Handoff (skilld serve), else straight
    # to the tracer's span processor (tests reading spans as soon as they end).
    handoff: _Handoff | None = None


class _Handoff:
    """Hands skilld's finished spans to the span processor from a thread of its own.

    A call's thread only appends to a deque (no lock, no system call): the batch
    processor's ``on_end`` asks the process id of every span (fork safety), which on this
    kind of sandboxed host is a system call of several microseconds, and takes its lock.
    Every ``_HANDOFF_S`` the thread moves what ended to the processor, whose own thread
    encodes and sends it. At most ``limit`` spans wait; beyond that the oldest are
    dropped, as the batch processor drops what overflows its queue.
    """

    def __init__(self, processor: Any, limit: int):
        self._processor = processor
        self._queue = _batch_queue(processor)
        # Its processors as they were: one added later sends every span through on_end.
        self._processors = getattr(processor, "_span_processors", None)
        self._spans: deque[Any] = deque(maxlen=limit)
        self.put = self._spans.append
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="skilld-otel-handoff", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(_HANDOFF_S):
            self.drain()
        self.drain()

    def drain(self) -> None:
        """Hand every span that ended so far to the processor."""
        spans = self._spans
        batch = self._queue
        if (
            batch is not None
            and getattr(self._processor, "_span_processors", None) is self._processors
            and not batch._shutdown
            and batch._pid == os.getpid()
        ):
            # The batch processor's own queue, all at once: what its emit does per span
            # (a process id, a length check and an append each: 0.7 µs a span), once.
            taken = []
            while spans:
                taken.append(spans.popleft())
            if taken:
                queue = batch._queue
                queue.extendleft(taken)  # as emit: past its size the oldest fall out
                if len(queue) >= batch._max_export_batch_size:
                    batch._worker_awaken.set()
            return
        on_end = self._processor.on_end
        while spans:
            on_end(spans.popleft())

    def close(self) -> None:
        """Hand over what is left and stop the thread."""
        self._stop.set()
        self._thread.join()


def _batch_queue(processor: Any) -> Any:
    """The OpenTelemetry SDK's batch processor behind ``processor`` (the provider's, with
    the one BatchSpanProcessor configure adds), when it has the queue, limits and wake-up
    event :meth:`_Handoff.drain` fills and sets; else None (spans go through ``on_end``)."""
    processors = getattr(processor, "_span_processors", None)
    if not isinstance(processors, tuple) or len(processors) != 1:
        return None
    batch = getattr(processors[0], "_batch_processor", None)
    queue = getattr(batch, "_queue", None)
    needed = ("_shutdown", "_pid", "_max_export_batch_size", "_worker_awaken")
    if not isinstance(queue, deque) or not all(hasattr(batch, name) for name in needed):
        return None
    return batch


_state: _State | None = None
_lock = threading.Lock()


def enabled() -> bool:
    """True while spans go to a collector (after :func:`configure` turned tracing on)."""
    return _state is not None


def configure(node: str | None = None, environ: Mapping[str, str] | None = None) -> bool:
    """Turn tracing on when ``OTEL_TRACES_EXPORTER=otlp``; True when it is on.

    Sets the process's tracer provider (the MCP SDK's request spans go there too). Opens
    no connection: the exporter sends batches from its own thread. A protocol or exporter
    that is not installed logs one warning and leaves tracing off. ``environ`` (default:
    the process's) decides whether and how; OpenTelemetry's SDK reads its own settings
    (endpoint, sampler, batch sizes) from the process's environment.
    """
    global _state, STAGE_MIN_NS
    env = os.environ if environ is None else environ
    wanted = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if wanted in ("", "none"):
        return False
    if wanted != "otlp":
        log.warning("OTEL_TRACES_EXPORTER=%s is not supported (use otlp): tracing is off", wanted)
        return False
    STAGE_MIN_NS = _stage_min_ns(env.get("SKILLD_TRACE_STAGE_MIN_MS"))
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    ) or "http/protobuf"
    try:
        from opentelemetry import context, metrics, trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider_type = _provider_type()

        span_exporter = _span_exporter(protocol.strip().lower())
    except ImportError as exc:
        log.warning(
            "OTEL_TRACES_EXPORTER=otlp (%s) needs OpenTelemetry's SDK and exporter, which are "
            "not installed (%s): install skilld[otel]; tracing is off",
            protocol,
            exc.name,
        )
        return False
    if span_exporter is None:
        return False
    attributes: dict[str, Any] = {}
    if "service.name" not in _resource_keys(env.get("OTEL_RESOURCE_ATTRIBUTES", "")):
        attributes["service.name"] = "skilld"  # OTEL_SERVICE_NAME, when set, still wins
    if node:
        attributes["skilld.node"] = node
    resource = Resource.create(attributes)
    provider = provider_type(resource=resource)
    # _Dropping delegates everything else to the exporter it wraps (duck-typed).
    provider.add_span_processor(BatchSpanProcessor(cast(Any, _Dropping(span_exporter))))
    # The exporter logs each failed batch and each retry; _Dropping says it once instead.
    logging.getLogger("opentelemetry.exporter").setLevel(logging.CRITICAL)
    trace.set_tracer_provider(provider)
    _bind_sdk_tracer(provider.get_tracer(_SDK_SCOPE))
    meters = operation = calls = None
    if env.get("OTEL_METRICS_EXPORTER", "").strip().lower() == "otlp":
        meters = _meter_provider(resource)
        if meters is not None:
            metrics.set_meter_provider(meters)
            meter = meters.get_meter("skilld")
            operation = meter.create_histogram(
                "mcp.server.operation.duration",
                unit="s",
                description="MCP request duration as observed on the server",
            )
            calls = meter.create_histogram(
                "skilld.call.duration", unit="s", description="One call of a skill's method"
            )
    tracer = TracerProvider.get_tracer(provider, "skilld")  # the SDK's: _begin's sampler, ids
    limit = int(os.environ.get("OTEL_BSP_MAX_QUEUE_SIZE") or 2048)
    handoff = _Handoff(cast(Any, tracer).span_processor, limit)
    provider.handoff = handoff
    with _lock:
        _state = _State(tracer, provider, meters, operation, calls, trace, context, handoff)
    return True


def _stage_min_ns(text: str | None) -> int:
    """``SKILLD_TRACE_STAGE_MIN_MS`` in nanoseconds: how long a stage must take to be a
    span (0: every one is). Unset, 1 ms; anything but a number of milliseconds from 0 to
    60,000 logs one warning and is 1 ms."""
    if text is None or not text.strip():
        return 1_000_000
    try:
        ms = float(text)
    except ValueError:
        ms = -1.0
    if not 0 <= ms <= _STAGE_MIN_MS_MAX:  # also NaN
        log.warning(
            "SKILLD_TRACE_STAGE_MIN_MS=%r is not a number of milliseconds from 0 to %d: 1 ms it is",
            text[:64],
            int(_STAGE_MIN_MS_MAX),
        )
        return 1_000_000
    return int(ms * 1_000_000)


def flush(timeout_s: float = _SHUTDOWN_S) -> bool:
    """Send every span that ended so far, waiting at most ``timeout_s``; True when all
    went (or tracing is off)."""
    state = _state
    if state is None:
        return True
    if state.handoff is not None:
        state.handoff.drain()
    return bool(state.provider.force_flush(int(timeout_s * 1000)))


def shutdown() -> None:
    """Send what is batched (waiting at most about 2 s) and turn tracing off."""
    global _state
    with _lock:
        state, _state = _state, None
    if state is None:
        return

    _bind_sdk_tracer(None)

    def flush() -> None:
        if state.handoff is not None:
            state.handoff.close()
        state.provider.shutdown()
        if state.meters is not None:
            state.meters.shutdown(timeout_millis=int(_SHUTDOWN_S * 1000))

    # A collector that does not answer must not hold up the drain (docker stop's budget).
    done = threading.Thread(target=flush, name="skilld-otel-flush", daemon=True)
    done.start()
    done.join(_SHUTDOWN_S)


@contextmanager
def configured(node: str | None = None) -> Iterator[bool]:
    """:func:`configure` for the life of the block, then :func:`shutdown` (``skilld serve``)."""
    on = configure(node)
    try:
        yield on
    finally:
        if on:
            shutdown()


# The MCP SDK's module tracer as its import made it (a ProxyTracer), while skilld's
# provider's tracer stands in for it (_bind_sdk_tracer).
_sdk_proxy: list[Any] = []


def _bind_sdk_tracer(tracer: Any) -> None:
    """Have the MCP SDK's request spans made by ``tracer`` directly (None: as before).

    The SDK makes its tracer at import, before any provider is set: the API's
    ``ProxyTracer``, which asks the global provider on every request and wraps each
    request span in one more generator-based context manager (hot, about half of the
    5 µs a traced request cost the event loop over tracing off). Only a ProxyTracer is
    replaced, and only while tracing is on."""
    try:
        from mcp.shared import _otel
        from opentelemetry.trace import ProxyTracer
    except ImportError:  # pragma: no cover - the SDK moved it: the proxy stays
        return
    sdk: Any = _otel
    if tracer is None:
        if _sdk_proxy:
            sdk._tracer = _sdk_proxy.pop()
        return
    current = getattr(sdk, "_tracer", None)
    if isinstance(current, ProxyTracer):
        _sdk_proxy.append(current)
        sdk._tracer = tracer
    elif _sdk_proxy and type(current) is type(tracer):  # configured again: the new one
        sdk._tracer = tracer


def _resource_keys(text: str) -> set[str]:
    return {item.split("=", 1)[0].strip() for item in text.split(",") if "=" in item}


def _span_exporter(protocol: str) -> Any:
    """The OTLP span exporter for ``protocol``; None (warned) for one skilld cannot speak.

    Raises:
        ImportError: its package is not installed.
    """
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http import trace_exporter as http

        _encode_with(http, serialized=True)
        return http.OTLPSpanExporter()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc import trace_exporter as grpc

        _encode_with(grpc, serialized=False)
        return grpc.OTLPSpanExporter()
    log.warning("OTLP protocol %r is not supported (http/protobuf, grpc): tracing is off", protocol)
    return None


def _meter_provider(resource: Any) -> Any:
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    except ImportError as exc:
        log.warning("OTEL_METRICS_EXPORTER=otlp: %s is not installed; metrics stay off", exc.name)
        return None
    reader = PeriodicExportingMetricReader(cast(Any, _Dropping(OTLPMetricExporter())))
    return MeterProvider(resource=resource, metric_readers=[reader])


class _Dropping:
    """An exporter that says once, not per batch, that the collector does not answer.

    Spans (or metrics) that cannot be sent are dropped; calls never wait for them.
    """

    def __init__(self, inner: Any):
        self._inner = inner
        self._warned = False

    def __getattr__(self, name: str) -> Any:
        # The span and metric processors read the exporter's own settings (temporality,
        # aggregation) and call shutdown/force_flush: all the inner exporter's.
        return getattr(self._inner, name)

    def export(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        result = self._inner.export(batch, *args, **kwargs)
        if getattr(result, "name", "") == "FAILURE" and not self._warned:
            self._warned = True
            log.warning(
                "the OpenTelemetry collector did not take a batch (endpoint %s): spans are "
                "dropped until it answers; this is said once",
                os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318"),
            )
        return result


# -- OTLP encoding ----------------------------------------------------------------------


def _encode_with(module: Any, serialized: bool) -> None:
    """Make the OTLP span exporter of ``module`` (HTTP's or gRPC's) encode its batches with
    :class:`_Encoder`.

    Both exporters build their request with the ``encode_spans`` of their own module, the
    only seam they have: the SDK's encoder makes a protobuf object per span, attribute and
    value (about 35 µs a span here, on the exporter's thread, which a CPU-bound node
    shares with the calls under one GIL); :class:`_Encoder` writes the same bytes in about
    4 µs. ``serialized``: the exporter only asks the request for its bytes (HTTP's), which
    it then gets as written; else (gRPC's stub) it gets the message, parsed from them.
    Where a future exporter has no such function, its own encoder stays.
    """
    if callable(getattr(module, "encode_spans", None)):
        encoder = _Encoder()
        module.encode_spans = encoder.serialized if serialized else encoder.message


_VARINT1 = [bytes((n,)) for n in range(0x80)]
_FLAGS_LOCAL = b"\x85\x01" + (0x100).to_bytes(4, "little")  # field 16, fixed32: has is_remote
_FLAGS_REMOTE = b"\x85\x01" + (0x300).to_bytes(4, "little")  # ... and the parent is remote
# Cached encoded: str values at most this long (not a client's blob), ints within ± this.
_CACHED_VALUE = 64


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _VARINT1[n]
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, data: bytes) -> bytes:
    """A length-delimited field: ``tag``, the length, ``data``."""
    return tag + _varint(len(data)) + data


def _ids(context: Any, parent: Any) -> list[bytes]:
    """A span's trace_id, span_id, trace_state and parent_span_id fields (each
    SpanContext read by index: trace_id, span_id, is_remote, trace_flags, trace_state)."""
    parts = [
        b"\x0a\x10",  # trace_id
        context[0].to_bytes(16, "big"),
        b"\x12\x08",  # span_id
        context[1].to_bytes(8, "big"),
    ]
    state = context[4]
    if state:
        parts.append(_field(b"\x1a", ",".join(f"{k}={v}" for k, v in state.items()).encode()))
    if parent:
        parts += (b"\x22\x08", parent[1].to_bytes(8, "big"))
    return parts


def _times(start: int | None, end: int | None) -> list[bytes]:
    """A span's start and end time fields (each only when set)."""
    parts: list[bytes] = []
    if start:
        parts += (b"\x39", start.to_bytes(8, "little"))
    if end:
        parts += (b"\x41", end.to_bytes(8, "little"))
    return parts


def _status(status: Any) -> bytes:
    """A span's Status field: message, code."""
    told = [_field(b"\x12", status.description.encode())] if status.description else []
    if status.status_code.value:
        told += (b"\x18", _varint(status.status_code.value))
    return _field(b"\x7a", b"".join(told))


class _Encoder:
    """OTLP ``ExportTraceServiceRequest`` protobuf bytes for a batch of ReadableSpans,
    written directly: the bytes (and, parsed, the message) the SDK's ``encode_spans``
    makes, for any span (skilld's and the SDK's request spans alike).

    Spans are grouped by their resource object (the SDK's encoder groups by its hash, a
    JSON dump of its attributes, per span) and their scope; a resource's and a scope's
    attributes are written once per batch. The field of a key with a short string
    or a bool value is cached: most of a span's attributes (skill, method, operation, ...)
    repeat from call to call. Values of other types than str, bool, int, float, bytes, a
    sequence or a mapping of them, and ints beyond 64 bits, are left out, as the SDK's
    encoder leaves them out (it logs them). Field numbers: opentelemetry-proto's
    ``trace/v1/trace.proto`` and ``common/v1/common.proto``.
    """

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        self._parse = ExportTraceServiceRequest.FromString
        # Encoded KeyValue fields by tag, then by (key, value): (the value's type, field).
        self._fields: dict[bytes, dict[tuple[str, Any], tuple[type, bytes]]] = {}
        self._lean = _recorded_type()
        self._unset = self._lean.status_unset
        self._named: dict[tuple[str, Any], bytes] = {}  # name and kind fields, by both

    def serialized(self, spans: Sequence[Any]) -> _Serialized:
        """The request as the HTTP exporter takes it: something whose
        ``SerializePartialToString()`` is :meth:`request`'s bytes (it asks for nothing
        else), so the bytes are neither parsed into a message nor written again."""
        return _Serialized(self.request(spans))

    def message(self, spans: Sequence[Any]) -> Any:
        """The request as the exporters take it: the protobuf message (parsed from
        :meth:`request`'s bytes in C, a fraction of a microsecond a span)."""
        return self._parse(self.request(spans))

    def request(self, spans: Sequence[Any]) -> bytes:
        """The serialized ``ExportTraceServiceRequest`` of ``spans``."""
        # By the resource object (a provider's one; its hash is a JSON dump), then by scope.
        groups: dict[int, tuple[Any, dict[Any, list[bytes]]]] = {}
        # Each scope object's list, by its id: a scope's hash is computed in Python, and
        # equal scopes (of two tracers) still share one list, in the batch's order.
        lists: dict[tuple[int, int], list[bytes]] = {}
        lean = self._lean
        for span in spans:
            if type(span) is lean:  # skilld's: its fields, not the properties' frames
                resource = span._resource
                scope = span._instrumentation_scope
                data = self._recorded(span)
            else:
                resource = span.resource
                scope = span.instrumentation_scope
                data = self._span(span)
            encoded = lists.get((id(resource), id(scope)))
            if encoded is None:
                scopes = groups.get(id(resource))
                if scopes is None:
                    scopes = groups[id(resource)] = (resource, {})
                encoded = lists[id(resource), id(scope)] = scopes[1].setdefault(scope, [])
            encoded.append(_field(b"\x12", data))  # ScopeSpans.spans
        out = []
        for resource, by_scope in groups.values():
            # ResourceSpans: resource (Resource.attributes), scope_spans, schema_url
            parts = [_field(b"\x0a", b"".join(self._attributes(b"\x0a", resource.attributes)))]
            for scope, encoded in by_scope.items():
                described: list[bytes] = []  # InstrumentationScope: name, version, attributes
                if scope is not None:
                    if scope.name:
                        described.append(_field(b"\x0a", scope.name.encode()))
                    if scope.version:
                        described.append(_field(b"\x12", scope.version.encode()))
                    described += self._attributes(b"\x1a", scope.attributes)
                scoped = [_field(b"\x0a", b"".join(described)), *encoded]
                if scope is not None and scope.schema_url:
                    scoped.append(_field(b"\x1a", scope.schema_url.encode()))
                parts.append(_field(b"\x12", b"".join(scoped)))
            if resource.schema_url:
                parts.append(_field(b"\x1a", resource.schema_url.encode()))
            out.append(_field(b"\x0a", b"".join(parts)))
        return b"".join(out)

    def _span(self, span: Any) -> bytes:
        if type(span) is self._lean:
            return self._recorded(span)
        parent = span.parent
        parts = _ids(span.get_span_context(), parent)
        parts.append(_field(b"\x2a", span.name.encode()))
        parts += (b"\x30", _VARINT1[span.kind.value + 1])  # the proto's kinds start at 1
        parts += _times(span.start_time, span.end_time)
        parts += self._attributes(b"\x4a", span.attributes)
        if span.dropped_attributes:
            parts += (b"\x50", _varint(span.dropped_attributes))
        parts += (self._event(event) for event in span.events)
        if span.dropped_events:
            parts += (b"\x60", _varint(span.dropped_events))
        for link in span.links:
            parts.append(_field(b"\x6a", self._link(link)))
        if span.dropped_links:
            parts += (b"\x70", _varint(span.dropped_links))
        # Status: message, code (present even when unset, as the SDK's)
        parts.append(_status(span.status))
        parts.append(_FLAGS_REMOTE if parent is not None and parent.is_remote else _FLAGS_LOCAL)
        return b"".join(parts)

    def _recorded(self, span: Any) -> bytes:
        """:meth:`_span` for one of skilld's spans (:func:`_recorded_type`), read from its
        fields: no read-only copies of its attributes, events and links, no limits (it has
        none, so nothing was dropped), the name and kind fields cached."""
        parent = span._parent
        parts = _ids(span._context, parent)
        named = self._named.get((span._name, span._kind))
        if named is None:
            if len(self._named) >= 4096:  # names with ids in them: a bound, not a leak
                self._named.clear()
            named = _field(b"\x2a", span._name.encode()) + b"\x30" + _VARINT1[span._kind.value + 1]
            self._named[(span._name, span._kind)] = named
        parts.append(named)
        parts += _times(span._start_time, span._end_time)
        parts += self._attributes(b"\x4a", span._attributes)
        parts += (self._event(event) for event in span._events)
        for link in span._links:
            parts.append(_field(b"\x6a", self._link(link)))
        status = span._status
        parts.append(b"\x7a\x00" if status is self._unset else _status(status))
        parts.append(_FLAGS_REMOTE if parent is not None and parent.is_remote else _FLAGS_LOCAL)
        return b"".join(parts)

    def _event(self, event: Any) -> bytes:
        """A Span.Event field."""
        facts = [b"\x09", event.timestamp.to_bytes(8, "little")]
        if event.name:
            facts.append(_field(b"\x12", event.name.encode()))
        facts += self._attributes(b"\x1a", event.attributes)
        if event.dropped_attributes:
            facts += (b"\x20", _varint(event.dropped_attributes))
        return _field(b"\x5a", b"".join(facts))

    def _link(self, link: Any) -> bytes:
        """A Span.Link message."""
        target = link.context
        facts = [
            b"\x0a\x10",
            target.trace_id.to_bytes(16, "big"),
            b"\x12\x08",
            target.span_id.to_bytes(8, "big"),
            *self._attributes(b"\x22", link.attributes),
        ]
        if link.dropped_attributes:
            facts += (b"\x28", _varint(link.dropped_attributes))
        facts.append(b"\x35" + (0x300 if target.is_remote else 0x100).to_bytes(4, "little"))
        return b"".join(facts)

    def _attributes(self, tag: bytes, attributes: Mapping[str, Any] | None) -> list[bytes]:
        """Each attribute as a KeyValue field ``tag``."""
        if not attributes:
            return []
        # By the (key, value) item itself (the pair items() makes anyway), the value's type
        # kept beside the field: True and 1 are one key of a dict, never one field.
        fields = self._fields.get(tag)
        if fields is None:
            fields = self._fields[tag] = {}
        out = []
        # A snapshot taken in C: a request span's attributes may still be written by the
        # thread of a call that outlived its request (its writes are dropped once the span
        # ended, but one may race the end), never while this loop reads them.
        for item in list(attributes.items()):
            try:
                found = fields.get(item)
            except TypeError:  # a sequence value: unhashable, encoded below
                found = None
            if found is not None and found[0] is type(item[1]):
                out.append(found[1])
                continue
            key, value = item
            kind = type(value)
            if kind is str:
                cache = len(value) <= _CACHED_VALUE
            else:  # a depth, a count: small ints repeat as often as short strings
                cache = kind is bool or (kind is int and -_CACHED_VALUE <= value <= _CACHED_VALUE)
            try:
                field = _field(tag, _keyvalue(key, value))
            except (TypeError, ValueError, OverflowError):
                continue  # the SDK's encoder logs and leaves out what it cannot encode
            if cache:
                if len(fields) >= 4096:  # request ids, session ids: a bound, not a leak
                    fields.clear()
                fields[item] = (kind, field)
            out.append(field)
        return out


class _Serialized:
    """An encoded request, as the HTTP exporter's ``encode_spans`` result (see
    :meth:`_Encoder.serialized`)."""

    __slots__ = ("_data",)

    def __init__(self, data: bytes):
        self._data = data

    def SerializePartialToString(self) -> bytes:
        """The request's bytes."""
        return self._data

    SerializeToString = SerializePartialToString


def _keyvalue(key: str, value: Any) -> bytes:
    """A KeyValue message: key, value (AnyValue).

    Raises:
        TypeError: a value of no OTLP type.
        ValueError: an int beyond 64 bits.
    """
    return _field(b"\x0a", key.encode()) + _field(b"\x12", _value(value))


def _value(value: Any) -> bytes:
    """An AnyValue message (the SDK encoder's order of types: bool before int).

    Raises:
        TypeError: a value of no OTLP type.
        ValueError: an int beyond 64 bits.
    """
    if value is None:
        return b""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _field(b"\x0a", value.encode())
    if isinstance(value, int):
        if not -(1 << 63) <= value < 1 << 63:
            raise ValueError(f"{value} is beyond int64")
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)  # two's complement, 10 bytes
    if isinstance(value, float):
        return b"\x21" + struct.pack("<d", value)
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    if isinstance(value, Sequence):
        return _field(b"\x2a", b"".join(_field(b"\x0a", _value(item)) for item in value))
    if isinstance(value, Mapping):
        pairs = (_field(b"\x0a", _keyvalue(str(k), v)) for k, v in value.items())
        return _field(b"\x32", b"".join(pairs))
    raise TypeError(f"{type(value).__name__} is no OTLP attribute value")


# -- spans ------------------------------------------------------------------------------


class _Span:
    """A live span, current for the ``with`` block; ends (with the error, if any) after it."""

    __slots__ = ("_attributes", "_kind", "_name", "_started", "_state", "_token", "span")

    def __init__(self, state: _State, name: str, attributes: Mapping[str, Any] | None, kind: str):
        self._state = state
        self._name = name
        self._attributes = attributes
        self._kind = kind
        self.span: Any = None
        self._token: Any = None
        self._started = 0.0

    def __enter__(self) -> _Span:
        state = self._state
        self.span = _begin(state, self._name, self._attributes, self._kind)
        self._token = _contexts().enter(self.span)
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is not None:
            _failed(self.span, exc)
        self.span.end()
        _contexts().leave(self._token)


def _begin(
    state: _State,
    name: str,
    attributes: Mapping[str, Any] | None,
    kind: str = "internal",
    start: int | None = None,
) -> Any:
    """One of skilld's spans, started now (or at ``start``) beneath the current span, of
    the scope ``skilld``; it reaches the batch processor through the hand-off when it
    ends. Raises nothing."""
    tracer = state.tracer
    sink = state.handoff.put if state.handoff is not None else tracer.span_processor.on_end
    made = _recorded_type()
    return _start(tracer, made.skilld, sink, None, name, _KINDS[kind], attributes, None, start)


def _start(
    tracer: Any,
    scope: Any,
    sink: Callable[[Any], None],
    ctx: Any,
    name: str,
    kind: Any,
    attributes: Mapping[str, Any] | None,
    links: Sequence[Any] | None,
    start: int | None,
    extra: Mapping[str, Any] | None = None,
) -> Any:
    """A span started now (or at ``start``) beneath the span of ``ctx`` (None: the current
    context's), sampled and named by ``tracer`` (the SDK's: its sampler, id generator and
    resource), of the instrumentation ``scope``, given to ``sink`` when it ends.

    What the SDK tracer's ``start_span`` does, less what costs a call its time: the
    sampler decides (the default one, in place, as it would) and the ids come from the
    provider's generator as they would, but the span is a :func:`_recorded_type` (a
    ReadableSpan filled in place, no locks, no limits pass, no ``on_start``); the
    exporter's thread encodes it. Raises nothing.
    """
    made = _recorded_type()
    parent: Any = _contexts().current(ctx).get_span_context()
    ids = tracer.id_generator
    # A SpanContext is a tuple (trace_id, span_id, is_remote, trace_flags, trace_state,
    # is_valid): its fields by index, not by the properties' Python frames.
    if parent[5]:
        trace_id = parent[0]
        flags = parent[3] & _RANDOM_TRACE_ID
    else:
        parent = None
        trace_id = ids.generate_trace_id()
        flags = _RANDOM_TRACE_ID if ids.is_trace_id_random() else 0
    recorded: dict[str, Any] = dict(attributes) if attributes else {}
    if extra:
        recorded.update(extra)
    sampler = tracer.sampler
    if sampler is made.default_on:
        # The default sampler (parentbased_always_on), decided here as it decides: the
        # parent's flag, else sampled; the parent's trace state; the span's attributes
        # unchanged. Its objects (a result, a read-only copy of the attributes, three
        # more look-ups of the current span) cost a span a fifth of its time.
        if parent is None:
            flags |= _SAMPLED
            trace_state = None
        else:
            flags |= parent[3] & _SAMPLED
            trace_state = parent[4]
    else:
        sampling = sampler.should_sample(ctx, trace_id, name, kind, attributes, links)
        if sampling.decision.is_sampled():
            flags |= _SAMPLED
        if sampling.attributes:
            recorded.update(sampling.attributes)
        trace_state = sampling.trace_state
    # The SDK's default generator's span id (random, never 0) without its frame; a
    # SpanContext as its constructor makes it (both ids valid: generated, or a valid
    # parent's), without the range checks in Python.
    span_id = _getrandbits(64) if type(ids) is made.random_ids else ids.generate_span_id()
    if not span_id:
        span_id = ids.generate_span_id()
    context = _tuple_new(
        made.context_type,
        (trace_id, span_id, False, made.flags[flags], trace_state or made.no_state, True),
    )
    span = made(name, context, parent, kind, recorded, start or time.time_ns(), tracer, sink, scope)
    if links:
        span._links = list(links)
    return span


_getrandbits = random.getrandbits
_tuple_new = tuple.__new__
_dict_set = dict.__setitem__


class _Contexts:
    """The current span, and a span made current and no longer, read and written on
    OpenTelemetry's context variable itself where its runtime context is the default
    (contextvars) one: the API's functions cost a span four to six Python frames each
    way (:func:`_contexts`). Elsewhere, the API's own functions."""

    __slots__ = ("attach", "current", "enter", "here", "leave")
    current: Callable[[Any], Any]  # the current span of a context (None: this one)
    enter: Callable[[Any], Any]  # make a span current; a token to leave it by
    here: Callable[[], Any]  # the current context
    attach: Callable[[Any], Any]  # make a context current; a token to leave it by
    leave: Callable[[Any], None]

    def __init__(self) -> None:
        from opentelemetry import context as api
        from opentelemetry import trace
        from opentelemetry.context import Context
        from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
        from opentelemetry.trace.propagation import _SPAN_KEY

        runtime = getattr(api, "_RUNTIME_CONTEXT", None)
        var = getattr(runtime, "_current_context", None)
        if type(runtime) is not ContextVarsRuntimeContext or not isinstance(
            var, contextvars.ContextVar
        ):
            self.current = trace.get_current_span
            self.enter = lambda span: api.attach(trace.set_span_in_context(span))
            self.here = api.get_current
            self.attach = api.attach
            self.leave = api.detach
            return
        invalid = trace.INVALID_SPAN
        span_type = trace.Span
        get = var.get
        put = var.set

        lean = _recorded_type()
        deferred = _deferred_type()

        def current(ctx: Any) -> Any:
            span = (get() if ctx is None else ctx).get(_SPAN_KEY)
            # skilld's own spans first: Span is an ABC, whose isinstance costs more
            if type(span) is lean or type(span) is deferred:
                return span
            return span if isinstance(span, span_type) else invalid

        def enter(span: Any) -> Any:
            values = Context(get())  # immutable to everyone else: filled before it is shared
            _dict_set(values, _SPAN_KEY, span)
            return put(values)

        def leave(token: Any) -> None:
            try:
                var.reset(token)
            except (ValueError, RuntimeError):
                api.detach(token)  # as the API would: it logs why

        self.current = current
        self.enter = enter
        self.here = get
        self.attach = put
        self.leave = leave


@functools.cache
def _contexts() -> _Contexts:
    """The :class:`_Contexts` of this process (made once, on first use)."""
    return _Contexts()


# W3C trace flags: sampled, and (level 2) a random trace id.
_SAMPLED = 0x01
_RANDOM_TRACE_ID = 0x02
_KINDS: dict[str, Any] = {}


@functools.cache
def _recorded_type() -> type[Any]:
    """The class of skilld's own spans (built once, on first use: OpenTelemetry is only
    imported once tracing is on).

    A span of the API (current in a context, seen by propagators, ``annotate`` and
    ``decision``) that is also the SDK's ReadableSpan the processor queues and the
    exporter encodes, as the SDK's own span is; unlike it, it is filled in place without
    locks, attribute limits or span-processor hooks at start. Its writers are the one
    thread running its ``with`` block, so nothing needs a lock; it is handed to the
    processor once, at its end. The MCP SDK's request spans are of this class too (its
    ``OpenTelemetryMiddleware`` makes them with a tracer of :func:`_provider_type`).
    """
    from opentelemetry import trace
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
    from opentelemetry.sdk.trace.sampling import DEFAULT_ON
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    unset = trace.Status(trace.StatusCode.UNSET)
    none: Any = ()  # no events, no links: most spans have none (and need no list each)
    _KINDS.update({k.name.lower(): k for k in trace.SpanKind})

    class Recorded(trace.Span, ReadableSpan):  # the bases of the SDK's own span
        _adopted = False  # a request span a call's facts went on (call_span)

        def __init__(  # ReadableSpan's fields, set directly
            self,
            name: str,
            context: Any,
            parent: Any,
            kind: Any,
            attributes: dict[str, Any],
            start: int,
            tracer: Any,
            sink: Callable[[Any], None],
            scope: Any,
        ) -> None:
            self._name = name
            self._context = context
            self._parent = parent
            self._kind = kind
            self._attributes = attributes
            self._facts = attributes  # the same dict, typed as it is (ReadableSpan: Optional)
            self._ids = context
            self._events: list[Any] = none
            self._links: list[Any] = none
            self._status = unset
            self._start_time = start
            self._end_time: int | None = None
            self._resource = tracer.resource
            self._instrumentation_info = None
            self._instrumentation_scope = scope
            self._sink = sink

        api = trace  # the API module, for _start
        context_type = trace.SpanContext
        no_state = trace.DEFAULT_TRACE_STATE
        random_ids = RandomIdGenerator
        skilld = InstrumentationScope("skilld")  # the scope of skilld's own spans
        default_on = DEFAULT_ON  # the SDK's default sampler, which _start decides for
        status_unset = unset  # a new span's status (the encoder knows its bytes)
        flags = tuple(trace.TraceFlags(n) for n in range(256))  # one object per value, shared

        def get_span_context(self) -> Any:
            return self._context

        def is_recording(self) -> bool:
            return self._end_time is None and bool(self._ids[3] & _SAMPLED)

        # Once ended it belongs to the exporter's thread, which may be encoding it: later
        # writes are dropped, as the SDK's span drops them.
        def set_attribute(self, key: str, value: Any) -> None:
            if self._end_time is None:
                self._facts[key] = value

        def set_attributes(self, attributes: Mapping[str, Any]) -> None:
            if self._end_time is None:
                self._facts.update(attributes)

        def add_event(
            self, name: str, attributes: Any = None, timestamp: int | None = None
        ) -> None:
            if self._end_time is None:
                event = Event(name, attributes, timestamp or time.time_ns())
                if not self._events:
                    self._events = [event]
                elif len(self._events) < _MAX_EVENTS:  # the SDK's default limit, kept
                    self._events.append(event)

        def add_link(self, context: Any, attributes: Any = None) -> None:
            if self._end_time is None:
                link = trace.Link(context, attributes)
                if not self._links:
                    self._links = [link]
                elif len(self._links) < _MAX_EVENTS:
                    self._links.append(link)

        def update_name(self, name: str) -> None:
            self._name = name[:_MAX_CLIENT_TEXT]

        def set_status(self, status: Any, description: str | None = None) -> None:
            # The code only: a description is an error's message (the MCP SDK's
            # middleware passes the client's error, "Unknown tool: NAME"), which may quote
            # what the client or the guest sent, and is never recorded (as _failed).
            code = status.status_code if isinstance(status, trace.Status) else status
            self._status = unset if code is trace.StatusCode.UNSET else trace.Status(code)

        def record_exception(
            self,
            exception: BaseException,
            attributes: Any = None,
            timestamp: int | None = None,
            escaped: bool = False,
        ) -> None:
            # Only the type: a message may quote what the guest was given.
            facts = {"exception.type": type(exception).__qualname__, **dict(attributes or {})}
            self.add_event("exception", facts, timestamp)

        def end(self, end_time: int | None = None) -> None:
            if self._end_time is not None:
                return
            self._end_time = end_time or time.time_ns()
            if self._ids[3] & _SAMPLED:  # trace_flags (see _start)
                self._sink(self)

    return Recorded


@functools.cache
def _provider_type() -> type[Any]:
    """The tracer provider skilld sets for the process (built once, on first use).

    The SDK's, whose tracers (the MCP SDK's ``OpenTelemetryMiddleware`` asks for one for
    its request spans) make :func:`_recorded_type` spans too: the SDK's own span costs the
    event loop about 40 µs a request (locks, an attribute-limits pass per value, the
    processors' hooks, a copy at its end), one of skilld's about a third of that. The
    provider's sampler, id generator, resource and span processor decide, name, describe
    and send them as the SDK's tracer would; the hand-off (once configure set it) takes
    them when they end, and ``force_flush`` drains it first.
    """
    from opentelemetry import trace
    from opentelemetry.sdk.trace import Tracer as SdkTracer
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    server = trace.SpanKind.SERVER

    class Tracer(trace.Tracer):
        def __init__(self, sdk: Any, scope: Any, provider: Any):
            self._sdk = sdk
            self._scope = scope
            self._provider = provider
            self._requests = scope.name == _SDK_SCOPE  # the MCP SDK's tracer

        def start_span(
            self,
            name: str,
            context: Any = None,
            kind: Any = trace.SpanKind.INTERNAL,
            attributes: Any = None,
            links: Any = None,
            start_time: int | None = None,
            record_exception: bool = True,
            set_status_on_exception: bool = True,
        ) -> Any:
            sdk = self._sdk
            handoff = self._provider.handoff
            sink = handoff.put if handoff is not None else sdk.span_processor.on_end
            extra = None
            if self._requests:
                # The MCP SDK's request span: skilld's facts of the request (_outer's)
                # too, and the client's texts cut short.
                if kind is server:
                    extra = _REQUEST_FACTS.get()
                if len(name) > _MAX_CLIENT_TEXT:
                    name = name[:_MAX_CLIENT_TEXT]
                if attributes:
                    attributes = _clipped(attributes)
            return _start(
                sdk, self._scope, sink, context, name, kind, attributes, links, start_time, extra
            )

        def start_as_current_span(  # type: ignore[override]
            self,
            name: str,
            context: Any = None,
            kind: Any = trace.SpanKind.INTERNAL,
            attributes: Any = None,
            links: Any = None,
            start_time: int | None = None,
            record_exception: bool = True,
            set_status_on_exception: bool = True,
            end_on_exit: bool = True,
        ) -> Current:
            start = functools.partial(
                self.start_span, name, context, kind, attributes, links, start_time
            )
            return Current(start, end_on_exit, record_exception, set_status_on_exception)

    class Current:
        """The API's ``use_span`` for a span of :meth:`Tracer.start_as_current_span`, as a
        class: the request span's context managers (the MCP SDK's, the API's proxy
        tracer's, this) are on the event loop for every request, and a generator-based one
        costs about twice what this does. The span starts on entering (as the API's); as
        a decorator (the API's tracers allow it) each call, sync or async, gets its own."""

        __slots__ = ("_end", "_record", "_start", "_status", "_token", "span")

        def __init__(self, start: Callable[[], Any], end: bool, record: bool, status: bool):
            self._start = start
            self._end = end
            self._record = record
            self._status = status
            self._token: Any = None
            self.span: Any = None

        def __enter__(self) -> Any:
            self.span = span = self._start()
            self._token = _contexts().enter(span)
            return span

        def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
            again = functools.partial(Current, self._start, self._end, self._record, self._status)
            if inspect.iscoroutinefunction(fn):

                @functools.wraps(fn)
                async def run_async(*args: Any, **kwargs: Any) -> Any:
                    with again():
                        return await fn(*args, **kwargs)

                return run_async

            @functools.wraps(fn)
            def run(*args: Any, **kwargs: Any) -> Any:
                with again():
                    return fn(*args, **kwargs)

            return run

        def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
            span = self.span
            try:
                _contexts().leave(self._token)
                # As use_span: an Exception (not a cancellation) is recorded and sets the
                # status, where the flags ask for it and the span records.
                if isinstance(exc, Exception) and span.is_recording():
                    if self._record:
                        span.record_exception(exc)
                    if self._status:  # the code: a span keeps no description (set_status)
                        span.set_status(trace.Status(trace.StatusCode.ERROR))
            finally:
                if self._end:
                    span.end()

    class Provider(TracerProvider):
        handoff: _Handoff | None = None  # set by configure, once its thread runs

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            # What ended but waits in the hand-off first: the SDK's flush would miss it.
            if self.handoff is not None:
                self.handoff.drain()
            return bool(super().force_flush(timeout_millis))

        def get_tracer(
            self,
            instrumenting_module_name: str,
            instrumenting_library_version: str | None = None,
            schema_url: str | None = None,
            attributes: Any = None,
        ) -> Any:
            sdk = super().get_tracer(
                instrumenting_module_name, instrumenting_library_version, schema_url, attributes
            )
            if not isinstance(sdk, SdkTracer):
                return sdk  # OTEL_SDK_DISABLED: the SDK's no-op tracer
            scope = InstrumentationScope(
                instrumenting_module_name,
                instrumenting_library_version or "",
                schema_url,
                attributes,
            )
            return Tracer(sdk, scope, self)

    return Provider


def _clipped(attributes: Mapping[str, Any]) -> Mapping[str, Any]:
    """``attributes`` with each text cut to ``_MAX_CLIENT_TEXT`` characters (``attributes``
    itself when none is longer: the common case costs one pass and no copy)."""
    for value in attributes.values():
        if type(value) is str and len(value) > _MAX_CLIENT_TEXT:
            return {
                key: value[:_MAX_CLIENT_TEXT] if type(value) is str else value
                for key, value in attributes.items()
            }
    return attributes


def _failed(span: Any, exc: BaseException) -> None:
    from opentelemetry.trace import StatusCode

    if isinstance(exc, SkilldError):
        # The outcome vocabulary of the audit and the metrics; never the message, which
        # may quote what the guest was given.
        span.set_attribute("error.type", exc.outcome)
        span.set_attribute("skilld.error.code", exc.code)
        span.set_status(StatusCode.ERROR)
    elif isinstance(exc, Exception):
        span.set_attribute("error.type", type(exc).__qualname__)
        span.set_status(StatusCode.ERROR)


def span(name: str, attributes: Mapping[str, Any] | None = None, kind: str = "internal") -> Any:
    """A span named ``name`` for the ``with`` block, current for what runs in it.

    ``kind``: internal, client, server, producer or consumer. A :class:`SkilldError`
    leaving the block sets ``error.type`` to its outcome. While tracing is off: a no-op.
    """
    state = _state
    if state is None:
        return NOOP
    return _Span(state, name, attributes, kind)


class _Stage:
    """A stage that becomes a span only when it took long enough to matter, or failed."""

    __slots__ = ("_attributes", "_name", "_start", "_state")

    def __init__(self, state: _State, name: str, attributes: Mapping[str, Any] | None):
        self._state = state
        self._name = name
        self._attributes = attributes
        self._start = 0

    def __enter__(self) -> _Stage:
        self._start = time.time_ns()
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        end = time.time_ns()
        if exc is None and end - self._start < STAGE_MIN_NS:
            return
        # Made afterwards, with its real times, in the context the block ran in.
        span = _begin(self._state, self._name, self._attributes, start=self._start)
        if exc is not None:
            _failed(span, exc)
        span.end(end_time=end)


def stage(name: str, attributes: Mapping[str, Any] | None = None) -> Any:
    """A span named ``name`` for the ``with`` block, recorded only when the block took at
    least ``STAGE_MIN_NS`` (1 ms) or raised: a gate that did not make the call wait, or a
    warm instance handed over, costs no span (each costs about as much CPU as a small
    call's own work). Nothing inside the block can be its child. A no-op while off."""
    state = _state
    if state is None:
        return NOOP
    return _Stage(state, name, attributes)


def run_span(name: str) -> Any:
    """A span named ``name`` for the ``with`` block (a guest's run), recorded only when
    its thread ran at least ``STAGE_MIN_NS`` of CPU in it, it took ten times that, it
    raised, or something inside it needed the span: a child span (a host function's), a
    context handed on (a nested or routed call, a script's ``TRACEPARENT``) or an
    annotation. Then it is a span with the block's real start, beneath the span current
    at the start.

    A short run with nothing inside it to trace (most calls of a small skill) thus costs
    no span: making one, and exporting it, cost such a call as much CPU as the rest of its
    tracing together (docs/tracing.md). A no-op while off."""
    state = _state
    if state is None:
        return NOOP
    return _deferred_type()(state, name)


@functools.cache
def _deferred_type() -> type[Any]:
    """The class of :func:`run_span`'s spans (built on first use, as
    :func:`_recorded_type`): an API span, current for its block, that becomes one of
    skilld's spans the first time anything asks it for its context or writes to it."""
    from opentelemetry import trace

    class Deferred(trace.Span):
        __slots__ = ("_cpu", "_end", "_name", "_outer", "_real", "_start", "_state", "_token")

        def __init__(self, state: _State, name: str) -> None:
            self._state = state
            self._name = name
            self._real: Any = None
            self._outer: Any = None
            self._token: Any = None
            self._start = 0
            self._cpu = 0
            self._end = 0  # when the block ended without the span

        def __enter__(self) -> Any:
            contexts = _contexts()
            self._outer = contexts.here()
            self._start = time.time_ns()
            self._cpu = _thread_ns()
            self._token = contexts.enter(self)
            return self

        def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
            _contexts().leave(self._token)
            real = self._real
            if real is None:
                end = time.time_ns()
                # Quick: it ran (its thread's CPU time) under the threshold and took
                # under ten times it. Wall time alone is not the guest's: at 16 calls at
                # once on two cores a third of a small tool's runs took 1 ms or more
                # only because their thread waited for the interpreter.
                if (
                    exc is None
                    and end - self._start < _WAIT_FACTOR * STAGE_MIN_NS
                    and _thread_ns() - self._cpu < STAGE_MIN_NS
                ):
                    self._end = end  # asked for later (a context kept): made, and ended
                    return
                real = self._made()
                if exc is not None:
                    _failed(real, exc)
                real.end(end_time=end)
                return
            if exc is not None:
                _failed(real, exc)
            real.end()

        def _made(self) -> Any:
            """The span itself: made now, with the block's start, beneath the span
            that was current when the block began."""
            real = self._real
            if real is None:
                state = self._state
                tracer = state.tracer
                sink = (
                    state.handoff.put if state.handoff is not None else tracer.span_processor.on_end
                )
                real = self._real = _start(
                    tracer,
                    _recorded_type().skilld,
                    sink,
                    self._outer,
                    self._name,
                    _KINDS["internal"],
                    None,
                    None,
                    self._start,
                )
                if self._end:  # its block is over (a context kept in it was used later)
                    real.end(end_time=self._end)
            return real

        # The API, each call on the span itself (made by the first).
        def get_span_context(self) -> Any:
            return self._made().get_span_context()

        def is_recording(self) -> bool:
            return bool(self._made().is_recording())

        def set_attribute(self, key: str, value: Any) -> None:
            self._made().set_attribute(key, value)

        def set_attributes(self, attributes: Mapping[str, Any]) -> None:
            self._made().set_attributes(attributes)

        def add_event(
            self, name: str, attributes: Any = None, timestamp: int | None = None
        ) -> None:
            self._made().add_event(name, attributes, timestamp)

        def add_link(self, context: Any, attributes: Any = None) -> None:
            self._made().add_link(context, attributes)

        def update_name(self, name: str) -> None:
            self._made().update_name(name)

        def set_status(self, status: Any, description: str | None = None) -> None:
            self._made().set_status(status, description)

        def record_exception(self, exception: BaseException, *args: Any, **kwargs: Any) -> None:
            self._made().record_exception(exception, *args, **kwargs)

        def end(self, end_time: int | None = None) -> None:
            self._made().end(end_time)

    return Deferred


def annotate(attributes: Mapping[str, Any]) -> None:
    """Set ``attributes`` on the current span (nothing while tracing is off)."""
    state = _state
    if state is None:
        return
    _contexts().current(None).set_attributes(attributes)  # each span copies what it keeps


def decision(decision: Any) -> None:
    """Record a permission decision on the current span (a host function's).

    The span gets the last decision's ``skilld.permission.allowed`` and
    ``skilld.permission.rule`` and one ``skilld.permission`` event per decision
    (capability, action, allowed, rule). The target (a path, a URL) is never recorded.
    """
    state = _state
    if state is None:
        return
    current = _contexts().current(None)
    facts: dict[str, str | bool] = {
        "skilld.permission.capability": str(decision.capability),
        "skilld.permission.action": str(decision.action),
        "skilld.permission.allowed": bool(decision.allowed),
        "skilld.permission.rule": str(decision.rule),
    }
    current.add_event("skilld.permission", facts)
    current.set_attributes(facts)


class _CallSpan(_Span):
    __slots__ = ("_record", "_skill")

    def __init__(
        self, state: _State, skill: str, method: str, attributes: dict[str, Any], record: bool
    ):
        super().__init__(state, f"execute_tool {skill}.{method}", attributes, "internal")
        self._skill = skill
        self._record = record

    def __enter__(self) -> _CallSpan:
        super().__enter__()
        if self._state.calls is not None:
            self._started = time.perf_counter()
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        outcome = _call_ended(self._state, self._skill, self._started, exc)
        self.span.set_attribute("skilld.outcome", outcome)
        super().__exit__(kind, exc, tb)

    def result(self, value: Any) -> None:
        """The call's result, on its span, when the operator opted in for its skill."""
        if self._record:
            self.span.set_attribute("gen_ai.tool.call.result", _recorded_result(value))


def _call_ended(state: _State, skill: str, started: float, exc: BaseException | None) -> str:
    """A call's outcome (``ok``, its error's, or ``internal``), its duration recorded in
    ``skilld.call.duration`` where metrics are on (``started``: its perf_counter)."""
    outcome = "ok"
    if isinstance(exc, SkilldError):
        outcome = exc.outcome
    elif exc is not None:
        outcome = "internal"
    if state.calls is not None:
        state.calls.record(
            time.perf_counter() - started, {"skilld.skill": skill, "skilld.outcome": outcome}
        )
    return outcome


def _recorded_result(value: Any) -> str:
    """A call's result as its span records it (JSON, at most ``_MAX_RECORDED`` characters)."""
    shown = getattr(value, "value", value)
    try:
        text = json.dumps(shown, separators=(",", ":"), sort_keys=True, default=str)
    except (TypeError, ValueError):
        text = repr(shown)
    return text[:_MAX_RECORDED]


def call_span(
    skill: str, method: str, *, caller: Caller, depth: int, arguments: str, record: bool = False
) -> Any:
    """The span of one call of ``skill``'s ``method`` (``execute_tool SKILL.METHOD``).

    Carries the GenAI tool attributes, skilld's own (skill, method, caller kind, depth)
    and, leaving, ``skilld.outcome``; the call's duration goes to ``skilld.call.duration``.
    ``arguments`` (and, through ``.result(value)``, the result) are recorded only when
    ``record`` (the skill's policy ``telemetry.record_arguments``, which the registry
    holds). While tracing is off: a no-op.
    """
    state = _state
    if state is None:
        return NOOP
    if len(method) > _MAX_CLIENT_TEXT:  # a nested call's method is the guest's to name
        method = method[:_MAX_CLIENT_TEXT]
    key = (skill, method, caller.kind, depth)
    attributes = _FACTS.get(key)
    if attributes is None:
        attributes = _facts(key)
    if record:
        attributes = {**attributes, "gen_ai.tool.call.arguments": arguments[:_MAX_RECORDED]}
    if depth == 0:
        current: Any = _contexts().current(None)
        if (
            type(current) is _recorded_type()
            and current._end_time is None
            and current._kind is _KINDS["server"]
            and current._instrumentation_scope.name == _SDK_SCOPE
            and not current._adopted
        ):
            return _Adopted(state, skill, method, current, attributes, record)
    return _CallSpan(state, skill, method, attributes, record)


# A call's facts by (skill, method, caller kind, depth): the same few for every call of a
# method, made once and only read (spans copy or merge them). At most _MAX_FACTS (a guest
# names a nested call's method): past that the cache starts again.
_FACTS: dict[tuple[str, str, str, int], dict[str, Any]] = {}
_MAX_FACTS = 1024


def _facts(key: tuple[str, str, str, int]) -> dict[str, Any]:
    skill, method, kind, depth = key
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": f"{skill}.{method}",
        "skilld.skill": skill,
        "skilld.method": method,
        # The kind only (oauth, token, local, skill, node...): who it is stays in the audit.
        "skilld.caller": kind,
        "skilld.depth": depth,
    }
    if len(_FACTS) >= _MAX_FACTS:
        _FACTS.clear()
    _FACTS[key] = attributes
    return attributes


# The MCP SDK's instrumentation scope (its OpenTelemetryMiddleware's request spans).
_SDK_SCOPE = "mcp-python-sdk"


def calls_get_own_spans() -> None:
    """The calls the current request starts get ``execute_tool`` spans of their own, its
    span none of their facts: a task's call, which the request only starts (whether it
    ends before the request's answer or after is a race, and a trace's shape must not
    be). Nothing while tracing is off."""
    if _state is None:
        return
    current: Any = _contexts().current(None)
    if type(current) is _recorded_type():
        current._adopted = True


class _Adopted:
    """A call the MCP request runs (``tools/call``, depth 0): its facts go on the request
    span, the SDK's ``tools/call NAME`` (SERVER, ``gen_ai.operation.name =
    execute_tool``), which is the call's span by the conventions; a child
    ``execute_tool`` span would say the same again, at a third of a call's tracing cost.

    A call that outlives its request (it asked the client something, or runs as a task)
    finds the request span ended when it ends: its ``execute_tool`` span is then made, with
    its real times and every fact, beneath the request span.
    """

    __slots__ = (
        "_attributes",
        "_method",
        "_record",
        "_skill",
        "_start",
        "_started",
        "_state",
        "span",
    )

    def __init__(
        self,
        state: _State,
        skill: str,
        method: str,
        span: Any,
        attributes: dict[str, Any],
        record: bool,
    ):
        self._state = state
        self._skill = skill
        self._method = method
        self._attributes = attributes
        self._record = record
        self.span = span
        span._adopted = True
        span.set_attributes(attributes)
        self._start = 0
        self._started = 0.0

    def __enter__(self) -> _Adopted:
        self._start = time.time_ns()
        if self._state.calls is not None:
            self._started = time.perf_counter()
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        outcome = _call_ended(self._state, self._skill, self._started, exc)
        span = self.span
        if span._end_time is not None:  # the request answered first: a span of its own
            contexts = _contexts()
            token = contexts.enter(span)  # beneath the request span, whatever is current
            try:
                name = f"execute_tool {self._skill}.{self._method}"
                span = _begin(self._state, name, self._attributes, start=self._start)
            finally:
                contexts.leave(token)
        span.set_attribute("skilld.outcome", outcome)
        if exc is not None:
            _failed(span, exc)  # error.type and skilld.error.code, as on a call's own span
        if span is not self.span:
            span.end()

    def result(self, value: Any) -> None:
        """The call's result, on its span, when the operator opted in for its skill."""
        if self._record:
            text = self._attributes["gen_ai.tool.call.result"] = _recorded_result(value)
            self.span.set_attribute("gen_ai.tool.call.result", text)


# -- context across threads, nodes and processes --------------------------------------


def carry(fn: Callable[[], T]) -> Callable[[], T]:
    """``fn``, made to run in this thread's trace context on whichever thread runs it
    (a worker pool's); ``fn`` itself while tracing is off."""
    state = _state
    if state is None:
        return fn
    contexts = _contexts()
    current = contexts.current(None)
    if type(current) is _deferred_type():
        current.get_span_context()  # made here, not by the thread that runs fn
    here = contexts.here()

    def run() -> T:
        token = contexts.attach(here)
        try:
            return fn()
        finally:
            contexts.leave(token)

    return run


def carrier() -> dict[str, str]:
    """The current trace context as W3C fields (``traceparent``, ``tracestate``), for a
    message to another node; empty while tracing is off or outside any span."""
    if _state is None:
        return {}
    fields: dict[str, str] = {}
    _propagator().inject(fields)
    # A client's tracestate may be 8 KB: it must not crowd a cluster envelope's routing
    # facts (MAX_META) nor a script's environment.
    if len(fields.get(TRACESTATE, "")) > _MAX_TRACESTATE:
        del fields[TRACESTATE]
    return fields


def _remote(fields: Mapping[str, Any], with_state: bool = True) -> Any:
    """The context a valid W3C ``traceparent`` in ``fields`` names, or None; its
    ``tracestate`` too unless ``with_state`` is False (whether a context is valid depends on
    the traceparent alone: a malformed tracestate is dropped, not the context)."""
    parent = fields.get(TRACEPARENT)
    if not isinstance(parent, str):
        return None
    carried = {TRACEPARENT: parent}
    state = fields.get(TRACESTATE)
    if with_state and isinstance(state, str) and len(state) <= _MAX_TRACESTATE:
        carried[TRACESTATE] = state
    trace = _recorded_type().api
    found = _propagator().extract(carried)
    if not trace.get_current_span(found).get_span_context().is_valid:
        return None
    return found


@functools.cache
def _propagator() -> Any:
    """The W3C trace context propagator (made once: it keeps no state)."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator()


@contextmanager
def _attached(ctx: Any) -> Iterator[None]:
    from opentelemetry import context

    token = context.attach(ctx)
    try:
        yield
    finally:
        context.detach(token)


def joined(fields: Mapping[str, Any] | None, name: str | None = None) -> Any:
    """For the ``with`` block, the trace context ``fields`` carry (a verified envelope's
    routing facts) is the parent of new spans, beneath a SERVER span ``name`` when given;
    a no-op without one."""
    state = _state
    if state is None or not fields:
        return NOOP
    ctx = _remote(fields)
    if ctx is None:
        return NOOP
    return _attached(ctx) if name is None else _joined_span(state, ctx, name)


@contextmanager
def _joined_span(state: _State, ctx: Any, name: str) -> Iterator[_Span]:
    with _attached(ctx), _Span(state, name, None, "server") as opened:
        yield opened


def here() -> Any:
    """The current span's context, kept with a call this process holds (a parked call)
    for :func:`link` to lead back to: a :func:`carrier` without formatting one (a
    ``traceparent`` is only needed where the call crosses to another node). None while
    tracing is off or outside any span."""
    if _state is None:
        return None
    found = _contexts().current(None).get_span_context()
    return found if found.is_valid else None


def link(fields: Any, why: str) -> None:
    """Link the current span to the span ``fields`` names (a :func:`carrier` kept with a
    task, or a :func:`here` kept with a parked call): a retry's request span then leads to
    the call it resumed, in its first request's trace. Nothing while tracing is off or
    without a context."""
    state = _state
    if state is None or not fields:
        return
    if isinstance(fields, Mapping):
        ctx = _remote(fields)
        if ctx is None:
            return
        target = state.trace.get_current_span(ctx).get_span_context()
    elif isinstance(fields, state.trace.SpanContext):
        target = fields
    else:
        return
    _contexts().current(None).add_link(target, {"skilld.link": why})


def environ(env: dict[str, str]) -> dict[str, str]:
    """``env`` with ``TRACEPARENT`` (and ``TRACESTATE``) of the current span: a native
    process's spans then join the call's trace. ``env`` itself while tracing is off."""
    for key, value in carrier().items():
        env[key.upper()] = value
    return env


# -- the MCP request ------------------------------------------------------------------


def mcp_middleware(chain: MutableSequence[Any]) -> None:
    """Put skilld's middleware before the SDK's ``OpenTelemetryMiddleware`` (first in
    ``chain``, ``Server.middleware``): nothing while tracing is off.

    It runs the request in the context of the HTTP ``traceparent`` header where the
    request's ``_meta`` carries none (the SDK's span takes ``_meta``'s first, then the
    ambient context), records ``mcp.server.operation.duration``, and has the tracer put
    ``network.transport`` and ``mcp.session.id`` on the SDK's span as it is made (no
    middleware inside the SDK's: one less layer on every request).

    Either way, OpenTelemetry's warning for each malformed ``tracestate`` member is
    silenced: the SDK's middleware reads every request's ``_meta``, so a client could
    write one log line per member of every request.
    """
    logging.getLogger("opentelemetry.trace.span").setLevel(logging.ERROR)
    if _state is None:
        return
    chain.insert(0, _outer)


# The request's facts for the MCP SDK's request span (network.transport, mcp.session.id),
# from _outer to the tracer that makes the span (_provider_type's Tracer.start_span).
_REQUEST_FACTS: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "skilld_request_facts", default=None
)
# The request headers _outer reads, as the ASGI scope names them (lower case).
_WANTED = {b"traceparent": TRACEPARENT, b"tracestate": TRACESTATE, b"mcp-session-id": "session"}


def _headers(ctx: Any) -> Mapping[str, str] | None:
    # ctx.request is the transport's (Starlette) request over HTTP, None over stdio: the
    # SDK types it Any, so its headers are looked for rather than assumed.
    request = getattr(ctx, "request", None)
    headers = getattr(request, "headers", None)
    return headers if isinstance(headers, Mapping) or hasattr(headers, "get") else None


def _request_headers(ctx: Any) -> dict[str, str] | None:
    """The request's ``traceparent``, ``tracestate`` and ``mcp-session-id`` headers (the
    first of each; keys ``traceparent``, ``tracestate``, ``session``), or None without an
    HTTP request (stdio). Read in one pass over the ASGI scope's raw headers where there
    is one (Starlette's ``Headers.get`` scans them once per name)."""
    request = getattr(ctx, "request", None)
    scope = getattr(request, "scope", None)
    raw = scope.get("headers") if isinstance(scope, dict) else None
    if isinstance(raw, list):
        found: dict[str, str] = {}
        try:
            first = dict(reversed(raw))  # in C; the first of a repeated header wins
            for name, key in _WANTED.items():
                value = first.get(name)
                if value is not None:
                    found[key] = value.decode("latin-1")
        except (TypeError, ValueError, AttributeError):
            pass  # not an ASGI server's headers: read them as a mapping below
        else:
            return found
    headers = _headers(ctx)
    if headers is None:
        return None
    found = {}
    for name, key in _WANTED.items():
        value = headers.get(name.decode())
        if isinstance(value, str):
            found[key] = value
    return found


async def _outer(ctx: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
    state = _state
    if state is None:
        return await call_next(ctx)
    headers = _request_headers(ctx)
    facts: dict[str, Any] = {"network.transport": "pipe" if headers is None else "tcp"}
    parent = None
    if headers:
        session = headers.get("session")
        if session:
            facts["mcp.session.id"] = session[:_MAX_SESSION_ID]
        # Only whether _meta names a valid parent (the SDK's span reads it, tracestate and
        # all); only asked when the header names one.
        if TRACEPARENT in headers:
            meta = ctx.meta
            if not (isinstance(meta, Mapping) and _remote(meta, with_state=False) is not None):
                parent = _remote(headers)
    token = _REQUEST_FACTS.set(facts)
    started = time.perf_counter() if state.operation is not None else 0.0
    error: str | None = None
    try:
        if parent is None:
            return await call_next(ctx)
        with _attached(parent):
            return await call_next(ctx)
    except BaseException as exc:
        error = type(exc).__qualname__
        raise
    finally:
        _REQUEST_FACTS.reset(token)
        if state.operation is not None and ctx.request_id is not None:
            # The client's method (any text: the middleware runs before the SDK finds it
            # has no handler) and version, cut short: the SDK keeps up to 2,000 series.
            outcome: dict[str, Any] = dict(
                _clipped(
                    {
                        "mcp.method.name": ctx.method,
                        "mcp.protocol.version": ctx.protocol_version,
                    }
                )
            )
            name = (ctx.params or {}).get("name") if ctx.method == "tools/call" else None
            # Only a tool that answered: unknown names are the client's, unbounded.
            if isinstance(name, str) and error is None:
                outcome["gen_ai.tool.name"] = name
                outcome["gen_ai.operation.name"] = "execute_tool"
            if error is not None:
                outcome["error.type"] = error
            state.operation.record(time.perf_counter() - started, outcome)
