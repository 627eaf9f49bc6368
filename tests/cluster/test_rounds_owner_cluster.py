"""Input-required rounds are their caller's through two entry nodes (issue #28 item 4): a
retry mallory sends to node-c with the ``requestState`` alice got on node-a is refused as a
call that is over, and alice's own retry through node-c completes her call."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2 as httpx
import pytest
from test_tasks_cluster import rpc

from support.cluster import EntryNodes, NodeProc
from support.mcp_fakes import client_tokens

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

# The conformance skill's ir_request_state as its policy exposes it.
STATE = "test_input_required_result_request_state"
ANSWER = {"confirm": {"action": "accept", "content": {"ok": True}}}


@pytest.fixture
def entries(bus_entry_nodes: EntryNodes, tmp_path: Path) -> Iterator[tuple[NodeProc, NodeProc]]:
    """node-a and node-c, entry-only, sharing the bus directory's request-state.key and
    authenticating alice and mallory (named tokens, whom the gateway's rules let use all);
    node-b, the worker holding the conformance skill."""
    tokens = client_tokens(tmp_path, "alice", "mallory")
    with bus_entry_nodes(extra=["--token-file", str(tokens)]) as (_, a, c):
        yield a, c


def retry(state: str) -> dict[str, Any]:
    """The params of a retry of :data:`STATE` answering its question."""
    return {
        "name": STATE,
        "arguments": {},
        "inputResponses": ANSWER,
        "requestState": state,
    }


async def test_mallorys_retry_with_alices_state_through_the_other_entry_is_a_call_over(
    entries: tuple[NodeProc, NodeProc],
) -> None:
    """mallory's retry on node-c with alice's state from node-a gets the same error as a
    retry with a state whose call does not exist; alice's retry on node-c then completes."""
    a, c = entries
    assert a.url is not None and c.url is not None
    call = {"name": STATE, "arguments": {}}
    async with httpx.AsyncClient(timeout=30) as http:
        first = await rpc(http, a.url, "tools/call", call, who="alice")
        assert "result" in first and first["result"]["resultType"] == "input_required", first
        state = first["result"]["requestState"]
        stolen = await rpc(http, c.url, "tools/call", retry(state), who="mallory")
        forged = state[:-2] + ("A" if state[-2] != "A" else "B") + state[-1]
        never = await rpc(http, c.url, "tools/call", retry(forged), who="mallory")
        assert "error" in stolen and stolen["error"] == never["error"], (stolen, never)
        with anyio.fail_after(30):
            done = await rpc(http, c.url, "tools/call", retry(state), who="alice")
        assert "state-ok" in done["result"]["content"][0]["text"], done


async def test_mallorys_rounds_on_both_entries_leave_alice_a_slot_on_the_worker(
    entries: tuple[NodeProc, NodeProc],
) -> None:
    """mallory parks rounds through both entry nodes (her cap of 4 open rounds on each: 8,
    all of the worker's slots of the skill); the worker counts them against her verified
    caller and holds at most her share (6 of 8); alice's call through node-a is answered and
    her retry through node-c completes."""
    a, c = entries
    assert a.url is not None and c.url is not None
    call = {"name": STATE, "arguments": {}}
    parked: list[dict[str, Any]] = []
    async with httpx.AsyncClient(timeout=120) as http, anyio.create_task_group() as tg:

        async def park(url: str) -> None:
            got = await rpc(http, url, "tools/call", call, who="mallory")
            if got.get("result", {}).get("resultType") == "input_required":
                parked.append(got)

        for url in (a.url, c.url):
            for _ in range(4):
                tg.start_soon(park, url)
        with anyio.fail_after(60):
            while len(parked) < 6:  # her share; the other two wait on the worker
                await anyio.sleep(0.05)
        with anyio.fail_after(60):
            first = await rpc(http, a.url, "tools/call", call, who="alice")
            assert "result" in first, first
            assert first["result"]["resultType"] == "input_required", first
            done = await rpc(
                http, c.url, "tools/call", retry(first["result"]["requestState"]), who="alice"
            )
        assert "state-ok" in done["result"]["content"][0]["text"], done
        tg.cancel_scope.cancel()  # mallory's waiting calls end with the nodes
