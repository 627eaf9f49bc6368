"""A skill's slots are shared out between callers (issue #28 item 5), over real HTTP with two
named tokens: mallory holding her share of a skill's slots with long calls and a parked
round leaves alice's call of that skill answered within its deadline."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx2 as httpx
import pytest
from test_mcp_rounds import META_CAPS, META_VERSION, MODERN, tool

from skilld.audit import MemorySink
from skilld.call import caller_share
from skilld.mcp import HttpServer, ServeConfig
from skilld.permissions import SkillPermissions
from skilld.policy import compile_policies
from skilld.registry import NullChannel, Registry, SkillEntry
from skilld.sandbox import CallContext, Sandbox
from support.callers import open_to_authenticated
from support.env import ROOT
from support.mcp_fakes import running_http

pytestmark = pytest.mark.anyio

ALICE = "alice-0123456789abcdefghijklmnopqrstuvwxyz"  # the bearer tokens: who calls
MALLORY = "mallory-0123456789abcdefghijklmnopqrstuvw"
SLOTS = 4  # the skill's concurrency: one caller's share is 3 of them
ELICIT = {"elicitation": {}}  # a client that may be asked: its call may park a round


@pytest.fixture
def four_slots(sandbox: Sandbox, component_path: Callable[[str], Path], tmp_path: Path) -> Registry:
    """The conformance skill with four slots and a wall time longer than the test."""
    policy = (ROOT / "tests" / "policies" / "conformance.yaml").read_text()
    assert "wall_time: 120s" in policy
    limits = policy.replace("wall_time: 120s", "wall_time: 60s")
    (tmp_path / "conformance.yaml").write_text(
        limits.replace("concurrency: 16", f"concurrency: {SLOTS}")
    )
    compiled = compile_policies(tmp_path, {"conformance": None})
    assert not compiled.problems, compiled.problems
    checker = SkillPermissions.from_tables(compiled.tables, "conformance")
    comp = sandbox.load(component_path("conformance").read_bytes(), name="conformance")
    spec = comp.describe(CallContext("conformance", checker.limits, NullChannel()))
    registry = Registry(audit=MemorySink())
    registry.add(
        SkillEntry(
            spec=dataclasses.replace(spec, id="conformance"),
            component=comp,
            limits=checker.limits,
            checker=checker,
        )
    )
    registry.mark_ready()
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


async def as_caller(
    http: httpx.AsyncClient,
    url: str,
    who: str,
    name: str,
    arguments: dict[str, Any],
    caps: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A 2026-07-28 ``tools/call`` of ``name`` as ``who`` (a client of ``caps``, none by
    default: the call can park no round): its JSON-RPC message."""
    meta = {META_VERSION: MODERN, META_CAPS: caps or {}}
    params = {"name": name, "arguments": arguments, "_meta": meta}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "tools/call",
        "Mcp-Name": name,
        "Authorization": f"Bearer {who}",
    }
    response = await http.post(url, json=body, headers=headers)
    if response.headers.get("content-type", "").startswith("application/json"):
        message: dict[str, Any] = response.json()
        return message
    data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
    last: dict[str, Any] = json.loads(data[-1])
    return last


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
        parked = await as_caller(http, url, MALLORY, rounds, {}, ELICIT)
        assert parked["result"]["resultType"] == "input_required", parked

        async def long_call() -> None:
            answer = await as_caller(http, url, MALLORY, slow, {"seconds": 30})
            if "error" in answer or answer["result"].get("isError"):
                refused.append(answer)

        for _ in range(SLOTS - 1):
            tg.start_soon(long_call)
        with anyio.fail_after(30):
            while not refused:  # the third long call waited its second and was refused
                await anyio.sleep(0.05)
        assert gate.running == 3, refused  # all mallory's: alice has not called yet
        with anyio.fail_after(30):
            answer = await as_caller(http, url, ALICE, simple, {})
        assert not answer["result"].get("isError"), answer
        text = json.dumps(refused)
        assert "busy for this caller: its calls hold 3" in text and "its share" in text, refused
        tg.cancel_scope.cancel()  # mallory's long calls end with the server's drain
