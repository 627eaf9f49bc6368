"""A nested call counts against its principal's share of the callee's slots (DESIGN.md: "one
caller at its caps never makes another wait or fail"), over real HTTP with the SDK client
and two named tokens.

mallory calls ``relay/relay``, whose guest invokes ``held/hold``: each nested call takes a
slot of ``held``'s gate. Counted for nobody (they used to be), four of them held all of
``held``'s four slots, and alice's one call of ``held`` waited ``queue_timeout_s`` and failed
busy, although mallory's share of ``held`` is three.
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from skilld.audit import MemorySink
from skilld.call import CallContext
from skilld.errors import CallCancelled
from skilld.mcp import HttpServer, ServeConfig
from skilld.registry import Registry, SkillEntry
from skilld.types import CallOutput, Decision, Limits, MethodSpec, SkillSpec
from support.callers import open_to_authenticated
from support.checkers import TextQuestions
from support.mcp_fakes import client_tokens, running_http, text_of, token_of

pytestmark = pytest.mark.anyio

SLOTS = 4  # held's slots: one caller's share is three
_OBJECT = {"type": "object"}


class _Held:
    """``held/hold`` runs until the test lets it go for mallory (alice's returns at once);
    ``relay/relay`` invokes ``held/hold`` (a nested call)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.holding = 0
        self._lock = threading.Lock()

    def call(self, method: str, args_json: str, ctx: CallContext) -> CallOutput:
        ctx.thread_only()
        if method == "relay":
            assert ctx.invoker is not None
            return CallOutput(json.loads(ctx.invoker("held", "hold", "{}", ctx.depth + 1)))
        if ctx.caller.key != "token:mallory":
            return CallOutput(f"held for {ctx.caller.key}")
        with self._lock:
            self.holding += 1
        try:
            while not self.release.wait(0.005):
                if ctx.channel.cancelled():
                    raise CallCancelled("held: cancelled")
        finally:
            with self._lock:
                self.holding -= 1
        return CallOutput("held for mallory")

    def read_resource(self, uri: str, ctx: CallContext) -> list[CallOutput]:
        raise AssertionError("not served")

    def get_prompt(self, name: str, args_json: str, ctx: CallContext) -> list[dict[str, Any]]:
        raise AssertionError("not served")


class _AllowAll(TextQuestions):
    def check(self, capability: str, action: str, target: str) -> Decision:
        return Decision(True, capability, action, target, "test-allow", "a test allows it")


@pytest.fixture
def held() -> tuple[Registry, _Held]:
    """``held`` (four slots) and ``relay`` (eight), one backend; every authenticated caller
    may call both, and ``relay`` may invoke ``held``."""
    registry = Registry(audit=MemorySink())
    backend = _Held()
    for sid, method, slots in (("held", "hold", SLOTS), ("relay", "relay", 2 * SLOTS)):
        spec = SkillSpec(sid, "1.0.0", sid, (MethodSpec(method, method, _OBJECT),))
        registry.add(
            SkillEntry(
                spec=spec,
                component=backend,
                limits=Limits(timeout_ms=60_000, max_concurrency=slots),
                checker=_AllowAll(),
            )
        )
    registry.mark_ready()
    return open_to_authenticated(registry), backend


@pytest.fixture
async def server(held: tuple[Registry, _Held], tmp_path: Path) -> AsyncIterator[HttpServer]:
    tokens = client_tokens(tmp_path, "alice", "mallory")
    config = ServeConfig(
        transport="http", port=0, token_file=tokens, queue_timeout_s=2.0, inline_ms=0
    )
    async with running_http(held[0], config) as srv:
        yield srv


async def _as(url: str, who: str, name: str) -> str:
    """One ``tools/call`` of ``name`` by ``who`` with the SDK client: its text (errors too)."""
    headers = {"Authorization": f"Bearer {token_of(who)}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        result = await session.call_tool(name, {})
    text = text_of(result)
    return f"error: {text}" if result.is_error else text


async def test_mallorys_nested_calls_leave_alice_a_slot(
    server: HttpServer, held: tuple[Registry, _Held]
) -> None:
    """mallory's four relays nest four calls into ``held``: three run (her share), the fourth
    is refused busy for her at once; alice's call of ``held`` is answered. Control: while
    alice calls, mallory's three nested calls hold ``held``'s slots."""
    registry, backend = held
    gate = registry.gate("held")
    relayed: list[str] = []

    async def relay() -> None:
        relayed.append(await _as(server.url, "mallory", "relay/relay"))

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            try:
                for _ in range(SLOTS):
                    tg.start_soon(relay)
                # Every relay has either its nested call running in held, or its answer.
                while backend.holding + len(relayed) < SLOTS:
                    await anyio.sleep(0.01)
                assert backend.holding == gate.running == gate.share == SLOTS - 1
                assert len(relayed) == 1 and "busy for this caller" in relayed[0], relayed
                alice = await _as(server.url, "alice", "held/hold")
                assert backend.holding == SLOTS - 1  # the control: mallory's calls still held
            finally:
                backend.release.set()
    assert alice == "held for token:alice"
    assert sorted(relayed)[1:] == ["held for mallory"] * (SLOTS - 1)
    assert gate.running == 0
