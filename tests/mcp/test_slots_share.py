"""A skill's slots are shared out between callers (issue #28 item 5), over real HTTP with two
named tokens: mallory holding her share of a skill's slots with long calls and a parked
round leaves alice's call of that skill answered within its deadline."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx2 as httpx
import pytest
from test_mcp_rounds import tool

from skilld.call import caller_share
from skilld.mcp import HttpServer, ServeConfig
from skilld.registry import Registry
from skilld.sandbox import Sandbox
from support.callers import open_to_authenticated
from support.conformance import conformance_registry
from support.mcp_fakes import running_http
from support.modern_http import call_as

pytestmark = pytest.mark.anyio

ALICE = "alice-0123456789abcdefghijklmnopqrstuvwxyz"  # the bearer tokens: who calls
MALLORY = "mallory-0123456789abcdefghijklmnopqrstuvw"
SLOTS = 4  # the skill's concurrency: one caller's share is 3 of them
ELICIT = {"elicitation": {}}  # a client that may be asked: its call may park a round


@pytest.fixture
def four_slots(sandbox: Sandbox, component_path: Callable[[str], Path], tmp_path: Path) -> Registry:
    """The conformance skill with four slots and a wall time longer than the test."""
    registry, _sink = conformance_registry(
        sandbox,
        component_path("conformance"),
        tmp_path,
        replacing={"wall_time: 120s": "wall_time: 60s", "concurrency: 16": f"concurrency: {SLOTS}"},
    )
    return registry


@pytest.fixture
async def server(four_slots: Registry, tmp_path: Path) -> AsyncIterator[HttpServer]:
    """Callers alice and mallory, each with as many open calls (rounds) as the skill has
    slots (every 2026-07-28 call may park, so that cap counts them all); a second's wait for
    a slot."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice {ALICE}\nmallory {MALLORY}\n")
    tokens.chmod(0o600)
    config = ServeConfig(
        transport="http",
        port=0,
        token_file=tokens,
        max_rounds_per_caller=SLOTS,
        queue_timeout_s=1.0,
        shutdown_grace_s=1.0,
    )
    async with running_http(open_to_authenticated(four_slots), config) as srv:
        yield srv


async def test_mallory_at_her_share_of_a_skills_slots_leaves_alice_answered(
    server: HttpServer, four_slots: Registry
) -> None:
    """mallory holds her share (3 of 4 slots: a parked round and two long calls); her third
    long call waits for one of her own slots, then is refused naming her share, and never
    holds a slot; alice's call of the same
    skill is answered within its deadline."""
    gate = four_slots.gate("conformance")
    assert gate.share == caller_share(SLOTS) == 3
    slow, simple = tool(four_slots, "slow_compute"), tool(four_slots, "simple_text")
    refused: list[dict[str, Any]] = []
    async with httpx.AsyncClient(timeout=60) as http, anyio.create_task_group() as tg:
        url = server.url
        rounds = tool(four_slots, "ir_request_state")
        parked = await call_as(http, url, MALLORY, rounds, caps=ELICIT)
        assert parked["result"]["resultType"] == "input_required", parked

        async def long_call() -> None:
            answer = await call_as(http, url, MALLORY, slow, {"seconds": 30})
            if "error" in answer or answer["result"].get("isError"):
                refused.append(answer)

        for _ in range(SLOTS - 1):
            tg.start_soon(long_call)
        with anyio.fail_after(30):
            while not refused:  # the third long call waited its second and was refused
                await anyio.sleep(0.05)
        assert gate.running == 3, refused  # all mallory's: alice has not called yet
        with anyio.fail_after(30):
            answer = await call_as(http, url, ALICE, simple, {})
        assert not answer["result"].get("isError"), answer
        text = json.dumps(refused)
        assert "busy for this caller: its calls hold 3" in text and "its share" in text, refused
        tg.cancel_scope.cancel()  # mallory's long calls end with the server's drain
