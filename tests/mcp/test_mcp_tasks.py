"""Tasks (io.modelcontextprotocol/tasks) over a real wasm guest: created, polled, answered,
cancelled and audited like calls."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx2 as httpx
import pytest
from mcp import types
from test_mcp_rounds import modern, payload, tool

from skilld.audit import MemorySink
from skilld.mcp import HttpServer, ServeConfig
from skilld.mcp._tasks import TASKS, MemoryTaskStore, TaskRecord
from skilld.registry import Registry
from support.mcp_fakes import running_http

pytestmark = pytest.mark.anyio

WITH_TASKS = {"elicitation": {}, "extensions": {TASKS: {}}}


@pytest.fixture
async def server(conformance: tuple[Registry, MemorySink]) -> AsyncIterator[HttpServer]:
    """The conformance skill with its long methods marked as tasks."""
    registry = conformance[0]
    config = ServeConfig(
        transport="http",
        port=0,
        task_tools=(
            (tool(registry, "slow_compute"), "optional"),
            (tool(registry, "confirm_delete"), "optional"),
            (tool(registry, "protocol_error_job"), "optional"),
            (tool(registry, "failing_job"), "required"),
        ),
    )
    async with running_http(registry, config) as srv:
        yield srv


async def rpc(
    http: httpx.AsyncClient, url: str, method: str, params: dict[str, Any], caps: Any = None
) -> dict[str, Any]:
    """One 2026-07-28 request declaring the tasks extension (unless ``caps`` says otherwise)."""
    response = await modern(http, url, method, params, WITH_TASKS if caps is None else caps)
    return payload(response)


async def until(http: httpx.AsyncClient, url: str, task_id: str, status: str) -> dict[str, Any]:
    """Poll tasks/get (as a client does, at the task's poll interval) until ``status``."""
    with anyio.fail_after(30):
        while True:
            got = (await rpc(http, url, "tasks/get", {"taskId": task_id}))["result"]
            if got["status"] == status:
                return dict(got)
            await anyio.sleep(got["pollIntervalMs"] / 1000)


async def test_a_task_is_cancelled_through_the_call_and_audited(
    server: HttpServer,
    conformance: tuple[Registry, MemorySink],
) -> None:
    """A minute-long call becomes a task at once; tasks/cancel ends the guest (not a minute
    later), the task reads cancelled, and the call is audited once, as cancelled."""
    registry, sink = conformance
    async with httpx.AsyncClient(timeout=30) as http:
        name = tool(registry, "slow_compute")
        created = (
            await rpc(http, server.url, "tools/call", {"name": name, "arguments": {"seconds": 60}})
        )["result"]
        assert created["resultType"] == "task" and "requestState" not in created, created
        working = await rpc(http, server.url, "tasks/get", {"taskId": created["taskId"]})
        assert working["result"]["status"] == "working", working
        with anyio.fail_after(10):
            ack = await rpc(http, server.url, "tasks/cancel", {"taskId": created["taskId"]})
            assert (
                ack["result"] == {"resultType": "complete"}
                or ack["result"].get("resultType") == "complete"
            ), ack
            while not [r for r in sink.records if r.get("skill") == "conformance"]:
                await anyio.sleep(0.05)  # the guest stops at its next epoch check
        done = await until(http, server.url, created["taskId"], "cancelled")
    assert "result" not in done
    [record] = [r for r in sink.records if r.get("skill") == "conformance"]
    assert record["outcome"] != "ok", record


async def test_tool_errors_complete_and_crashes_fail(
    server: HttpServer,
    conformance: tuple[Registry, MemorySink],
) -> None:
    """A guest's reported error is a completed task with isError; a guest that crashes is a
    failed task with a JSON-RPC error and no result."""
    registry, _sink = conformance
    async with httpx.AsyncClient(timeout=30) as http:
        failing = (
            await rpc(
                http,
                server.url,
                "tools/call",
                {"name": tool(registry, "failing_job"), "arguments": {}},
            )
        )["result"]
        crashing = (
            await rpc(
                http,
                server.url,
                "tools/call",
                {"name": tool(registry, "protocol_error_job"), "arguments": {}},
            )
        )["result"]
        completed = await until(http, server.url, failing["taskId"], "completed")
        failed = await until(http, server.url, crashing["taskId"], "failed")
    assert completed["result"]["isError"] is True
    assert failed["error"]["code"] == types.INTERNAL_ERROR and "result" not in failed


async def test_a_task_waiting_for_input_is_answered_with_tasks_update(
    server: HttpServer,
    conformance: tuple[Registry, MemorySink],
) -> None:
    """The guest's question shows on tasks/get (input_required); tasks/update answers it."""
    registry, _sink = conformance
    async with httpx.AsyncClient(timeout=30) as http:
        name = tool(registry, "confirm_delete")
        created = (await rpc(http, server.url, "tools/call", {"name": name, "arguments": {}}))[
            "result"
        ]
        asking = await until(http, server.url, created["taskId"], "input_required")
        assert list(asking["inputRequests"]) == ["confirm"]
        answer = {"confirm": {"action": "accept", "content": {"confirm": True}}}
        await rpc(
            http,
            server.url,
            "tasks/update",
            {"taskId": created["taskId"], "inputResponses": answer},
        )
        done = await until(http, server.url, created["taskId"], "completed")
    assert done["result"]["content"][0]["text"] == "confirmed=True"


async def test_tasks_need_the_extension_and_a_known_id(
    server: HttpServer,
    conformance: tuple[Registry, MemorySink],
) -> None:
    """Without the extension: tasks/get and a required-task tool are -32021; an unknown task
    id is -32602; an optional-task tool runs synchronously."""
    registry, _sink = conformance
    async with httpx.AsyncClient(timeout=30) as http:
        plain = {"elicitation": {}}
        gated = await rpc(http, server.url, "tasks/get", {"taskId": "x"}, caps=plain)
        required = await rpc(
            http,
            server.url,
            "tools/call",
            {"name": tool(registry, "failing_job"), "arguments": {}},
            caps=plain,
        )
        unknown = await rpc(http, server.url, "tasks/get", {"taskId": "task-unknown"})
        sync = await rpc(
            http,
            server.url,
            "tools/call",
            {"name": tool(registry, "slow_compute"), "arguments": {"seconds": 0}},
            caps=plain,
        )
    assert gated["error"]["code"] == -32021
    assert required["error"]["code"] == -32021
    assert unknown["error"]["code"] == types.INVALID_PARAMS
    assert sync["result"]["resultType"] == "complete", sync


def test_the_memory_store_keeps_a_task_for_its_ttl_only() -> None:
    """A record is found until its TTL passes, then forgotten."""
    now = [100.0]
    store = MemoryTaskStore(clock=lambda: now[0])
    record = TaskRecord("t", "tool", "working", "a", "a", 1000, 100, expires=101.0)
    store.put(record)
    assert store.get("t") == record
    now[0] = 101.0
    assert store.get("t") is None


async def test_shutdown_stops_a_running_task_after_the_grace(
    conformance: tuple[Registry, MemorySink],
) -> None:
    """A task has no request the transport could cancel: after the shutdown grace the server
    tells its call to stop, and the guest ends as a server shutdown (audited), not at its
    deadline nor as a client's cancel."""
    registry, sink = conformance
    name = tool(registry, "slow_compute")
    config = ServeConfig(
        transport="http", port=0, shutdown_grace_s=0.5, task_tools=((name, "optional"),)
    )
    with anyio.fail_after(30):
        async with (
            running_http(registry, config) as srv,
            httpx.AsyncClient(timeout=30) as http,
        ):
            created = (
                await rpc(http, srv.url, "tools/call", {"name": name, "arguments": {"seconds": 60}})
            )["result"]
            assert created["resultType"] == "task", created
        while not [r for r in sink.records if r.get("skill") == "conformance"]:
            await anyio.sleep(0.05)  # the guest stops at its next epoch check
    [record] = [r for r in sink.records if r.get("skill") == "conformance"]
    assert record["outcome"] == "shutdown", record
