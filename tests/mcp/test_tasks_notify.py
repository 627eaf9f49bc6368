"""A task's status notifications (``notifications/tasks/status`` on a listen stream) and its
audit records (created, cancel-requested, its end), on one node over real HTTP."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx2 as httpx
import pytest
from test_mcp_rounds import MODERN, tool
from test_mcp_tasks import WITH_TASKS

from skilld.audit import MemorySink
from skilld.mcp import HttpServer
from skilld.registry import Registry
from support.mcp_fakes import callers_server, token_of
from support.modern_http import payload

pytestmark = pytest.mark.anyio

META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": WITH_TASKS,
}


# The conformance skill; its policy marks the task tools; callers alice, mallory, a.
server = callers_server("alice", "mallory", "a")


def headers(method: str, who: str, named: str | None = None) -> dict[str, str]:
    """A 2026-07-28 request's headers, as client ``who`` (its bearer token)."""
    out = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": method,
        "Authorization": f"Bearer {token_of(who)}",
    }
    if named:
        out["Mcp-Name"] = named
    return out


async def call(
    http: httpx.AsyncClient, url: str, method: str, params: dict[str, Any], who: str
) -> dict[str, Any]:
    """One request as ``who``; its JSON-RPC message."""
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": {**params, "_meta": META}}
    named = params.get("name") or params.get("taskId")
    return payload(await http.post(url, json=body, headers=headers(method, who, named)))


async def listen(
    http: httpx.AsyncClient,
    url: str,
    who: str,
    out: anyio.abc.ObjectSendStream[dict[str, Any]],
    ready: anyio.Event,
) -> None:
    """Hold a subscriptions/listen stream as ``who``; send each message it carries to ``out``."""
    body = {
        "jsonrpc": "2.0",
        "id": 99,
        "method": "subscriptions/listen",
        "params": {"notifications": {"toolsListChanged": True}, "_meta": META},
    }
    async with http.stream(
        "POST", url, json=body, headers=headers("subscriptions/listen", who)
    ) as response:
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                message = json.loads(line[5:])
                if message.get("method") == "notifications/subscriptions/acknowledged":
                    ready.set()
                else:
                    await out.send(message)


async def test_status_notifications_reach_only_the_client_that_made_the_task(
    server: HttpServer, conformance_exposed: tuple[Registry, MemorySink]
) -> None:
    """A listen stream of the client that made a task hears working, then completed (with the
    task's id and the stream's subscription id); another client's stream hears nothing of
    it, and that client's tasks/get reads the task as unknown."""
    registry = conformance_exposed[0]
    send_mine, mine = anyio.create_memory_object_stream[dict[str, Any]](16)
    send_theirs, theirs = anyio.create_memory_object_stream[dict[str, Any]](16)
    async with httpx.AsyncClient(timeout=30) as http, anyio.create_task_group() as tg:
        ready_mine, ready_theirs = anyio.Event(), anyio.Event()
        tg.start_soon(listen, http, server.url, "alice", send_mine, ready_mine)
        tg.start_soon(listen, http, server.url, "mallory", send_theirs, ready_theirs)
        with anyio.fail_after(10):
            await ready_mine.wait()
            await ready_theirs.wait()
        created = (
            await call(
                http,
                server.url,
                "tools/call",
                {"name": tool(registry, "slow_compute"), "arguments": {"seconds": 0.2}},
                "alice",
            )
        )["result"]
        task_id = created["taskId"]
        heard = []
        with anyio.fail_after(10):
            while not heard or heard[-1]["params"]["status"] != "completed":
                heard.append(await mine.receive())
        assert all(n["method"] == "notifications/tasks/status" for n in heard), heard
        assert [n["params"]["status"] for n in heard] == ["working", "completed"], heard
        assert {n["params"]["taskId"] for n in heard} == {task_id}
        sub = heard[0]["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"]
        assert sub == 99
        other = await call(http, server.url, "tasks/get", {"taskId": task_id}, "mallory")
        assert other["error"]["code"] == -32602, other
        with pytest.raises(anyio.WouldBlock):
            theirs.receive_nowait()
        tg.cancel_scope.cancel()


async def test_a_task_is_audited_from_creation_to_its_cancel(
    server: HttpServer, conformance_exposed: tuple[Registry, MemorySink]
) -> None:
    """A cancelled task leaves created, cancel-requested and cancelled task records beside
    its call's one record (cancelled); a completed one created and completed."""
    registry, sink = conformance_exposed
    name = tool(registry, "slow_compute")
    async with httpx.AsyncClient(timeout=30) as http:
        long = (
            await call(
                http, server.url, "tools/call", {"name": name, "arguments": {"seconds": 60}}, "a"
            )
        )["result"]["taskId"]
        await call(http, server.url, "tasks/cancel", {"taskId": long}, "a")
        short = (
            await call(
                http, server.url, "tools/call", {"name": name, "arguments": {"seconds": 0}}, "a"
            )
        )["result"]["taskId"]
        with anyio.fail_after(15):
            while not any(
                r.get("event") == "task" and r.get("task") == long and r["status"] == "cancelled"
                for r in sink.records
            ):
                await anyio.sleep(0.05)
        with anyio.fail_after(15):
            while (await call(http, server.url, "tasks/get", {"taskId": short}, "a"))["result"][
                "status"
            ] != "completed":
                await anyio.sleep(0.05)

    def of(task_id: str) -> list[str]:
        return [r["status"] for r in sink.records if r.get("task") == task_id]

    assert of(long) == ["created", "cancel-requested", "cancelled"]
    assert of(short) == ["created", "completed"]
    calls = [r for r in sink.records if r.get("event", "call") == "call"]
    outcomes = sorted(r["outcome"] for r in calls if r.get("method") == "slow_compute")
    # "cancelled" once the guest ran, "error:cancelled" when the cancel came first
    assert outcomes[0] in ("cancelled", "error:cancelled") and outcomes[1:] == ["ok"], outcomes
    assert all(r["tool"] == name for r in sink.records if r.get("event") == "task")
