"""Which tools run as tasks comes from the skill's policy (``mcp.tasks``), not the config."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx2 as httpx
import pytest
from test_mcp_rounds import tool
from test_mcp_tasks import rpc, until

from skilld.audit import MemorySink
from skilld.mcp import HttpServer, ServeConfig
from skilld.registry import Registry
from support.mcp_fakes import running_http

pytestmark = pytest.mark.anyio


@pytest.fixture
async def server(conformance_exposed: tuple[Registry, MemorySink]) -> AsyncIterator[HttpServer]:
    """The conformance skill served with no ``task_tools`` at all."""
    async with running_http(conformance_exposed[0], ServeConfig(transport="http", port=0)) as srv:
        yield srv


async def test_policy_marks_task_tools_and_leaves_the_rest_sync(
    server: HttpServer, conformance_exposed: tuple[Registry, MemorySink]
) -> None:
    """With no ``task_tools`` configured, a policy-marked tool becomes a task, a
    ``required`` one is refused -32021 to a client without the extension, and an unmarked
    tool answers at once even to a client that declared tasks (defaults safe)."""
    registry = conformance_exposed[0]
    marked = {t.name: t.task_support for t in registry.tools() if t.task_support}
    assert len(marked) == 6 and marked["failing_job"] == "required", marked
    async with httpx.AsyncClient(timeout=30) as http:
        created = (
            await rpc(
                http,
                server.url,
                "tools/call",
                {"name": tool(registry, "slow_compute"), "arguments": {"seconds": 0}},
            )
        )["result"]
        assert created["resultType"] == "task", created
        done = await until(http, server.url, created["taskId"], "completed")
        assert done["result"]["content"], done
        refused = await rpc(
            http, server.url, "tools/call", {"name": "failing_job", "arguments": {}}, caps={}
        )
        assert refused["error"]["code"] == -32021, refused
        greeted = (
            await rpc(
                http,
                server.url,
                "tools/call",
                {"name": tool(registry, "greet"), "arguments": {"name": "Ada"}},
            )
        )["result"]
        assert "taskId" not in greeted and greeted["content"][0]["text"] == "Hello, Ada!", greeted
