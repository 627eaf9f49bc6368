"""skilld's OTLP encoder writes the request the SDK's encoder makes, for any batch of spans
(the SDK's own and skilld's, with any attribute a span may hold), and the exporters use it."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry import context, trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode, TraceState

from skilld import telemetry

# What an attribute may hold: every OTLP value type, ints beyond 64 bits, NaN and the
# infinities, and (on skilld's spans, which do not check) None, mappings, mixed lists and
# objects no encoder takes.
primitives = st.one_of(
    st.text(max_size=80),
    st.text(max_size=300),
    st.booleans(),
    st.integers(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(),
    st.binary(max_size=40),
)
values = st.one_of(
    primitives,
    st.lists(st.text(max_size=10), max_size=4),
    st.lists(st.integers(-(2**70), 2**70), max_size=4),
    st.lists(st.floats(), max_size=3),
    st.lists(st.booleans(), max_size=3),
)
loose = st.one_of(
    values,
    st.none(),
    st.lists(st.one_of(primitives, st.none()), max_size=4),
    st.dictionaries(st.text(max_size=8), primitives, max_size=3),
    st.builds(object),
)
keys = st.text(max_size=30)
attributes = st.dictionaries(keys, values, max_size=6)
ids = st.integers(1, 2**64 - 1)
trace_ids = st.integers(1, 2**128 - 1)
states = st.lists(
    st.tuples(
        st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True),
        st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True),
    ),
    max_size=3,
    unique_by=lambda kv: kv[0],
)
statuses = st.one_of(
    st.just(Status(StatusCode.UNSET)),
    st.just(Status(StatusCode.OK)),
    st.builds(lambda d: Status(StatusCode.ERROR, d), st.one_of(st.none(), st.text(max_size=40))),
)
kinds = st.sampled_from(list(SpanKind))
events = st.lists(
    st.tuples(st.text(max_size=20), attributes, st.integers(0, 2**64 - 1)), max_size=3
)


# A sampled parent (trace flags 1), the parents' default.
SAMPLED = st.just(1)


@st.composite
def parents(draw: st.DrawFn, flags: st.SearchStrategy[int] = SAMPLED) -> Any:
    """No parent, a local one, or a remote one (a client's) with a tracestate; sampled
    unless ``flags`` draws other trace flags."""
    if draw(st.booleans()):
        return None
    return trace.SpanContext(
        draw(trace_ids),
        draw(ids),
        is_remote=draw(st.booleans()),
        trace_flags=trace.TraceFlags(draw(flags)),
        trace_state=TraceState(draw(states)),
    )


@st.composite
def span_specs(draw: st.DrawFn) -> dict[str, Any]:
    """What one span is made of: who makes it (the SDK's tracer or skilld's hooks) and
    its name, kind, parent, attributes, events, links and status."""
    mine = draw(st.booleans())
    return {
        "mine": mine,
        "name": draw(st.text(max_size=40)),
        "kind": draw(kinds),
        "parent": draw(parents()),
        "attributes": draw(st.dictionaries(keys, loose if mine else values, max_size=8)),
        "events": draw(events),
        "links": draw(st.lists(st.tuples(trace_ids, ids, st.booleans(), attributes), max_size=2)),
        "status": draw(statuses),
        "later": draw(st.dictionaries(keys, values, max_size=2)),
    }


@pytest.fixture
def quiet() -> Iterator[None]:
    """The SDK's encoder logs each value it cannot encode (with its traceback)."""
    logger = logging.getLogger("opentelemetry.exporter.otlp.proto.common")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


def _spans(
    resource: Resource,
    scope_version: str | None,
    specs: list[dict[str, Any]],
    scope_attributes: dict[str, Any] | None = None,
) -> list[Any]:
    """The spans of ``specs``, ended, as the batch processor would hand them over."""
    # Small limits: the SDK's spans then drop attributes, events and links, and count them.
    limits = SpanLimits(
        max_span_attributes=5,
        max_events=2,
        max_links=1,
        max_event_attributes=3,
        max_link_attributes=3,
    )
    provider = TracerProvider(resource=resource, span_limits=limits)
    exported = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    sdk = provider.get_tracer(
        "mcp-python-sdk", scope_version, schema_url="https://x/1", attributes=scope_attributes
    )
    state = telemetry._State(
        provider.get_tracer("skilld"), provider, None, None, None, trace, context
    )
    for spec in specs:
        parent = spec["parent"]
        ctx = (
            trace.set_span_in_context(trace.NonRecordingSpan(parent))
            if parent
            else context.Context()
        )
        links = [
            trace.Link(
                trace.SpanContext(t, s, is_remote=remote, trace_flags=trace.TraceFlags(1)), facts
            )
            for t, s, remote, facts in spec["links"]
        ]
        if spec["mine"]:
            token = context.attach(ctx)
            try:
                span = telemetry._begin(
                    state, spec["name"], spec["attributes"], spec["kind"].name.lower()
                )
            finally:
                context.detach(token)
            for link in links:
                span.add_link(link.context, link.attributes)
        else:
            span = sdk.start_span(
                spec["name"], ctx, spec["kind"], attributes=spec["attributes"], links=links
            )
        for name, facts, at in spec["events"]:
            span.add_event(name, facts, at)
        span.set_status(spec["status"])
        span.set_attributes(spec["later"])
        span.end()
    return list(exported.get_finished_spans())


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    resource=attributes,
    scope_version=st.one_of(st.none(), st.text(max_size=10)),
    scope=attributes,
    specs=st.lists(span_specs(), min_size=1, max_size=5),
)
def test_the_lean_encoder_writes_what_the_sdks_encoder_writes(
    quiet: None,
    resource: dict[str, Any],
    scope_version: str | None,
    scope: dict[str, Any],
    specs: list[dict[str, Any]],
) -> None:
    """For any batch of spans (the SDK's request spans and skilld's own, any attributes,
    events, links, parents, trace states and statuses; values no encoder takes are left
    out by both), the request skilld's encoder writes is the SDK encoder's message."""
    spans = _spans(Resource(resource, "https://schema/1"), scope_version, specs, scope)
    ours = telemetry._Encoder().request(spans)
    theirs = encode_spans(spans).SerializeToString(deterministic=True)
    assert (
        ExportTraceServiceRequest.FromString(ours).SerializeToString(deterministic=True) == theirs
    )


def test_one_key_with_equal_values_of_other_types_keeps_each_type(quiet: None) -> None:
    """True, 1 and 1.0 are one key of a dict: the encoder's field cache must still write
    each span's value as its own type, in any order, with one encoder for the batch."""
    same = [{"k": True}, {"k": 1}, {"k": 1.0}, {"k": False}, {"k": 0}, {"k": True}]
    specs = [
        {
            "mine": mine,
            "name": "n",
            "kind": trace.SpanKind.INTERNAL,
            "parent": None,
            "attributes": facts,
            "events": [("e", facts, 1)],
            "links": [],
            "status": trace.Status(trace.StatusCode.UNSET),
            "later": {},
        }
        for mine in (True, False)
        for facts in same
    ]
    spans = _spans(Resource({"r": 1, "s": True}), None, specs)
    encoder = telemetry._Encoder()
    for _ in range(2):  # the second time from the cache
        ours = encoder.request(spans)
        theirs = encode_spans(spans).SerializeToString(deterministic=True)
        assert (
            ExportTraceServiceRequest.FromString(ours).SerializeToString(deterministic=True)
            == theirs
        )


def test_a_batch_from_two_resources_keeps_each_resources_spans_apart(quiet: None) -> None:
    """Spans of two providers (two resources) in one batch: one ResourceSpans each, every
    span under its own, as the SDK's encoder groups them; a cached attribute is written
    again for the next span that has it."""
    spec = {
        "mine": True,
        "name": "execute_tool echo.echo",
        "kind": SpanKind.INTERNAL,
        "parent": None,
        "attributes": {"skilld.skill": "echo", "skilld.depth": 0},
        "events": [],
        "links": [],
        "status": Status(StatusCode.UNSET),
        "later": {"skilld.outcome": "ok"},
    }
    first = _spans(Resource({"skilld.node": "a"}), None, [spec, spec])
    second = _spans(Resource({"skilld.node": "b"}), None, [spec])
    batch = [first[0], second[0], first[1]]
    encoder = telemetry._Encoder()
    encoder.request(batch)  # fills the cache
    request = ExportTraceServiceRequest.FromString(encoder.request(batch))
    assert request.SerializeToString(deterministic=True) == encode_spans(batch).SerializeToString(
        deterministic=True
    )
    nodes = [
        ([a.value.string_value for a in rs.resource.attributes if a.key == "skilld.node"], rs)
        for rs in request.resource_spans
    ]
    assert [(node, len(rs.scope_spans[0].spans)) for node, rs in nodes] == [(["a"], 2), (["b"], 1)]
    for _, rs in nodes:
        for span in rs.scope_spans[0].spans:
            assert {a.key: a.value.string_value for a in span.attributes}["skilld.skill"] == "echo"


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_each_otlp_exporter_encodes_with_skillds_encoder(protocol: str) -> None:
    """The span exporter for either protocol builds its request with skilld's encoder."""
    exporter = telemetry._span_exporter(protocol)
    module = __import__(type(exporter).__module__, fromlist=["encode_spans"])
    try:
        assert isinstance(module.encode_spans.__self__, telemetry._Encoder)
    finally:
        exporter.shutdown()


def _request_span(tracer: Any, parent: Any, fail: BaseException | None) -> None:
    """What the MCP SDK's OpenTelemetryMiddleware does with its tracer for one request."""
    ctx = trace.set_span_in_context(trace.NonRecordingSpan(parent)) if parent else None
    attributes = {"mcp.method.name": "tools/call", "jsonrpc.request.id": "7"}
    try:
        with tracer.start_as_current_span(
            "tools/call echo",
            kind=SpanKind.SERVER,
            attributes=attributes,
            context=ctx,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            assert trace.get_current_span() is span
            span.set_attributes({"mcp.session.id": "s1"})
            if fail is not None:
                span.set_attribute("error.type", type(fail).__qualname__)
                span.set_status(StatusCode.ERROR, "tool failed")
                raise fail
    except RuntimeError:
        pass


@pytest.mark.parametrize("fail", [None, RuntimeError("boom")])
@pytest.mark.parametrize("sampled", [True, False])
def test_the_request_spans_tracer_makes_the_span_the_sdks_tracer_makes(
    fail: BaseException | None, sampled: bool
) -> None:
    """The tracer skilld's provider gives the MCP SDK's middleware makes, for a request
    under a client's remote parent, the span the SDK's tracer makes (name, kind, parent,
    trace, attributes, status, scope, resource; exported once ended, not at all when the
    client's parent was not sampled), current while the request runs."""
    parent = trace.SpanContext(
        0x4BF92F3577B34DA6A3CE929D0E0E4736,
        0x00F067AA0BA902B7,
        is_remote=True,
        trace_flags=trace.TraceFlags(1 if sampled else 0),
        trace_state=TraceState([("k", "v")]),
    )
    made = []
    for provider in (TracerProvider(resource=Resource({"skilld.node": "a"})), None):
        if provider is None:
            provider = telemetry._provider_type()(resource=Resource({"skilld.node": "a"}))
        exported = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(exported))
        tracer = provider.get_tracer("mcp-python-sdk", "2.0", schema_url="https://x/1")
        _request_span(tracer, parent, fail)
        made.append(exported.get_finished_spans())
    sdk, ours = made
    assert isinstance(telemetry._provider_type()().get_tracer("x"), trace.Tracer)
    assert len(ours) == len(sdk) == (1 if sampled else 0)
    if not sampled:
        return
    (theirs,), (mine,) = sdk, ours
    assert type(mine) is telemetry._recorded_type()
    for field in ("name", "kind", "parent", "instrumentation_scope", "resource", "events"):
        assert getattr(mine, field) == getattr(theirs, field), field
    assert dict(mine.attributes) == dict(theirs.attributes)
    assert mine.context.trace_id == theirs.context.trace_id == parent.trace_id
    assert mine.context.trace_flags == theirs.context.trace_flags
    assert mine.context.trace_state == theirs.context.trace_state == parent.trace_state
    # The same status, without its description: an error's message may quote the client.
    assert mine.status.status_code == theirs.status.status_code
    assert mine.status.description is None
    assert mine.end_time is not None and mine.start_time <= mine.end_time


def test_the_providers_flush_sends_what_waits_in_the_handoff() -> None:
    """A request span that ended and waits in the hand-off (its thread stopped here, so
    only the flush can move it) is exported by the provider's force_flush."""
    provider = telemetry._provider_type()()
    exported = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    handoff = telemetry._Handoff(provider._active_span_processor, 16)
    handoff._stop.set()
    handoff._thread.join()
    provider.handoff = handoff
    with provider.get_tracer("mcp-python-sdk").start_as_current_span("tools/call echo"):
        pass
    assert exported.get_finished_spans() == ()
    assert provider.force_flush()
    assert [span.name for span in exported.get_finished_spans()] == ["tools/call echo"]


def test_with_the_sdk_disabled_the_request_spans_tracer_is_the_sdks_no_op(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """OTEL_SDK_DISABLED=true: skilld's provider hands out the SDK's no-op tracer, whose
    spans record nothing (no lean span made from a tracer that has no sampler)."""
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    tracer = telemetry._provider_type()().get_tracer("mcp-python-sdk")
    with tracer.start_as_current_span("tools/call echo") as span:
        assert not span.is_recording()


def test_the_http_exporter_is_handed_the_sdk_encoders_request_as_bytes(quiet: None) -> None:
    """The HTTP exporter asks its ``encode_spans`` result only for its bytes: skilld's
    answer gives the bytes as written, and they are the SDK encoder's request."""
    spec = {
        "mine": True,
        "name": "execute_tool echo.echo",
        "kind": SpanKind.INTERNAL,
        "parent": None,
        "attributes": {"skilld.skill": "echo", "skilld.depth": 0},
        "events": [("skilld.permission", {"skilld.permission.allowed": True}, 5)],
        "links": [],
        "status": Status(StatusCode.UNSET),
        "later": {"skilld.outcome": "ok"},
    }
    batch = _spans(Resource({"skilld.node": "a"}), "1", [spec, {**spec, "mine": False}, spec])
    exporter = telemetry._span_exporter("http/protobuf")
    try:
        from opentelemetry.exporter.otlp.proto.http import trace_exporter as http

        sent = http.encode_spans(batch).SerializePartialToString()
    finally:
        exporter.shutdown()
    assert isinstance(sent, bytes)
    assert ExportTraceServiceRequest.FromString(sent).SerializeToString(
        deterministic=True
    ) == encode_spans(batch).SerializeToString(deterministic=True)


@settings(max_examples=100, deadline=None)
@given(
    parent=parents(st.sampled_from([0, 1, 2, 3])),
    facts=attributes,
    name=st.text(max_size=20),
    kind=kinds,
)
def test_the_default_sampler_decided_in_place_decides_as_the_sampler_itself(
    parent: Any, facts: dict[str, Any], name: str, kind: SpanKind
) -> None:
    """A span of the default sampler (parentbased_always_on, decided in _start without
    calling it) gets the flags, trace state, trace, parent and attributes it gets from
    an equal sampler that _start asks (the SDK's own ParentBased(ALWAYS_ON)); another
    sampler is still asked (the SDK's parentbased_always_off: a root span unsampled)."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, DEFAULT_OFF, DEFAULT_ON, ParentBased

    ctx = trace.set_span_in_context(trace.NonRecordingSpan(parent)) if parent else None
    made = {}
    for label, sampler in (
        ("in place", DEFAULT_ON),
        ("asked", ParentBased(ALWAYS_ON)),
        ("off", DEFAULT_OFF),
    ):
        tracer = TracerProvider(sampler=sampler).get_tracer("skilld")
        scope = telemetry._recorded_type().skilld
        made[label] = telemetry._start(
            tracer, scope, lambda span: None, ctx, name, kind, facts, None, None
        )
    mine, asked, off = made["in place"], made["asked"], made["off"]
    for span in (mine, asked):
        assert span.parent == parent
        assert dict(span.attributes) == facts
    if parent is not None:
        assert mine.context.trace_id == asked.context.trace_id == parent.trace_id
    assert mine.context.trace_flags == asked.context.trace_flags
    assert type(mine.context.trace_flags) is trace.TraceFlags
    assert mine.context.trace_state == asked.context.trace_state
    assert mine.is_recording() == asked.is_recording()
    assert off.context.trace_flags.sampled == (parent is not None and parent.trace_flags.sampled)


def test_a_request_span_that_failed_records_and_sets_its_status_as_use_span_does() -> None:
    """The request span's context manager (skilld's use_span) records an exception and
    sets the status the way the SDK tracer's does, where the flags ask for it: the same
    status code, without the description, and the exception event by its type only (a
    message may quote the guest's input)."""
    made = []
    for provider in (TracerProvider(), telemetry._provider_type()()):
        exported = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(exported))
        tracer = provider.get_tracer("mcp-python-sdk")
        with pytest.raises(RuntimeError), tracer.start_as_current_span("tools/call echo"):
            raise RuntimeError("secret input")
        made.append(exported.get_finished_spans())
    ((theirs,), (mine,)) = made
    assert mine.status.status_code == theirs.status.status_code
    assert theirs.status.description == "RuntimeError: secret input"
    assert mine.status.description is None  # never the message
    assert [event.name for event in mine.events] == [event.name for event in theirs.events]
    assert dict(mine.events[0].attributes) == {"exception.type": "RuntimeError"}
    assert trace.get_current_span() is trace.INVALID_SPAN  # detached again


def test_the_request_spans_tracer_also_decorates_sync_and_async_functions() -> None:
    """``start_as_current_span`` as a decorator (the API's tracers allow it, and a library
    in the process may use it): each call, sync or async, gets a span of its own, current
    while the function runs, ended when it returns."""
    import asyncio

    provider = telemetry._provider_type()()
    exported = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    tracer = provider.get_tracer("some-library")
    seen: list[Any] = []

    @tracer.start_as_current_span("sync work")
    def work() -> None:
        seen.append(trace.get_current_span())

    @tracer.start_as_current_span("async work")
    async def later() -> None:
        await asyncio.sleep(0)
        seen.append(trace.get_current_span())

    work()
    work()
    asyncio.run(later())
    names = [span.name for span in exported.get_finished_spans()]
    assert names == ["sync work", "sync work", "async work"]
    assert len({id(span) for span in seen}) == 3
    assert [span.get_span_context() for span in seen] == [
        span.context for span in exported.get_finished_spans()
    ]
