"""Caps on live tasks: per client and per node, refused with -32603 and the limit, before the
refused call starts; a slot frees when a task ends."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import anyio
import httpx2 as httpx
import pytest
from mcp.shared.exceptions import MCPError
from test_mcp_rounds import tool
from test_tasks_notify import call

from skilld.audit import MemorySink
from skilld.errors import UsageError
from skilld.mcp import HttpServer, ServeConfig
from skilld.mcp._tasks import MemoryTaskStore, Tasks
from skilld.registry import Registry
from support.mcp_fakes import callers_server

pytestmark = pytest.mark.anyio


# The conformance skill; two tasks per client, three per node; callers alice, bob, carol.
server = callers_server("alice", "bob", "carol", max_tasks_per_client=2, max_tasks=3)


async def start(http: httpx.AsyncClient, url: str, name: str, who: str) -> dict[str, Any]:
    """A minute-long slow_compute task as ``who``: its JSON-RPC answer."""
    return await call(http, url, "tools/call", {"name": name, "arguments": {"seconds": 60}}, who)


async def test_tasks_beyond_the_client_and_node_caps_are_refused(
    server: HttpServer, conformance_exposed: tuple[Registry, MemorySink]
) -> None:
    """alice's third live task is -32603 (scope client, limit 2) while bob's first is taken;
    carol's is then -32603 (scope node, limit 3); once alice cancels one, her next is taken.
    No refused request started a call: every call record is one of the tasks made."""
    registry, sink = conformance_exposed
    name = tool(registry, "slow_compute")
    made: list[str] = []
    async with httpx.AsyncClient(timeout=30) as http:
        for _ in range(2):
            made.append((await start(http, server.url, name, "alice"))["result"]["taskId"])
        refused = await start(http, server.url, name, "alice")
        assert refused["error"]["code"] == -32603, refused
        assert refused["error"]["data"] == {"limit": 2, "scope": "client"}, refused
        assert "too many tasks" in refused["error"]["message"]
        made.append((await start(http, server.url, name, "bob"))["result"]["taskId"])
        full = await start(http, server.url, name, "carol")
        assert full["error"]["data"] == {"limit": 3, "scope": "node"}, full
        await call(http, server.url, "tasks/cancel", {"taskId": made[0]}, "alice")
        with anyio.fail_after(15):
            while "error" in (again := await start(http, server.url, name, "alice")):
                await anyio.sleep(0.05)
        made.append(again["result"]["taskId"])
        for task_id, who in zip(made[1:], ("alice", "bob", "alice"), strict=True):
            await call(http, server.url, "tasks/cancel", {"taskId": task_id}, who)
        with anyio.fail_after(15):
            while len([r for r in sink.records if r.get("method") == "slow_compute"]) < 4:
                await anyio.sleep(0.05)
    calls = [r for r in sink.records if r.get("method") == "slow_compute"]
    assert len(calls) == len(made) == 4, calls
    assert all(r["outcome"] in ("cancelled", "error:cancelled") for r in calls), calls


def test_task_caps_must_be_positive() -> None:
    """A cap of zero (or less) is a configuration error, not a server that refuses all."""
    with pytest.raises(UsageError, match="max_tasks"):
        ServeConfig(max_tasks=0)
    with pytest.raises(UsageError, match="max_tasks"):
        ServeConfig(max_tasks_per_client=-1)


class _Board:
    """Just enough of a cluster's board to play the records other entry nodes write."""

    node = "node-c"

    def __init__(self) -> None:
        self.seen: Any = None

    def follow(self, on_record: Any, on_failed: Any) -> None:
        """Keep the record callback."""
        self.seen = on_record


async def test_a_clients_tasks_on_other_entry_nodes_count_towards_its_cap() -> None:
    """With a cap of one, alice's unfinished task that node-a runs (seen on the board) makes
    her next task here -32603; once the board shows it completed, she is admitted again;
    bob, whose task it is not, is admitted all along."""
    tasks = Tasks(MemoryTaskStore(), node="node-c", max_per_client=1)
    board = _Board()
    tasks.follow_board(cast(Any, board))
    now = time.time()
    record = {
        "task_id": "task-a1",
        "tool": "slow_compute",
        "status": "working",
        "created_at": "t",
        "updated_at": "t",
        "ttl_ms": 60_000,
        "poll_interval_ms": 500,
        "expires": now + 60,
        "client": "alice",
        "owner": "node-a",
    }
    board.seen("task-a1", record)
    await asyncio.sleep(0)  # the record is handed to the loop (call_soon_threadsafe)
    with pytest.raises(MCPError) as refused:
        tasks.admit("alice")
    assert refused.value.error.data == {"limit": 1, "scope": "client"}
    tasks.admit("bob")
    board.seen("task-a1", {**record, "status": "completed"})
    await asyncio.sleep(0)
    tasks.admit("alice")
