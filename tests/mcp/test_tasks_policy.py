"""Which tools run as tasks comes from the skill's policy (``mcp.tasks``), not the config."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx2 as httpx
import pytest
from mcp_fakes import running_http
from test_mcp_rounds import tool
from test_mcp_tasks import rpc, until

from skilld.audit import MemorySink
from skilld.mcp import HttpServer, ServeConfig
from skilld.permissions import SkillPermissions
from skilld.policy import compile_policies
from skilld.registry import NullChannel, Registry, SkillEntry
from skilld.sandbox import CallContext, Sandbox
from tests_env import ROOT

pytestmark = pytest.mark.anyio


@pytest.fixture
def conformance(
    sandbox: Sandbox, component_path: Callable[[str], Path], tmp_path: Path
) -> tuple[Registry, MemorySink]:
    """The conformance skill with its policy's whole exposure (names and ``mcp.tasks``)."""
    (tmp_path / "conformance.yaml").write_text(
        (ROOT / "tests" / "policies" / "conformance.yaml").read_text()
    )
    compiled = compile_policies(tmp_path, {"conformance": None})
    checker = SkillPermissions.from_tables(compiled.tables, "conformance")
    comp = sandbox.load(component_path("conformance").read_bytes(), name="conformance")
    spec = comp.describe(CallContext("conformance", checker.limits, NullChannel()))
    sink = MemorySink()
    registry = Registry(audit=sink)
    registry.add(
        SkillEntry(
            spec=dataclasses.replace(spec, id="conformance"),
            component=comp,
            limits=checker.limits,
            checker=checker,
            exposure=checker.exposure,
        )
    )
    registry.mark_ready()
    return registry, sink


@pytest.fixture
async def server(conformance: tuple[Registry, MemorySink]) -> AsyncIterator[HttpServer]:
    """The conformance skill served with no ``task_tools`` at all."""
    async with running_http(conformance[0], ServeConfig(transport="http", port=0)) as srv:
        yield srv


async def test_policy_marks_task_tools_and_leaves_the_rest_sync(
    server: HttpServer, conformance: tuple[Registry, MemorySink]
) -> None:
    """With no ``task_tools`` configured, a policy-marked tool becomes a task, a
    ``required`` one is refused -32021 to a client without the extension, and an unmarked
    tool answers at once even to a client that declared tasks (defaults safe)."""
    registry = conformance[0]
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
