"""A real MCP client cancels calls parked in host calls: their concurrency slots free at once;
a request to the client that a call gave up on is abandoned."""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
from mcp.client.session import ClientSession
from mcp.shared.memory import create_client_server_memory_streams

from skilld.audit import MemorySink
from skilld.errors import GuestError
from skilld.mcp._channel import SessionChannel
from skilld.permissions import SkillPermissions
from skilld.policy import compile_policies
from skilld.registry import NullChannel, Registry, SkillEntry
from skilld.sandbox import CallContext, Sandbox
from skilld.types import ClientChannel
from support.mcp_fakes import connect, memory_service, text_of
from support.static_dispatcher import StaticDispatcher, static_tool

pytestmark = pytest.mark.anyio

POLICY = """\
limits:
  wall_time: 60s
  concurrency: 1
tcp:
  - id: peer
    host: 127.0.0.1
    ports: [{T}]
http:
  - id: web
    url: http://127.0.0.1:{T}/
"""


class Holder:
    """A peer on 127.0.0.1 that takes connections and never answers."""

    def __init__(self) -> None:
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(16)
        self.port = self.srv.getsockname()[1]
        self.accepted = threading.Event()
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.srv.accept()
            except OSError:
                return
            self.conns.append(conn)
            self.accepted.set()

    def close(self) -> None:
        """Stop accepting and drop every connection."""
        self.srv.close()
        for conn in self.conns:
            conn.close()


@pytest.fixture
def holder() -> Iterator[Holder]:
    """A peer that holds every connection."""
    peer = Holder()
    yield peer
    peer.close()


@pytest.fixture
def registry(
    sandbox: Sandbox,
    component_path: Callable[[str], Path],
    tmp_path: Path,
    holder: Holder,
) -> tuple[Registry, MemorySink]:
    """The prober, one call at a time, allowed to reach the holding peer."""
    (tmp_path / "prober.yaml").write_text(POLICY.replace("{T}", str(holder.port)))
    result = compile_policies(tmp_path, {"prober": None})
    assert not result.problems, result.problems
    checker = SkillPermissions.from_tables(result.tables, "prober")
    comp = sandbox.load(component_path("prober").read_bytes(), name="prober")
    sink = MemorySink()
    reg = Registry(audit=sink)
    spec = comp.describe(CallContext("prober", checker.limits, NullChannel()))
    reg.add(
        SkillEntry(
            spec=dataclasses.replace(spec, id="prober"),
            component=comp,
            limits=checker.limits,
            checker=checker,
        )
    )
    reg.mark_ready()
    return reg, sink


PARKED: list[tuple[str, str, dict[str, Any]]] = [
    ("tcp-receive", "prober/tcp_hold", {"host": "127.0.0.1", "timeout_ms": 600_000}),
    ("http-response", "prober/http_timed", {"timeout_ms": 600_000}),
]


@pytest.mark.parametrize(("name", "tool", "args"), PARKED, ids=[p[0] for p in PARKED])
async def test_cancel_frees_the_slot_at_once(
    registry: tuple[Registry, MemorySink],
    holder: Holder,
    name: str,
    tool: str,
    args: dict[str, Any],
) -> None:
    """With one slot, a call parked in a host call is cancelled by the client, and the next call
    gets the slot at once (before, it waited for the peer: ten minutes)."""
    reg, sink = registry
    args = dict(args)
    if "http" in name:
        args["url"] = f"http://127.0.0.1:{holder.port}/hold"
    else:
        args["port"] = holder.port
    with anyio.fail_after(60):
        async with connect("memory", reg) as session:
            for _ in range(3):
                holder.accepted.clear()
                async with anyio.create_task_group() as tg:
                    tg.start_soon(session.call_tool, tool, args)
                    # The guest is parked in its host call once the peer has the connection.
                    assert await anyio.to_thread.run_sync(holder.accepted.wait, 30)
                    tg.cancel_scope.cancel()
                with anyio.fail_after(2):
                    after = await session.call_tool("prober/fs_stat", {"path": "/"})
                assert "not-permitted" in text_of(after)
    assert [r["method"] for r in sink.records] == [tool.split("/")[1], "fs_stat"] * 3


async def test_an_abandoned_sampling_request_ends_at_once() -> None:
    """A sampling request the call gave up on (its deadline came) is abandoned on the session:
    the thread waiting for the client's answer is released at once, not after 300 s."""
    asked = threading.Event()
    seen: dict[str, Any] = {}

    def tool(args: Mapping[str, Any], channel: ClientChannel) -> Any:
        answered = threading.Event()

        def ask() -> None:
            try:
                channel.sample({"messages": [], "maxTokens": 1})
            except GuestError as exc:
                seen["code"] = exc.code
            answered.set()

        threading.Thread(target=ask, daemon=True).start()
        assert asked.wait(10)
        cast(SessionChannel, channel).abandon_requests()
        return {"released": answered.wait(2), "code": seen.get("code")}

    async def never_answers(context: Any, params: Any) -> Any:
        asked.set()
        await anyio.sleep_forever()

    service = memory_service(StaticDispatcher(tools_=[static_tool("t/ask", tool)]))
    with anyio.fail_after(30):
        async with (
            create_client_server_memory_streams() as (client, srv),
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(
                lambda: service.server.run(
                    srv[0], srv[1], service.server.create_initialization_options()
                )
            )
            async with ClientSession(
                client[0], client[1], sampling_callback=never_answers
            ) as session:
                await session.initialize()
                result = await session.call_tool("t/ask", {})
            tg.cancel_scope.cancel()
    assert json.loads(text_of(result)) == {"released": True, "code": "cancelled"}
