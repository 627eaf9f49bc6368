"""Operator control: off by default with every hook a no-op; on, no connection until there
are spans, one warning for a missing collector; the HTTP traceparent header as the parent."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from skilld import telemetry
from skilld.bundle import build_bundle
from skilld.sandbox import Sandbox
from skilld.types import Caller
from support.env import SKILLS, cache_dir
from support.otlp import Receiver, otlp_grpc_receiver, otlp_receiver
from support.serve_process import ServeProcess

pytestmark = pytest.mark.anyio

MODERN = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"
META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
}


def test_off_by_default_every_hook_is_a_no_op() -> None:
    """Without OTEL_TRACES_EXPORTER=otlp tracing stays off and each hook returns at once:
    the shared no-op span, no carrier, the same environment, the same function, the
    middleware list untouched."""
    assert not telemetry.configure(environ={})
    assert not telemetry.configure(environ={"OTEL_TRACES_EXPORTER": "none"})
    assert not telemetry.configure(environ={"OTEL_TRACES_EXPORTER": "zipkin"})
    assert not telemetry.enabled()
    assert telemetry.span("x") is telemetry.NOOP
    call = telemetry.call_span("s", "m", caller=Caller.local(), depth=0, arguments="{}")
    assert call is telemetry.NOOP
    assert telemetry.carrier() == {}
    env = {"A": "1"}
    assert telemetry.environ(env) == {"A": "1"}

    def fn() -> int:
        return 1

    assert telemetry.carry(fn) is fn
    parent = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    assert telemetry.joined(parent) is telemetry.NOOP
    chain: list[Any] = ["sdk"]
    telemetry.mcp_middleware(chain)
    assert chain == ["sdk"]


# Configures tracing as `skilld serve` does, says so, waits for "go", then makes spans in
# three batches and shuts down (the flush is bounded).
_SCRIPT = """
import logging, sys
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
from skilld import telemetry
from opentelemetry import trace
assert telemetry.configure(node="n1")
print("configured", flush=True)
sys.stdin.readline()
provider = trace.get_tracer_provider()
for batch in range(3):
    for n in range(5):
        with telemetry.span(f"s{batch}.{n}"):
            pass
    provider.force_flush(5000)
telemetry.shutdown()
print("done", flush=True)
"""


# The MCP SDK's module tracer while tracing is on, and after it was turned off.
_SDK_TRACER_SCRIPT = """
from mcp.shared import _otel
from opentelemetry.trace import ProxyTracer, SpanKind
from skilld import telemetry
assert isinstance(_otel._tracer, ProxyTracer)
assert telemetry.configure(node="n1")
with _otel.otel_span("tools/call t", kind=SpanKind.SERVER, attributes={"k": "v" * 999}) as span:
    assert type(span) is telemetry._recorded_type(), type(span)
    assert span.name == "tools/call t" and len(span.attributes["k"]) == 256
telemetry.shutdown()
assert isinstance(_otel._tracer, ProxyTracer), _otel._tracer
print("ok")
"""


def test_the_sdks_request_spans_are_made_by_skillds_tracer_while_tracing_is_on() -> None:
    """Configured, the MCP SDK's tracer (a ProxyTracer made at its import) is skilld's
    provider's own, which cuts the client's texts; shut down, the proxy is back."""
    env = {
        **os.environ,
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
    }
    done = subprocess.run(
        [sys.executable, "-c", _SDK_TRACER_SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.stdout.strip() == "ok", done.stderr


@pytest.fixture
def silent_collector() -> Iterator[tuple[socket.socket, list[int]]]:
    """A listening socket that takes connections and closes them unanswered; the count."""
    server = socket.create_server(("127.0.0.1", 0))
    seen: list[int] = []
    yield server, seen
    server.close()


def test_a_missing_collector_costs_no_connection_at_start_and_one_warning(
    silent_collector: tuple[socket.socket, list[int]],
) -> None:
    """Configured, the node opens no connection before it has spans; when the collector
    does not answer, three failed batches give one warning and nothing else is logged."""
    server, _seen = silent_collector
    port = server.getsockname()[1]
    env = {
        **os.environ,
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", _SCRIPT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "configured"
        # Nothing connected while there were no spans (the backlog would hold it).
        server.settimeout(0.5)
        with pytest.raises(TimeoutError):
            server.accept()
        connections: list[int] = []

        def refuse() -> None:
            server.settimeout(None)
            while True:
                try:
                    conn, _ = server.accept()
                except OSError:
                    return
                connections.append(1)
                conn.close()

        threading.Thread(target=refuse, daemon=True).start()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert out.strip() == "done", err
    assert connections, "the exporter never tried to send"
    warnings = [line for line in err.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert len(warnings) == 1, err
    assert "collector did not take a batch" in warnings[0]
    assert f"127.0.0.1:{port}" in warnings[0]


def _bundle(sandbox: Sandbox, root: Path, policies: dict[str, str]) -> Path:
    """A bundle in ``root`` of the test skills ``policies`` names, each under its policy."""
    (root / "policies").mkdir()
    for skill, policy in policies.items():
        shutil.copytree(SKILLS[skill], root / "skills" / skill)
        (root / "policies" / f"{skill}.yaml").write_text(policy)
    out = root / "bundle"
    build_bundle(
        root / "skills",
        root / "policies",
        out,
        sandbox=sandbox,
        cache_dir=cache_dir(),
        strict=False,
    )
    return out


@pytest.fixture(scope="module")
def echo_bundle(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """echo, whose tool may run as a task."""
    return _bundle(
        sandbox,
        tmp_path_factory.mktemp("echo"),
        {"echo": "skill: echo\nmcp:\n  tasks: {echo: optional}\n"},
    )


@pytest.fixture(scope="module")
def opted_in_bundle(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """echo opted in to recording its arguments (policy), echo-wat not."""
    return _bundle(
        sandbox,
        tmp_path_factory.mktemp("opted"),
        {
            "echo": "skill: echo\ntelemetry:\n  record_arguments: true\n",
            "echo-wat": "skill: echo-wat\n",
        },
    )


async def test_arguments_are_recorded_only_for_the_skill_whose_policy_opts_in(
    opted_in_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A skill whose policy says telemetry.record_arguments has its call's arguments and
    result on its span; the other skill's call, with the same text, has neither."""
    with otlp_receiver() as receiver:
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        node = ServeProcess(opted_in_bundle, tmp_path / "state")
        try:
            for tool in ("echo/echo", "echo-wat/echo"):
                params = {"name": tool, "arguments": {"text": "opt-in-7f3a"}}
                answer = await _rpc(node.url, "tools/call", params, {})
                assert "error" not in answer, answer
            # A call the request runs has its facts on the request's span.
            names = {"tools/call echo/echo", "tools/call echo-wat/echo"}
            spans = receiver.wait(lambda s: names <= {x.name for x in s})
        finally:
            node.stop()
    calls = {s.name: s.attributes for s in spans if s.name in names}
    opted = calls["tools/call echo/echo"]
    assert opted["skilld.skill"] == "echo" and opted["skilld.outcome"] == "ok", opted
    assert "opt-in-7f3a" in opted["gen_ai.tool.call.arguments"]
    assert "opt-in-7f3a" in opted["gen_ai.tool.call.result"]
    assert calls["tools/call echo-wat/echo"]["skilld.skill"] == "echo-wat"
    for s in spans:
        if s.name != "tools/call echo/echo":
            assert "opt-in-7f3a" not in json.dumps([s.attributes, s.events], default=str), s.name


async def test_spans_go_over_otlp_grpc_when_the_protocol_says_so(
    echo_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OTEL_EXPORTER_OTLP_PROTOCOL=grpc sends the request's and the call's spans over
    OTLP/gRPC to a gRPC receiver, in the client's trace."""
    with otlp_grpc_receiver() as receiver:
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        monkeypatch.setenv("SKILLD_TRACE_STAGE_MIN_MS", "0")  # the echo's run a span too
        node = ServeProcess(echo_bundle, tmp_path / "state")
        try:
            answer = await _call(node.url, "g", {"traceparent": IN_META}, {})
            assert "error" not in answer, answer
            names = {"tools/call echo/echo", "skilld.guest.run"}
            spans = receiver.wait(lambda s: names <= {x.name for x in s})
        finally:
            node.stop()
    ours = {s.name: s for s in spans if s.name in names}
    assert {s.trace_id for s in ours.values()} == {"3" * 32}
    assert ours["skilld.guest.run"].parent_id == ours["tools/call echo/echo"].span_id
    assert ours["tools/call echo/echo"].attributes["skilld.method"] == "echo"


@pytest.fixture
def traced_node(
    echo_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Receiver, ServeProcess]]:
    with otlp_receiver() as receiver:
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        monkeypatch.setenv("SKILLD_TRACE_STAGE_MIN_MS", "0")  # every stage a span
        node = ServeProcess(echo_bundle, tmp_path / "state")
        try:
            yield receiver, node
        finally:
            node.stop()


async def _call(url: str, text: str, meta: dict[str, Any], headers: dict[str, str]) -> Any:
    params = {"name": "echo/echo", "arguments": {"text": text}}
    return await _rpc(url, "tools/call", params, meta, headers)


async def _rpc(
    url: str,
    method: str,
    params: dict[str, Any],
    meta: dict[str, Any],
    headers: dict[str, str] | None = None,
    ident: Any = 1,
) -> Any:
    body = {
        "jsonrpc": "2.0",
        "id": ident,
        "method": method,
        "params": {**params, "_meta": {**META, **meta}},
    }
    named = params.get("name") or params.get("taskId")
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(
            url,
            json=body,
            headers={
                "Accept": "application/json, text/event-stream",
                "MCP-Protocol-Version": MODERN,
                "Mcp-Method": method,
                **({"Mcp-Name": str(named)} if named else {}),
                **(headers or {}),
            },
        )
    if response.headers.get("content-type", "").startswith("application/json"):
        return response.json()
    data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
    return json.loads(data[-1])


HEADER = "00-11111111111111111111111111111111-2222222222222222-01"
CREATE = "00-55555555555555555555555555555555-6666666666666666-01"
GET = "00-77777777777777777777777777777777-8888888888888888-01"
IN_META = "00-33333333333333333333333333333333-4444444444444444-01"


async def test_the_http_traceparent_header_is_the_parent_when_meta_has_none(
    traced_node: tuple[Receiver, ServeProcess],
) -> None:
    """A request whose _meta has no traceparent is parented by its HTTP traceparent
    header; one with both is parented by _meta's (the MCP convention comes first)."""
    receiver, node = traced_node
    first = await _call(node.url, "a", {}, {"traceparent": HEADER})
    second = await _call(node.url, "b", {"traceparent": IN_META}, {"traceparent": HEADER})
    assert "error" not in first and "error" not in second, (first, second)
    # Every span read below (a node's spans may reach the receiver in more than one batch).
    spans = receiver.wait(
        lambda s: (
            sum(x.name == "tools/call echo/echo" for x in s) == 2
            and any(x.name == "skilld.guest.run" and x.trace_id == "1" * 32 for x in s)
        )
    )
    servers = {s.trace_id: s for s in spans if s.name == "tools/call echo/echo"}
    assert servers["1" * 32].parent_id == "2" * 16
    assert servers["3" * 32].parent_id == "4" * 16
    for server in servers.values():
        assert server.kind == "server"
        assert server.attributes["network.transport"] == "tcp"
    # The call's facts on it, and its stages beneath it, in the same trace.
    assert servers["1" * 32].attributes["skilld.outcome"] == "ok"
    assert "skilld.caller" in servers["1" * 32].attributes
    run = next(s for s in spans if s.name == "skilld.guest.run" and s.trace_id == "1" * 32)
    assert run.parent_id == servers["1" * 32].span_id
    assert not any(s.name.startswith("execute_tool") for s in spans)


async def test_a_short_guest_run_with_nothing_traced_in_it_is_no_span_by_default(
    echo_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under SKILLD_TRACE_STAGE_MIN_MS (default 1 ms) an echo's guest run, which makes no
    host call, is no span: the request span, with the call's facts, is the whole trace."""
    with otlp_receiver() as receiver:
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        # Longer than any echo takes, so the test cannot depend on the machine's speed.
        monkeypatch.setenv("SKILLD_TRACE_STAGE_MIN_MS", "60000")
        node = ServeProcess(echo_bundle, tmp_path / "state")
        try:
            for text in ("a", "b", "c"):
                answer = await _call(node.url, text, {"traceparent": HEADER}, {})
                assert "error" not in answer, answer
            spans = receiver.wait(lambda s: sum(x.name == "tools/call echo/echo" for x in s) == 3)
        finally:
            node.stop()
    assert not [s.name for s in spans if s.name != "tools/call echo/echo"]
    for server in spans:
        assert (server.trace_id, server.parent_id) == ("1" * 32, "2" * 16)
        assert server.attributes["skilld.outcome"] == "ok"


async def test_every_request_about_a_task_links_to_the_request_that_created_it(
    traced_node: tuple[Receiver, ServeProcess],
) -> None:
    """A task made by one request (trace C) and asked after by another (trace G): the
    call runs in C; the tasks/get span, in G, links to C's request span."""
    receiver, node = traced_node
    tasks = {"io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS: {}}}}
    created = await _call(node.url, "later", {**tasks, "traceparent": CREATE}, {})
    assert created["result"]["resultType"] == "task", created
    task_id = created["result"]["taskId"]
    asked = await _rpc(node.url, "tasks/get", {"taskId": task_id}, {**tasks, "traceparent": GET})
    assert "error" not in asked, asked
    spans = receiver.wait(
        lambda s: (
            any(x.name.startswith("tasks/get") for x in s)
            and any(x.name == "execute_tool echo.echo" for x in s)
            and any(x.name == "tools/call echo/echo" for x in s)
        )
    )
    create = next(s for s in spans if s.name == "tools/call echo/echo")
    get = next(s for s in spans if s.name.startswith("tasks/get"))
    call = next(s for s in spans if s.name == "execute_tool echo.echo")
    assert create.trace_id == call.trace_id == "5" * 32
    assert get.trace_id == "7" * 32
    assert ("5" * 32, create.span_id) in get.links, get.links


async def test_what_a_client_names_reaches_its_span_cut_short(
    traced_node: tuple[Receiver, ServeProcess],
) -> None:
    """A request's tool name and id are the client's to choose (an id up to the body's
    4 MiB, a name as long as its ``Mcp-Name`` header may be): its span carries at most
    256 characters of each (its name, its attributes, its status), so no request makes
    the server keep or export megabytes of spans."""
    receiver, node = traced_node
    name, ident = "n" * 8000, "i" * (1 << 20)
    answer = await _rpc(node.url, "tools/call", {"name": name, "arguments": {}}, {}, ident=ident)
    assert "error" in answer  # no such tool
    spans = receiver.wait(lambda s: any(x.name.startswith("tools/call nnn") for x in s))
    [span] = [s for s in spans if s.name.startswith("tools/call nnn")]
    assert len(span.name) <= 256
    longest = max((v for v in span.attributes.values() if isinstance(v, str)), key=len)
    assert len(longest) <= 256, {k: len(str(v)) for k, v in span.attributes.items()}
    assert max(len(b) for b in receiver.bodies) < 64 * 1024
    # Its status says it failed, without the error's message (which quotes the name).
    assert span.status == 2  # ERROR
    messages = []
    for data in receiver.bodies:
        request = trace_service_pb2.ExportTraceServiceRequest.FromString(data)
        messages += [
            s.status.message
            for r in request.resource_spans
            for scope in r.scope_spans
            for s in scope.spans
        ]
    assert not any(messages), messages


async def test_a_calls_log_line_keeps_at_most_128_characters_of_its_request_id(
    echo_bundle: Path, tmp_path: Path
) -> None:
    """Each call's ``tool_call`` log line names its JSON-RPC id, which is the client's
    to choose (up to the body's 4 MiB): the line keeps at most 128 characters of it, so
    no client fills the server's log (or, in the image, Docker's) a megabyte a call."""
    node = ServeProcess(echo_bundle, tmp_path / "state")
    try:
        params = {"name": "echo/echo", "arguments": {"text": "x"}}
        answer = await _rpc(node.url, "tools/call", params, {}, ident="i" * (1 << 20))
        assert "error" not in answer, str(answer)[-300:]
        line = node.wait_for("tool_call")
    finally:
        node.stop()
    assert line["outcome"] == "ok"
    assert line["request_id"] == "i" * 128 + "..."
    assert node.stderr_bytes < 64 * 1024
