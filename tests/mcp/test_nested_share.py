"""A nested call counts against its principal's share of the callee's slots (DESIGN.md: "one
caller at its caps never makes another wait or fail"), over real HTTP with the SDK client
and two named tokens.

mallory calls ``relay/relay``, whose guest invokes ``held/hold``: each nested call takes a
slot of ``held``'s gate. Counted for nobody (they used to be), four of them held all of
``held``'s four slots, and alice's one call of ``held`` waited ``queue_timeout_s`` and failed
busy, although mallory's share of ``held`` is three.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.to_thread
import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from skilld.mcp import HttpServer, ServeConfig
from skilld.registry import Registry
from support.callers import open_to_authenticated
from support.held import HeldBackend, held_registry
from support.mcp_fakes import client_tokens, running_http, text_of, token_of

pytestmark = pytest.mark.anyio

SLOTS = 4  # held's slots: one caller's share is three


@pytest.fixture
def held() -> tuple[Registry, HeldBackend]:
    """``held`` (four slots) and ``relay`` (eight), one backend holding mallory's calls
    only; every authenticated caller may call both, and ``relay`` may invoke ``held``."""
    backend = HeldBackend(lambda ctx: ctx.caller.key == "token:mallory")
    registry, _ = held_registry(SLOTS, 2 * SLOTS, 60_000, backend)
    return open_to_authenticated(registry), backend


@pytest.fixture
async def server(held: tuple[Registry, HeldBackend], tmp_path: Path) -> AsyncIterator[HttpServer]:
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
    server: HttpServer, held: tuple[Registry, HeldBackend]
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
                while backend.running + len(relayed) < SLOTS:
                    await anyio.sleep(0.01)
                assert backend.running == gate.running == gate.share == SLOTS - 1
                assert len(relayed) == 1 and "busy for this caller" in relayed[0], relayed
                alice = await _as(server.url, "alice", "held/hold")
                assert backend.running == SLOTS - 1  # the control: mallory's calls still held
            finally:
                backend.release.set()
    assert alice == "at once for token:alice"
    assert sorted(relayed)[1:] == ["held for token:mallory"] * (SLOTS - 1)
    assert gate.running == 0
