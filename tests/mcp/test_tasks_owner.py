"""Tasks are their caller's (issue #28 items 4 and 5), over real HTTP with two named tokens:
mallory cannot reach alice's task with its id (every ``tasks/*`` answers exactly what an id
never made answers), and mallory at her caps on kept results (count and bytes) leaves
alice's tasks answered."""

from __future__ import annotations

from typing import Any

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

ALICE, MALLORY = "alice", "mallory"  # the callers (their tokens: support.mcp_fakes.token_of)
LABEL = 120_000  # characters of a result: two fit in mallory's 300 kB, the third does not


# The conformance skill; four tasks kept per caller, 300 kB of results; alice, mallory.
server = callers_server(
    ALICE,
    MALLORY,
    max_tasks_per_client=4,
    max_task_results_per_client=4,
    max_task_result_bytes_per_client=300_000,
)


async def start(
    http: httpx.AsyncClient, url: str, name: str, who: str, seconds: float, size: int = 0
) -> dict[str, Any]:
    """A slow_compute task as ``who`` whose result carries ``size`` characters."""
    arguments = {"seconds": seconds, "label": "x" * size}
    return await call(http, url, "tools/call", {"name": name, "arguments": arguments}, who)


async def finished(http: httpx.AsyncClient, url: str, task_id: str, who: str) -> dict[str, Any]:
    """``tasks/get`` as ``who`` until the task ends: its last answer."""
    while True:
        got = (await call(http, url, "tasks/get", {"taskId": task_id}, who))["result"]
        if got["status"] in ("completed", "failed", "cancelled"):
            return got
        await anyio.sleep(0.05)


def unknown(answer: dict[str, Any], task_id: str, fake: dict[str, Any]) -> bool:
    """Whether ``answer`` for ``task_id`` is the answer ``fake`` got for an id never made."""
    if "error" not in answer:
        return False
    error = {**answer["error"], "message": answer["error"]["message"].replace(task_id, "ID")}
    return bool(error == fake["error"])


async def test_another_callers_task_is_unknown_to_mallory(
    server: HttpServer, conformance_exposed: tuple[Registry, MemorySink]
) -> None:
    """With alice's task id, mallory's tasks/get, tasks/update and tasks/cancel get exactly
    what an id never made gets; alice's task runs on and is hers. Control: mallory's own
    task answers her."""
    name = tool(conformance_exposed[0], "slow_compute")
    async with httpx.AsyncClient(timeout=30) as http:
        url = server.url
        alices = (await start(http, url, name, ALICE, 1.0))["result"]["taskId"]
        for method, extra in (
            ("tasks/get", {}),
            ("tasks/update", {"inputResponses": {}}),
            ("tasks/cancel", {}),
        ):
            fake = await call(http, url, method, {"taskId": "ID", **extra}, MALLORY)
            theirs = await call(http, url, method, {"taskId": alices, **extra}, MALLORY)
            assert unknown(theirs, alices, fake), (method, theirs, fake)
        with anyio.fail_after(15):
            done = await finished(http, url, alices, ALICE)
        assert done["status"] == "completed", done
        own = (await start(http, url, name, MALLORY, 0.0))["result"]["taskId"]
        with anyio.fail_after(15):
            assert (await finished(http, url, own, MALLORY))["status"] == "completed"


async def test_mallory_at_her_result_caps_leaves_alice_answered(
    server: HttpServer, conformance_exposed: tuple[Registry, MemorySink]
) -> None:
    """mallory's third large result goes beyond her 300 kB: its task is failed naming the
    cap (her first two keep theirs); her fifth task is refused (four kept, scope
    client-results). alice's large task meanwhile completes with its whole result."""
    name = tool(conformance_exposed[0], "slow_compute")
    async with httpx.AsyncClient(timeout=30) as http:
        url = server.url
        ends = []
        for _ in range(3):
            task_id = (await start(http, url, name, MALLORY, 0.0, LABEL))["result"]["taskId"]
            with anyio.fail_after(15):
                ends.append(await finished(http, url, task_id, MALLORY))
        assert [e["status"] for e in ends] == ["completed", "completed", "failed"], ends
        assert ends[2]["error"]["data"] == {"limit": 300_000, "scope": "client-results"}
        assert "max_task_result_bytes_per_client" in ends[2]["error"]["message"]
        assert "x" * LABEL in ends[0]["result"]["content"][0]["text"]
        fourth = await start(http, url, name, MALLORY, 0.0)
        assert "result" in fourth, fourth
        refused = await start(http, url, name, MALLORY, 0.0)
        assert refused["error"]["data"] == {"limit": 4, "scope": "client-results"}, refused
        assert "max_task_results_per_client" in refused["error"]["message"]
        with anyio.fail_after(10):
            alices = (await start(http, url, name, ALICE, 0.0, LABEL))["result"]["taskId"]
            done = await finished(http, url, alices, ALICE)
        assert done["status"] == "completed", done
        assert "x" * LABEL in done["result"]["content"][0]["text"]
