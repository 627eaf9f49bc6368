"""A skill's slots are shared out per caller (DESIGN.md: "one caller at its caps never makes
another wait or fail"), over real HTTP with two named tokens.

mallory starts as many long tasks of one skill as the skill has slots (each is within her
task caps); alice's one call of the same skill must still be answered. The skill's gate
(``skilld.call.CallGate``) keeps a quarter of its slots for other callers; first come,
first served for everyone together, alice's call waited ``queue_timeout_s`` and failed
``busy``.
"""

from __future__ import annotations

import anyio
import httpx2 as httpx
import pytest
from test_mcp_rounds import tool
from test_tasks_notify import call

from skilld.audit import MemorySink
from skilld.mcp import HttpServer
from skilld.registry import Registry
from support.mcp_fakes import callers_server

pytestmark = pytest.mark.anyio


# The conformance skill (8 slots, the default max_concurrency); alice and mallory.
server = callers_server(queue_timeout_s=3.0)


async def test_mallory_holding_a_skills_slots_leaves_alice_answered(
    server: HttpServer, conformance_exposed: tuple[Registry, MemorySink]
) -> None:
    """mallory's 8 running slow_compute tasks (her task cap is 16) do not make alice's
    one call of the same skill fail busy. Control: her tasks are running when alice calls."""
    registry = conformance_exposed[0]
    slow, simple = tool(registry, "slow_compute"), tool(registry, "simple_text")
    slots = registry.skills()[0].limits.max_concurrency
    async with httpx.AsyncClient(timeout=60) as http:
        url = server.url
        ids = []
        for _ in range(slots):
            params = {"name": slow, "arguments": {"seconds": 60, "label": "m"}}
            created = (await call(http, url, "tools/call", params, "mallory"))["result"]
            assert created["resultType"] == "task", created
            ids.append(created["taskId"])
        try:
            with anyio.fail_after(30):
                for task_id in ids:
                    while True:
                        got = await call(http, url, "tasks/get", {"taskId": task_id}, "mallory")
                        if got["result"]["status"] == "working":
                            break
                        await anyio.sleep(0.05)
            answer = await call(http, url, "tools/call", {"name": simple, "arguments": {}}, "alice")
            assert "error" not in answer, answer
            assert not answer["result"].get("isError"), answer
        finally:
            for task_id in ids:
                await call(http, url, "tasks/cancel", {"taskId": task_id}, "mallory")
