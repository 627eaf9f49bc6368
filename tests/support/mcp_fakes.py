"""A fake Dispatcher and client plumbing shared by the MCP layer's tests."""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anyio
import httpx2
import pytest
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.sse import sse_client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.memory import create_client_server_memory_streams

from skilld.errors import (
    DeadlineExceeded,
    GuestError,
    GuestTrap,
    HostCallError,
    MemoryExhausted,
    PermissionDenied,
    UsageError,
)
from skilld.mcp import HttpServer, ServeConfig, Wiring, serve_http_async
from skilld.mcp._logging import make_logger
from skilld.mcp._metrics import Metrics
from skilld.mcp._server import McpService
from skilld.registry import Dispatcher, ToolAnnotations
from skilld.types import CallOutput, ClientChannel, ContentBlock, PromptSpec, ResourceSpec
from support.callers import open_to_authenticated
from support.static_dispatcher import ECHO_SCHEMA, StaticDispatcher, static_tool

T = TypeVar("T")

TESTS = Path(__file__).resolve().parent.parent  # tests/: the server runs from there


@dataclass
class Gate:
    """Lets a test hold a fake guest call open and see what it observed."""

    started: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    saw_cancel: threading.Event = field(default_factory=threading.Event)


def _wait(gate: Gate) -> Any:
    def run(args: Mapping[str, Any], ch: ClientChannel) -> Any:
        gate.started.set()
        # A guest polling the host's cancelled() between units of work, as a real one does.
        while not gate.release.wait(0.005):
            if ch.cancelled():
                gate.saw_cancel.set()
                raise GuestError("cancelled", "stopped on request")
        return {"released": True}

    return run


def _progress(args: Mapping[str, Any], ch: ClientChannel) -> Any:
    for step in range(1, 4):
        ch.progress(step, 3, f"step {step}")
    ch.log("info", {"msg": "working", "steps": 3})
    ch.log("debug", "fine detail")
    return {"done": True}


def _noisy(args: Mapping[str, Any], ch: ClientChannel) -> Any:
    # Stray output from a careless skill or library must never reach the protocol stream.
    print("stray print to stdout")
    sys.stdout.flush()
    os.write(1, b"stray write to fd 1\n")
    return {"quiet": True}


def _nested(args: Mapping[str, Any], ch: ClientChannel) -> Any:
    # A dispatcher may run part of a call on a thread of its own (an invoke of another skill).
    inner = threading.Thread(
        target=lambda: (ch.log("warning", "from a nested thread"), ch.progress(1, 1, None))
    )
    inner.start()
    inner.join()
    return {"nested": True}


def _raise(exc: Exception) -> Any:
    def run(args: Mapping[str, Any], ch: ClientChannel) -> Any:
        raise exc

    return run


def _sample(args: Mapping[str, Any], ch: ClientChannel) -> Any:
    result = ch.sample(
        {
            "messages": [{"role": "user", "content": {"type": "text", "text": args["prompt"]}}],
            "maxTokens": 10,
        }
    )
    return {"answer": result["content"]["text"], "model": result["model"]}


def _elicit(args: Mapping[str, Any], ch: ClientChannel) -> Any:
    return dict(
        ch.elicit(
            {
                "message": "Who are you?",
                "requestedSchema": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}},
                },
            }
        )
    )


DESTRUCTIVE = ToolAnnotations(read_only=False, destructive=True, idempotent=False, open_world=True)


def fake_dispatcher(gate: Gate | None = None) -> StaticDispatcher:
    """The tools every transport test uses, named after what they do; every
    authenticated caller may use them (``support.callers.ALL_AUTHENTICATED``)."""
    gate = gate or Gate()
    prompt_args = {
        "type": "object",
        "properties": {"tone": {"type": "string", "enum": ["formal", "friendly", "fierce"]}},
        "required": ["tone"],
    }
    dispatcher = StaticDispatcher(
        tools_=[
            static_tool(
                "notes/echo",
                lambda a, c: {"text": a["text"]},
                input_schema=ECHO_SCHEMA,
                skill_id="notes",
            ),
            static_tool(
                "notes/structured",
                lambda a, c: {"count": 3},
                output_schema={"type": "object", "properties": {"count": {"type": "integer"}}},
                skill_id="notes",
            ),
            static_tool(
                "notes/number",
                lambda a, c: 42,
                output_schema={"type": "integer"},
                skill_id="notes",
            ),
            static_tool(
                "notes/rich",
                lambda a, c: CallOutput(
                    {"ok": True},
                    (
                        ContentBlock("text", text="hello"),
                        ContentBlock("image", mime_type="image/png", data=b"\x89PNG"),
                        ContentBlock("audio", mime_type="audio/wav", data=b"RIFF"),
                        ContentBlock("embedded", uri="note://1", mime_type="text/plain", text="n1"),
                        ContentBlock("embedded", uri="note://2", data=b"\x00\x01"),
                    ),
                ),
                skill_id="notes",
                annotations=DESTRUCTIVE,
                title="Rich output",
            ),
            static_tool("work/progress", _progress, skill_id="work"),
            static_tool("work/noisy", _noisy, skill_id="work"),
            static_tool("work/nested", _nested, skill_id="work"),
            static_tool("work/wait", _wait(gate), skill_id="work"),
            static_tool(
                "net/fetch",
                _raise(HostCallError("not-permitted", "http GET https://x.test refused", rule="x")),
                skill_id="net",
            ),
            static_tool(
                "net/denied",
                _raise(PermissionDenied("fs read /etc/passwd refused", rule="fs-deny-etc")),
                skill_id="net",
            ),
            static_tool(
                "bad/guest", _raise(GuestError("not-found", "no such note")), skill_id="bad"
            ),
            static_tool("bad/trap", _raise(GuestTrap("unreachable executed")), skill_id="bad"),
            static_tool("bad/slow", _raise(DeadlineExceeded("ran past 10 s")), skill_id="bad"),
            static_tool("bad/memory", _raise(MemoryExhausted("over 256 MiB")), skill_id="bad"),
            static_tool("bad/usage", _raise(UsageError("method needs 'id'")), skill_id="bad"),
            static_tool("bad/bug", _raise(ZeroDivisionError("oops")), skill_id="bad"),
            static_tool(
                "ask/sample",
                _sample,
                input_schema={
                    "type": "object",
                    "properties": {"prompt": {"type": "string"}},
                    "required": ["prompt"],
                },
                skill_id="ask",
            ),
            static_tool("ask/elicit", _elicit, skill_id="ask"),
        ],
        resources_=[
            (
                ResourceSpec("note://readme", "readme", "The readme", "text/markdown"),
                lambda u, v, c: "# Notes",
            ),
            (
                ResourceSpec("note://wait", "wait", "Held open by the gate"),
                lambda u, v, c: _wait(gate)({}, c),
            ),
            (
                ResourceSpec("note://{id}", "note", "One note", template=True),
                lambda u, v, c: {"id": v["id"]},
            ),
        ],
        prompts_=[
            (
                PromptSpec("greet", "Greet someone", prompt_args),
                lambda a: [
                    {"role": "user", "content": {"type": "text", "text": f"Be {a['tone']}."}}
                ],
            ),
        ],
    )
    return open_to_authenticated(dispatcher)


# -- clients ---------------------------------------------------------------------


@dataclass
class Inbox:
    """What the client received besides responses."""

    logs: list[types.LoggingMessageNotificationParams] = field(default_factory=list)
    progress: list[tuple[float, float | None, str | None]] = field(default_factory=list)

    async def on_log(self, params: types.LoggingMessageNotificationParams) -> None:
        self.logs.append(params)

    async def on_progress(self, progress: float, total: float | None, message: str | None) -> None:
        self.progress.append((progress, total, message))


async def _sampling(
    context: Any, params: types.CreateMessageRequestParams
) -> types.CreateMessageResult:
    first = params.messages[0].content
    text = first.text if isinstance(first, types.TextContent) else "?"
    return types.CreateMessageResult(
        role="assistant",
        content=types.TextContent(type="text", text=f"echo: {text}"),
        model="fake-model",
    )


async def _elicitation(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"name": "Ada"})


def _session(read: Any, write: Any, inbox: Inbox) -> ClientSession:
    return ClientSession(
        read,
        write,
        logging_callback=inbox.on_log,
        sampling_callback=_sampling,
        elicitation_callback=_elicitation,
    )


@asynccontextmanager
async def running_http(
    dispatcher: Dispatcher, config: ServeConfig | None = None, wiring: Wiring | None = None
) -> AsyncIterator[HttpServer]:
    """A real uvicorn server on a free port, stopped (gracefully) on exit; ``wiring``: a
    node's (``Node.serving``), as ``skilld serve`` wires it."""
    config = config or ServeConfig(transport="http", port=0)
    async with anyio.create_task_group() as tg:
        server: HttpServer = await tg.start(
            functools.partial(serve_http_async, wiring=wiring), dispatcher, config
        )
        try:
            yield server
        finally:
            server.stop()


def memory_service(
    dispatcher: Dispatcher, config: ServeConfig | None = None, wiring: Wiring | None = None
) -> McpService:
    """An MCP service over ``dispatcher`` for :func:`memory_session`, logging only errors;
    ``wiring``: a node's (``Node.serving``), as ``skilld serve`` wires it."""
    return McpService(
        dispatcher,
        config or ServeConfig(),
        make_logger(ServeConfig(log_level="error")),
        Metrics(),
        wiring,
    )


@asynccontextmanager
async def memory_session(
    service: McpService, inbox: Inbox | None = None
) -> AsyncIterator[ClientSession]:
    """An initialized SDK client session to ``service`` over in-memory streams."""
    async with (
        create_client_server_memory_streams() as (client, srv),
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(
            lambda: service.server.run(
                srv[0], srv[1], service.server.create_initialization_options()
            )
        )
        async with _session(client[0], client[1], inbox or Inbox()) as s:
            await s.initialize()
            yield s
        tg.cancel_scope.cancel()


@asynccontextmanager
async def connect(
    transport: str,
    dispatcher: Dispatcher | None = None,
    inbox: Inbox | None = None,
    headers: Mapping[str, str] | None = None,
) -> AsyncIterator[ClientSession]:
    """An initialized SDK client session to a fake dispatcher over ``transport``."""
    inbox = inbox or Inbox()
    if transport == "stdio":
        params = StdioServerParameters(
            command=sys.executable, args=["-m", "support.serve_fake"], cwd=TESTS
        )
        async with stdio_client(params) as (read, write), _session(read, write, inbox) as s:
            await s.initialize()
            yield s
        return
    if transport == "memory":
        async with memory_session(memory_service(dispatcher or fake_dispatcher()), inbox) as s:
            yield s
        return
    async with running_http(dispatcher or fake_dispatcher()) as server:
        base = f"http://127.0.0.1:{server.port}"
        if transport == "sse":
            async with (
                sse_client(f"{base}/sse", headers=dict(headers or {})) as (read, write),
                _session(read, write, inbox) as s,
            ):
                await s.initialize()
                yield s
        else:
            async with (
                httpx2.AsyncClient(headers=dict(headers or {}), timeout=30) as http,
                streamable_http_client(server.url, http_client=http) as (read, write),
                _session(read, write, inbox) as s,
            ):
                await s.initialize()
                yield s


def text_of(result: types.CallToolResult) -> str:
    """The text blocks of a result, joined."""
    return "\n".join(b.text for b in result.content if isinstance(b, types.TextContent))


@asynccontextmanager
async def serving_callers(
    registry: Any, directory: Path, *names: str, **config: Any
) -> AsyncIterator[HttpServer]:
    """``registry`` over HTTP, open to any authenticated caller, to the named callers
    (``names``, alice and mallory when none; tokens by :func:`client_tokens` in
    ``directory``), with ``config`` for the rest of its :class:`ServeConfig`."""
    tokens = client_tokens(directory, *(names or ("alice", "mallory")))
    served = ServeConfig(transport="http", port=0, token_file=tokens, **config)
    async with running_http(open_to_authenticated(registry), served) as server:
        yield server


def callers_server(*names: str, registry: str = "conformance_exposed", **config: Any) -> Any:
    """A pytest fixture: the registry of the fixture named ``registry`` (a pair whose first
    item is the registry, as tests/mcp's ``conformance_exposed``) served by
    :func:`serving_callers` to ``names`` with ``config``. ``server = callers_server(...)``
    in a test module declares its ``server`` fixture."""

    @pytest.fixture
    async def server(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[HttpServer]:
        pair = request.getfixturevalue(registry)
        async with serving_callers(pair[0], tmp_path, *names, **config) as srv:
            yield srv

    return server


def client_tokens(directory: Path, *names: str) -> Path:
    """A private token file with one caller per name in ``names``, each token being
    :func:`token_of` its name (``NAME TOKEN`` per line, mode 0600)."""
    path = directory / "tokens"
    path.write_text("".join(f"{name} {token_of(name)}\n" for name in names))
    path.chmod(0o600)
    return path


def token_of(name: str) -> str:
    """The bearer token :func:`client_tokens` gives the caller ``name`` (long enough)."""
    return f"{name}-" + "t" * 32


async def as_caller(url: str, who: str, fn: Callable[[ClientSession], Awaitable[T]]) -> T:
    """What ``fn`` returns of an initialized MCP session to ``url`` (Streamable HTTP) as the
    caller ``who``, whose bearer token is :func:`token_of` its name."""
    headers = {"Authorization": f"Bearer {token_of(who)}"}
    async with (
        httpx2.AsyncClient(timeout=120, headers=headers) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        return await fn(session)
