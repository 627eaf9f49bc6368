"""Trace context is client input: whatever a request's _meta, HTTP header or a script's
environment would carry, the hooks neither fail nor pass on more than W3C allows."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from opentelemetry import context, propagate, trace
from opentelemetry.sdk.trace import TracerProvider

from skilld import telemetry
from skilld.types import Caller

TRACEPARENT = re.compile(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def on(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Tracing on in this process, on a provider of its own (the global one untouched)."""
    provider = TracerProvider()
    state = telemetry._State(
        provider.get_tracer("test"), provider, None, None, None, trace, context
    )
    monkeypatch.setattr(telemetry, "_state", state)
    yield
    provider.shutdown()


# Text a client controls: W3C-shaped and not, long tracestate lists, control characters.
fields = st.one_of(
    st.text(max_size=200),
    st.from_regex(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}", fullmatch=True),
    st.builds(
        lambda n, v: ",".join(f"k{i}={v}" for i in range(n)),
        st.integers(0, 40),
        st.text(alphabet="abcdef0123456789", min_size=1, max_size=256),
    ),
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parent=st.one_of(fields, st.just(VALID)), state=fields, other=st.none() | st.integers())
@example(parent=VALID, state=",".join(f"k{i}={'a' * 250}" for i in range(32)), other=None)
def test_any_carried_context_is_taken_or_ignored_never_passed_on_unbounded(
    on: None, parent: str, state: str, other: Any
) -> None:
    """joined/link/carrier/environ on arbitrary traceparent and tracestate text: no
    exception, and what goes on (to another node, into a script's environment) is a
    well-formed traceparent and at most 512 characters of tracestate."""
    carried = {"traceparent": parent, "tracestate": state, "x": other}
    # As the SDK's middleware takes a request's _meta (the global propagator, unbounded).
    token = context.attach(propagate.extract({"traceparent": parent, "tracestate": state}))
    try:
        with telemetry.span("request"):
            sdk_side = telemetry.carrier()
    finally:
        context.detach(token)
    assert len(sdk_side.get("tracestate", "")) <= 512
    with telemetry.joined(carried, "skilld.round.relayed"), telemetry.span("child"):
        telemetry.link(carried, "test")
        out = telemetry.carrier()
        env = telemetry.environ({})
    assert TRACEPARENT.fullmatch(out["traceparent"]), out
    assert len(out.get("tracestate", "")) <= 512
    assert env["TRACEPARENT"] == out["traceparent"]
    if parent == VALID:
        assert out["traceparent"].split("-")[1] == VALID.split("-")[1]


class _Request:
    def __init__(self, headers: dict[str, str]):
        self.headers = headers


class _Ctx:
    def __init__(self, meta: Any, headers: dict[str, str]):
        self.meta = meta
        self.request = _Request(headers)
        self.request_id = 1
        self.method = "tools/call"
        self.protocol_version = "2025-11-25"
        self.params = {"name": "t"}


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=fields, meta=st.one_of(st.none(), st.dictionaries(st.text(max_size=20), fields)))
def test_the_request_middleware_takes_any_header_and_meta(
    on: None, header: str, meta: dict[str, str] | None
) -> None:
    """The middleware outside the SDK's runs the request under whatever the HTTP header
    and _meta hold, valid or not, and leaves the context as it found it."""
    import anyio

    seen: list[Any] = []

    async def handler(ctx: Any) -> str:
        seen.append(trace.get_current_span().get_span_context())
        return "ok"

    before = context.get_current()
    ctx = _Ctx(meta, {"traceparent": header, "tracestate": header})
    assert anyio.run(telemetry._outer, ctx, handler) == "ok"
    assert context.get_current() == before
    assert len(seen) == 1


class _AsgiRequest:
    """A request as Starlette's: the ASGI scope's raw headers (bytes, lower-case names)."""

    def __init__(self, headers: list[tuple[bytes, bytes]]):
        self.scope = {"type": "http", "headers": headers}


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    header=st.one_of(st.binary(max_size=300), fields.map(str.encode)),
    session=st.binary(max_size=300),
    meta=st.one_of(st.none(), st.dictionaries(st.text(max_size=20), fields)),
)
@example(header=VALID.encode(), session=b"s-1", meta=None)
def test_the_request_middleware_takes_any_raw_header_bytes(
    on: None, header: bytes, session: bytes, meta: dict[str, str] | None
) -> None:
    """Over HTTP the middleware reads the ASGI scope's raw headers once: any bytes in
    traceparent, tracestate and mcp-session-id run the request, the first of each is the
    one read, the session id reaches the request span's facts cut to 128 characters, and
    the context and the facts are as they were afterwards."""
    import anyio

    seen: list[Any] = []

    async def handler(ctx: Any) -> str:
        seen.append((trace.get_current_span().get_span_context(), telemetry._REQUEST_FACTS.get()))
        return "ok"

    before = context.get_current()
    ctx = _Ctx(meta, {})
    ctx.request = _AsgiRequest(  # type: ignore[assignment]
        [
            (b"host", b"127.0.0.1"),
            (b"traceparent", header),
            (b"tracestate", header),
            (b"mcp-session-id", session),
            (b"traceparent", b"00-" + b"9" * 32 + b"-" + b"9" * 16 + b"-01"),
        ]
    )
    assert anyio.run(telemetry._outer, ctx, handler) == "ok"
    assert context.get_current() == before
    assert telemetry._REQUEST_FACTS.get() is None
    [(parent, facts)] = seen
    assert facts["network.transport"] == "tcp"
    assert len(facts.get("mcp.session.id", "")) <= 128
    assert facts.get("mcp.session.id", "") == session.decode("latin-1")[:128]
    in_meta = isinstance(meta, dict) and isinstance(meta.get("traceparent"), str)
    if header == VALID.encode() and not in_meta:
        assert parent.trace_id == int(VALID.split("-")[1], 16)
    else:
        assert parent.trace_id != int("9" * 32, 16)  # never the second traceparent


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Tracing on in this process, every span kept as it ends (an in-memory exporter)."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = TracerProvider()
    spans = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    state = telemetry._State(
        provider.get_tracer("test"), provider, None, None, None, trace, context
    )
    monkeypatch.setattr(telemetry, "_state", state)
    monkeypatch.setattr(telemetry, "STAGE_MIN_NS", 10**12)  # nothing is long enough
    yield spans
    provider.shutdown()


def _by_name(spans: Any) -> dict[str, Any]:
    done = spans.get_finished_spans()
    found = {s.name: s for s in done}
    assert len(found) == len(done), [s.name for s in done]
    return found


def test_a_short_run_with_nothing_traced_in_it_is_no_span(recorded: Any) -> None:
    """A run_span block that took less than STAGE_MIN_NS, asked for nothing and did not
    fail leaves no span; what ran in it saw the call's span as its parent's context."""
    with telemetry.span("call"), telemetry.run_span("skilld.guest.run"):
        pass
    assert set(_by_name(recorded)) == {"call"}


@pytest.mark.parametrize(
    "inside", ["child", "carrier", "environ", "annotate", "here", "link", "exception"]
)
def test_a_run_becomes_a_span_when_something_in_it_needs_one(recorded: Any, inside: str) -> None:
    """A child span, a context passed on (to a node, a script, a parked call), an
    annotation or a link inside a short run make it a span: beneath the call, from the
    block's start, the parent of what asked."""
    passed: dict[str, Any] = {}
    with telemetry.span("call"), telemetry.run_span("skilld.guest.run"):
        if inside == "child":
            with telemetry.span("skilld.host kv.get"):
                pass
        elif inside == "carrier":
            passed = telemetry.carrier()
        elif inside == "environ":
            passed = {k.lower(): v for k, v in telemetry.environ({}).items()}
        elif inside == "annotate":
            telemetry.annotate({"skilld.node.target": "w1"})
        elif inside == "here":
            passed = {"ctx": telemetry.here()}
        elif inside == "exception":  # what the API's span would be asked by a library
            trace.get_current_span().record_exception(ValueError("the guest's secret"))
        else:
            telemetry.link({"traceparent": VALID}, "test")
    done = _by_name(recorded)
    run, call = done["skilld.guest.run"], done["call"]
    assert run.parent is not None and run.parent.span_id == call.context.span_id
    assert run.context.trace_id == call.context.trace_id
    assert call.start_time <= run.start_time <= run.end_time <= call.end_time
    if inside == "child":
        child = done["skilld.host kv.get"]
        assert child.parent is not None and child.parent.span_id == run.context.span_id
        assert run.start_time <= child.start_time
    elif inside in ("carrier", "environ"):
        assert passed["traceparent"].split("-")[2] == f"{run.context.span_id:016x}"
    elif inside == "annotate":
        assert run.attributes == {"skilld.node.target": "w1"}
    elif inside == "here":
        assert passed["ctx"].span_id == run.context.span_id
    elif inside == "exception":
        assert [(e.name, dict(e.attributes)) for e in run.events] == [
            ("exception", {"exception.type": "ValueError"})
        ]
    else:
        assert [link.attributes["skilld.link"] for link in run.links] == ["test"]


def test_a_failed_or_long_run_is_a_span(recorded: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that raised is a span with the error's outcome; with STAGE_MIN_NS 0
    (SKILLD_TRACE_STAGE_MIN_MS=0) every run is one."""
    from skilld.errors import GuestError

    failure = GuestError("limit-exceeded", "out of fuel")
    with telemetry.span("call"):
        with pytest.raises(GuestError), telemetry.run_span("failed"):
            raise failure
        monkeypatch.setattr(telemetry, "STAGE_MIN_NS", 0)
        with telemetry.run_span("every"):
            pass
    done = _by_name(recorded)
    assert set(done) == {"call", "failed", "every"}
    assert done["failed"].attributes["error.type"] == failure.outcome
    assert done["failed"].status.status_code == trace.StatusCode.ERROR
    assert done["every"].parent is not None
    assert done["every"].parent.span_id == done["call"].context.span_id


def test_a_run_is_quick_by_what_it_ran_unless_it_waited_ten_times_the_threshold(
    recorded: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a 10 ms threshold: a run that waited 2 ms (as for the interpreter) is no
    span; one whose thread ran 15 ms of CPU is; one that waited 120 ms (ten times the
    threshold: a guest sleeping in WASI, which has no span of its own) is too."""
    monkeypatch.setattr(telemetry, "STAGE_MIN_NS", 10_000_000)
    with telemetry.span("call"):
        with telemetry.run_span("waited"):
            time.sleep(0.002)
        with telemetry.run_span("ran"):
            until = time.thread_time() + 0.015
            while time.thread_time() < until:
                pass
        with telemetry.run_span("slept"):
            time.sleep(0.12)
    done = _by_name(recorded)
    assert set(done) == {"call", "ran", "slept"}
    assert done["ran"].end_time - done["ran"].start_time >= 15_000_000
    assert done["slept"].end_time - done["slept"].start_time >= 120_000_000


def test_a_context_taken_to_another_thread_in_a_short_run_names_a_span_that_ends(
    recorded: Any,
) -> None:
    """A function carried to another thread from inside a run (a pool's) runs beneath
    the run's span, made on the carrying thread; a run whose context is asked for after
    it ended (a context kept) is made then, with the block's times, and ends."""
    import threading

    seen: list[Any] = []
    with telemetry.span("call"):
        with telemetry.run_span("carried"):
            job = telemetry.carry(lambda: seen.append(telemetry.here()))
        with telemetry.run_span("kept"):
            kept = context.get_current()
        worker = threading.Thread(target=job)
        worker.start()
        worker.join()
        late = trace.get_current_span(kept).get_span_context()
    done = _by_name(recorded)
    assert seen[0].span_id == done["carried"].context.span_id
    assert late.span_id == done["kept"].context.span_id
    assert done["kept"].end_time is not None
    assert done["kept"].end_time <= done["call"].end_time


@pytest.mark.parametrize(
    ("text", "ns"),
    [(None, 10**6), ("", 10**6), ("0", 0), ("2.5", 2_500_000), ("60000", 60 * 10**9)]
    + [(bad, 10**6) for bad in ("-1", "nan", "inf", "1e9", "one", "1" * 5000)],
)
def test_the_stage_threshold_is_read_from_the_environment(
    text: str | None, ns: int, caplog: pytest.LogCaptureFixture
) -> None:
    """SKILLD_TRACE_STAGE_MIN_MS: milliseconds from 0 to 60,000; anything else is 1 ms
    and one warning that quotes at most 64 characters of it."""
    with caplog.at_level(logging.WARNING, logger="skilld.telemetry"):
        assert telemetry._stage_min_ns(text) == ns
    if ns == 10**6 and text:
        assert len(caplog.records) == 1
        assert "SKILLD_TRACE_STAGE_MIN_MS" in caplog.text and len(caplog.text) < 400
    else:
        assert not caplog.records


def test_a_stage_is_a_span_only_when_it_took_long_enough_or_failed(
    recorded: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gate or instance stage shorter than STAGE_MIN_NS leaves no span; one that took
    longer, or raised, is a span under the call with its real times and error."""
    from skilld.errors import SkillBusy

    spans = recorded
    with telemetry.span("call"):
        with telemetry.stage("quick", {"skilld.skill": "s"}):
            pass
        with pytest.raises(SkillBusy), telemetry.stage("refused"):
            raise SkillBusy("s", 1)
        monkeypatch.setattr(telemetry, "STAGE_MIN_NS", 0)
        with telemetry.stage("waited", {"skilld.skill": "s"}):
            pass
    done = {s.name: s for s in spans.get_finished_spans()}
    assert set(done) == {"call", "refused", "waited"}
    call = done["call"].context.span_id
    assert done["waited"].parent is not None and done["waited"].parent.span_id == call
    assert done["waited"].attributes == {"skilld.skill": "s"}
    assert done["refused"].attributes["error.type"] == "busy"
    assert done["waited"].start_time <= done["waited"].end_time


def test_a_malformed_tracestate_writes_no_log_line(caplog: pytest.LogCaptureFixture) -> None:
    """Once the MCP server is built (mcp_middleware, tracing on or off), a request's
    malformed tracestate, which OpenTelemetry warns about per member, logs nothing."""
    telemetry.mcp_middleware([])
    with caplog.at_level(logging.DEBUG):
        propagate.extract({"traceparent": VALID, "tracestate": ",".join(["bad member"] * 30)})
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry")]


def test_arguments_and_results_are_recorded_only_for_the_skills_opted_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A call span told to record (the skill's policy telemetry.record_arguments) carries
    its arguments and result (cut to 4 KiB); every other call's span has neither."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from skilld.types import CallOutput

    provider = TracerProvider()
    spans = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    state = telemetry._State(
        provider.get_tracer("test"), provider, None, None, None, trace, context
    )
    monkeypatch.setattr(telemetry, "_state", state)
    for skill in ("notes", "secrets"):
        arguments = json.dumps({"text": "x" * 5000})
        local = Caller.local()
        with telemetry.call_span(
            skill, "add", caller=local, depth=0, arguments=arguments, record=skill == "notes"
        ) as span:
            span.result(CallOutput({"id": 7}))
    done = {s.attributes["skilld.skill"]: s.attributes for s in spans.get_finished_spans()}
    assert len(done["notes"]["gen_ai.tool.call.arguments"]) == 4096
    assert done["notes"]["gen_ai.tool.call.result"] == '{"id":7}'
    assert "gen_ai.tool.call.arguments" not in done["secrets"]
    assert "gen_ai.tool.call.result" not in done["secrets"]
    assert done["secrets"]["skilld.outcome"] == "ok"


def test_skillds_spans_follow_the_parents_sampling_and_reach_the_exporter_through_the_handoff(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """skilld's spans (filled in place, handed over by their own thread) keep the parent's
    trace and sampled flag: under a sampled client context they reach the exporter once
    flushed, with their parent links; under an unsampled one none is exported, yet the
    context passed on (a script's TRACEPARENT) still names the client's trace; a write
    after a span ended is dropped."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = TracerProvider()
    spans = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracer = provider.get_tracer("test")
    handoff = telemetry._Handoff(tracer.span_processor, 100)  # type: ignore[attr-defined]
    state = telemetry._State(tracer, provider, None, None, None, trace, context, handoff)
    monkeypatch.setattr(telemetry, "_state", state)
    unsampled = VALID[:-2] + "00"
    try:
        for parent in (VALID, unsampled):
            with telemetry.joined({"traceparent": parent}):
                with telemetry.span("outer") as outer, telemetry.span("inner"):
                    env = telemetry.environ({})
                outer.span.set_attribute("late", True)
            assert env["TRACEPARENT"].split("-")[1] == VALID.split("-")[1]
            assert env["TRACEPARENT"].endswith(parent[-3:])
        assert telemetry.flush(10)
    finally:
        handoff.close()
    done = {s.name: s for s in spans.get_finished_spans()}
    assert sorted(done) == ["inner", "outer"]  # the unsampled pair was never exported
    outer_span, inner_span = done["outer"], done["inner"]
    assert f"{outer_span.context.trace_id:032x}" == VALID.split("-")[1]
    assert outer_span.parent is not None
    assert f"{outer_span.parent.span_id:016x}" == VALID.split("-")[2]
    assert inner_span.parent is not None
    assert inner_span.parent.span_id == outer_span.context.span_id
    assert "late" not in outer_span.attributes


def test_the_hand_off_fills_the_batch_processors_queue_and_any_processor_added_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ended spans reach the batch processor's exporter in the order they ended, and a
    full batch wakes its thread at once; once another processor is added, each span goes
    through on_end and reaches both."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = TracerProvider()
    batched = InMemorySpanExporter()
    # A schedule far away: only a full batch (or a flush) makes it export.
    provider.add_span_processor(
        BatchSpanProcessor(batched, max_export_batch_size=10, schedule_delay_millis=600_000)
    )
    tracer = provider.get_tracer("test")
    processor = tracer.span_processor  # type: ignore[attr-defined]
    handoff = telemetry._Handoff(processor, 1000)
    assert telemetry._batch_queue(processor) is not None  # the fast path is the one tried
    state = telemetry._State(tracer, provider, None, None, None, trace, context, handoff)
    monkeypatch.setattr(telemetry, "_state", state)
    try:
        for n in range(10):
            with telemetry.span(f"s{n}"):
                pass
        handoff.drain()
        deadline = time.monotonic() + 10
        while len(batched.get_finished_spans()) < 10 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [s.name for s in batched.get_finished_spans()] == [f"s{n}" for n in range(10)]
        simple = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(simple))
        with telemetry.span("later"):
            pass
        assert telemetry.flush(10)
        assert [s.name for s in simple.get_finished_spans()] == ["later"]
        assert batched.get_finished_spans()[-1].name == "later"
    finally:
        handoff.close()
        provider.shutdown()


def test_a_failed_call_on_the_request_span_says_its_error_and_a_late_one_gets_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A top-level call's facts go on the MCP SDK's request span: a refused call there
    sets error.type and skilld.error.code as its own span would; a call still running when
    the request span ended gets an execute_tool span with its outcome, under it."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from skilld.errors import SkillBusy

    provider = telemetry._provider_type()()
    spans = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    sdk = provider.get_tracer("mcp-python-sdk")
    state = telemetry._State(
        provider.get_tracer("skilld")._sdk, provider, None, None, None, trace, context
    )
    monkeypatch.setattr(telemetry, "_state", state)
    kind = trace.SpanKind.SERVER
    with (
        sdk.start_as_current_span("tools/call s/m", kind=kind) as request,
        pytest.raises(SkillBusy),
        telemetry.call_span("s", "m", caller=Caller.local(), depth=0, arguments="{}"),
    ):
        raise SkillBusy("s", 1)
    with sdk.start_as_current_span("tools/call s/m", kind=kind) as second:
        late = telemetry.call_span("s", "m", caller=Caller.local(), depth=0, arguments="{}")
        late.__enter__()
    late.__exit__(None, None, None)  # after the request span ended
    done = spans.get_finished_spans()
    first = next(s for s in done if s.context.span_id == request.get_span_context().span_id)
    assert first.attributes["skilld.skill"] == "s"
    assert first.attributes["skilld.outcome"] == "busy"
    assert first.attributes["error.type"] == "busy"
    assert "skilld.error.code" in first.attributes
    own = [s for s in done if s.name == "execute_tool s.m"]
    assert len(own) == 1 and own[0].attributes["skilld.outcome"] == "ok"
    assert own[0].parent is not None
    assert own[0].parent.span_id == second.get_span_context().span_id


@settings(max_examples=200)
@given(
    name=st.text(max_size=600),
    values=st.dictionaries(
        st.sampled_from(["jsonrpc.request.id", "gen_ai.tool.name", "mcp.method.name", "n"]),
        st.one_of(st.text(max_size=600), st.integers(), st.booleans()),
    ),
)
def test_the_request_spans_take_at_most_256_characters_of_any_client_text(
    name: str, values: dict[str, Any]
) -> None:
    """Whatever name and attribute values the MCP SDK's middleware passes (a request's
    method, tool name, id: the client's text), the request span keeps at most 256
    characters of each, the rest of its values as they were, and a status without its
    description."""
    from opentelemetry.trace import SpanKind, StatusCode

    provider = telemetry._provider_type()()
    tracer = provider.get_tracer("mcp-python-sdk")
    with tracer.start_as_current_span(name, kind=SpanKind.SERVER, attributes=values) as span:
        span.set_status(StatusCode.ERROR, "Unknown tool: " + name)
    assert span.name == name[:256]
    assert dict(span.attributes) == {
        key: value[:256] if isinstance(value, str) else value for key, value in values.items()
    }
    assert (span.status.status_code, span.status.description) == (StatusCode.ERROR, None)


def test_a_span_keeps_at_most_128_events_128_links_and_256_characters_of_name(on: None) -> None:
    """A host function asked about many targets, or a request linked to many others,
    leaves at most 128 events and 128 links on its span, as the SDK's default limits."""
    provider = telemetry._provider_type()()
    span = provider.get_tracer("mcp-python-sdk").start_span("tools/call t")
    target = trace.SpanContext(1, 2, is_remote=True)
    for i in range(1000):
        span.add_event("skilld.permission", {"n": i})
        span.add_link(target, {"n": i})
    span.update_name("x" * 1000)  # as a library may rename it: cut as when it was made
    span.end()
    assert len(span.events) == len(span.links) == 128
    assert span.name == "x" * 256
    assert span.events[-1].attributes["n"] == 127


def test_the_request_metric_takes_at_most_256_characters_of_the_clients_method(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """mcp.server.operation.duration is recorded before the SDK finds a method has no
    handler: a method of any length is recorded cut to 256 characters (the SDK keeps up
    to 2,000 series an instrument, each with its attributes)."""
    import anyio

    recorded: list[dict[str, Any]] = []

    class Histogram:
        def record(self, value: float, attributes: dict[str, Any]) -> None:
            recorded.append(attributes)

    provider = TracerProvider()
    state = telemetry._State(
        provider.get_tracer("test"), provider, None, Histogram(), None, trace, context
    )
    monkeypatch.setattr(telemetry, "_state", state)

    async def handler(ctx: Any) -> str:
        return "ok"

    ctx = _Ctx(None, {})
    ctx.method = "m" * 5000
    ctx.protocol_version = "v" * 5000
    assert anyio.run(telemetry._outer, ctx, handler) == "ok"
    [facts] = recorded
    assert facts["mcp.method.name"] == "m" * 256
    assert facts["mcp.protocol.version"] == "v" * 256


def test_a_nested_calls_span_takes_at_most_256_characters_of_the_guests_method(on: None) -> None:
    """A guest names the method of the skill it invokes, unchecked until the callee runs:
    the call's span keeps at most 256 characters of it, in its name and attributes."""
    caller = Caller.local().as_skill("outer")
    with telemetry.call_span("echo", "m" * 100_000, caller=caller, depth=1, arguments="{}") as call:
        span = call.span
    assert span.name == "execute_tool echo." + "m" * 256
    assert span.attributes["skilld.method"] == "m" * 256
    assert span.attributes["gen_ai.tool.name"] == "echo." + "m" * 256
