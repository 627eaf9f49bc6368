"""Input-required rounds are their caller's (issue #28 items 4 and 5), over real HTTP with
two named tokens: mallory's retry with alice's ``requestState`` gets exactly what a state
whose call is over gets, and mallory at her cap of open rounds leaves alice answered."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import anyio
import httpx2 as httpx
import pytest
from mcp.shared.exceptions import MCPError
from test_mcp_rounds import tool

from skilld.audit import MemorySink
from skilld.mcp import HttpServer, ServeConfig
from skilld.mcp._rounds import ParkedCalls
from skilld.registry import Registry
from support.callers import open_to_authenticated
from support.mcp_fakes import running_http
from support.modern_http import call_as

pytestmark = pytest.mark.anyio

ALICE = "alice-0123456789abcdefghijklmnopqrstuvwxyz"  # the bearer tokens: who calls
MALLORY = "mallory-0123456789abcdefghijklmnopqrstuvw"
ELICIT = {"elicitation": {}}  # a client that may be asked: its call may park a round
ANSWER = {"confirm": {"action": "accept", "content": {"ok": True}}}


@pytest.fixture
async def server(
    conformance: tuple[Registry, MemorySink], tmp_path: Path
) -> AsyncIterator[HttpServer]:
    """The conformance skill; two open rounds per caller; callers alice and mallory."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice {ALICE}\nmallory {MALLORY}\n")
    tokens.chmod(0o600)
    config = ServeConfig(transport="http", port=0, max_rounds_per_caller=2, token_file=tokens)
    async with running_http(open_to_authenticated(conformance[0]), config) as srv:
        yield srv


async def test_a_retry_with_another_callers_request_state_is_one_never_minted(
    server: HttpServer, conformance: tuple[Registry, MemorySink]
) -> None:
    """mallory's retry with alice's requestState gets what a state never minted gets (same
    code and text: the SDK's boundary binds a state to its principal); alice's call is
    untouched and completes. Control: mallory's own round completes."""
    registry, sink = conformance
    name = tool(registry, "ir_request_state")
    async with httpx.AsyncClient(timeout=30) as http:
        url = server.url
        state = (await call_as(http, url, ALICE, name, caps=ELICIT))["result"]["requestState"]
        stolen = await call_as(http, url, MALLORY, name, caps=ELICIT, state=state, responses=ANSWER)
        forged = state[:-2] + ("A" if state[-2] != "A" else "B") + state[-1]
        never = await call_as(http, url, MALLORY, name, caps=ELICIT, state=forged, responses=ANSWER)
        assert stolen["error"] == never["error"], (stolen, never)
        with anyio.fail_after(10):
            done = await call_as(http, url, ALICE, name, caps=ELICIT, state=state, responses=ANSWER)
        assert "state-ok" in done["result"]["content"][0]["text"], done
        own = (await call_as(http, url, MALLORY, name, caps=ELICIT))["result"]["requestState"]
        mine = await call_as(http, url, MALLORY, name, caps=ELICIT, state=own, responses=ANSWER)
        assert "state-ok" in mine["result"]["content"][0]["text"], mine
    # the guest ran once for each of the two calls answered
    assert [r.get("outcome") for r in sink.records if r.get("skill") == "conformance"] == [
        "ok",
        "ok",
    ]


async def test_mallory_at_her_rounds_cap_leaves_alice_answered(
    server: HttpServer, conformance: tuple[Registry, MemorySink]
) -> None:
    """mallory's two unanswered rounds are her cap: her third round ends her oldest (its
    retry finds a call that is over, and it is audited cancelled), so she never holds more
    than two slots; alice's call meanwhile goes through both its requests within its
    deadline. Control: mallory's newer rounds still answer."""
    registry, sink = conformance
    name = tool(registry, "ir_request_state")
    async with httpx.AsyncClient(timeout=30) as http:
        url = server.url
        held = [(await call_as(http, url, MALLORY, name, caps=ELICIT))["result"] for _ in range(3)]
        assert all(h["resultType"] == "input_required" for h in held), held
        with anyio.fail_after(10):
            state = (await call_as(http, url, ALICE, name, caps=ELICIT))["result"]["requestState"]
            done = await call_as(http, url, ALICE, name, caps=ELICIT, state=state, responses=ANSWER)
        assert "state-ok" in done["result"]["content"][0]["text"], done
        oldest = await call_as(
            http, url, MALLORY, name, caps=ELICIT, state=held[0]["requestState"], responses=ANSWER
        )
        assert oldest["error"]["code"] == -32602, oldest
        assert "is over" in oldest["error"]["message"], oldest
        for newer in held[1:]:
            answered = await call_as(
                http, url, MALLORY, name, caps=ELICIT, state=newer["requestState"], responses=ANSWER
            )
            assert "state-ok" in answered["result"]["content"][0]["text"], answered
    with anyio.fail_after(10):
        while not (
            ended := [
                r
                for r in sink.records
                if r.get("outcome") == "cancelled" and r.get("principal") == "token:mallory"
            ]
        ):
            await anyio.sleep(0.05)
    assert len(ended) == 1, ended


async def test_a_parked_call_answers_only_its_caller() -> None:
    """Behind the boundary (a retry another entry node forwarded carries its caller, not
    a bound state): another caller's resume is refused exactly as a call that is over."""
    parked = ParkedCalls("node-a", 60.0)
    gate = asyncio.Event()

    async def run() -> str:
        await gate.wait()
        return "done"

    call = parked.start("t", "d", cast(Any, _Channel()), run, "token:alice")
    state = parked.state(call)
    with pytest.raises(MCPError) as theirs:
        parked.resume(state, "t", "d", "token:mallory")
    gone = json.dumps({"c": "no-such-call", "n": "node-a", "d": "d", "r": 0})
    with pytest.raises(MCPError) as never:
        parked.resume(gone, "t", "d", "token:mallory")
    assert theirs.value.error == never.value.error
    assert parked.resume(state, "t", "d", "token:alice") is call
    gate.set()
    assert await call.task == "done"


class _Channel:
    """What ParkedCalls reads of a round channel."""

    round = 0
    asked: Any = None


@pytest.fixture
async def tasks_server(
    conformance_exposed: tuple[Registry, MemorySink], tmp_path: Path
) -> AsyncIterator[HttpServer]:
    """The conformance skill with its policy's exposure (its task tools); two open rounds
    per caller; callers alice and mallory."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice {ALICE}\nmallory {MALLORY}\n")
    tokens.chmod(0o600)
    config = ServeConfig(transport="http", port=0, max_rounds_per_caller=2, token_file=tokens)
    async with running_http(open_to_authenticated(conformance_exposed[0]), config) as srv:
        yield srv


async def test_a_required_task_tools_rounds_count_against_the_rounds_cap(
    tasks_server: HttpServer, conformance_exposed: tuple[Registry, MemorySink]
) -> None:
    """A tool that must run as a task first gathers its input in rounds: those rounds are
    rounds like any other, so mallory's third one ends her oldest (its retry finds a call
    that is over). Control: her newer rounds become tasks."""
    registry, _ = conformance_exposed
    server = tasks_server
    name = tool(registry, "tool_with_task")
    caps = {"elicitation": {}, "extensions": {"io.modelcontextprotocol/tasks": {}}}

    answer = {"user_name": {"action": "accept", "content": {"name": "m"}}}

    async def first() -> dict[str, Any]:
        return await call_as(http, server.url, MALLORY, name, caps=caps)

    async def retry(state: str) -> dict[str, Any]:
        return await call_as(
            http, server.url, MALLORY, name, caps=caps, state=state, responses=answer
        )

    async with httpx.AsyncClient(timeout=30) as http:
        held = [(await first())["result"] for _ in range(3)]
        assert all(h["resultType"] == "input_required" for h in held), held
        oldest = await retry(held[0]["requestState"])
        assert oldest.get("error", {}).get("code") == -32602, oldest
        assert "is over" in oldest["error"]["message"], oldest
        for newer in held[1:]:
            became = await retry(newer["requestState"])
            assert became["result"]["resultType"] == "task", became
