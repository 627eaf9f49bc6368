"""The MCP layer over a real registry: per-skill arguments checked, cancellation reaching wasm."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from anyio import wait_all_tasks_blocked
from mcp_fakes import connect, text_of

from skilld.audit import MemorySink
from skilld.registry import Exposure, NullChannel, Registry, SkillEntry
from skilld.sandbox import CallContext, Sandbox
from skilld.state import SqliteState
from skilld.types import Limits

pytestmark = pytest.mark.anyio


@pytest.fixture
def notes(
    sandbox: Sandbox, component_path: Callable[[str], Path], tmp_path: Path
) -> tuple[Registry, MemorySink]:
    """A registry serving the notes skill as one per-skill tool, auditing to memory."""
    comp = sandbox.load(component_path("notes").read_bytes(), name="notes")
    sink = MemorySink()
    registry = Registry(audit=sink)
    registry.add(
        SkillEntry(
            spec=comp.describe(CallContext("notes", Limits(), NullChannel())),
            component=comp,
            kv=SqliteState(tmp_path / "state.db").store("notes"),
            exposure=Exposure(per_skill=True),
        )
    )
    registry.mark_ready()
    return registry, sink


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (
            {"method": "add", "args": {"title": 1, "body": "b"}},
            "invalid arguments at args/title: 1 is not of type 'string'",
        ),
        ({"method": "add", "args": {"title": "t"}}, "'body' is a required property"),
        ({"method": "add"}, "'args' is a required property"),
        ({"method": "drop_all"}, "invalid arguments at method: 'drop_all' is not one of"),
    ],
)
async def test_bad_per_skill_arguments_never_reach_the_guest(
    notes: tuple[Registry, MemorySink], arguments: dict[str, object], expected: str
) -> None:
    """Arguments that do not fit the chosen method's schema are a tool error; no guest runs."""
    registry, sink = notes
    with anyio.fail_after(30):
        async with connect("memory", registry) as session:
            result = await session.call_tool("notes", arguments)
    assert result.is_error
    assert text_of(result).startswith("[invalid-argument] tool notes: ")
    assert expected in text_of(result)
    assert sink.records == []


async def test_good_per_skill_arguments_reach_the_guest(
    notes: tuple[Registry, MemorySink],
) -> None:
    """Arguments that fit the chosen method run it, and the call is audited."""
    registry, sink = notes
    with anyio.fail_after(30):
        async with connect("memory", registry) as session:
            added = await session.call_tool(
                "notes", {"method": "add", "args": {"title": "t", "body": "b"}}
            )
            listed = await session.call_tool("notes", {"method": "list"})
    assert not added.is_error and not listed.is_error, text_of(added) + text_of(listed)
    assert [r["method"] for r in sink.records] == ["add", "list"]


async def test_client_cancellation_stops_a_spinning_guest(
    sandbox: Sandbox, component_path: Callable[[str], Path]
) -> None:
    """A client cancel stops a wasm guest that never polls cancelled(), well before its deadline."""
    comp = sandbox.load(component_path("hostile").read_bytes(), name="hostile")
    limits = Limits(timeout_ms=60_000)
    sink = MemorySink()
    registry = Registry(audit=sink)
    registry.add(
        SkillEntry(
            spec=comp.describe(CallContext("hostile", limits, NullChannel())),
            component=comp,
            limits=limits,
        )
    )
    with anyio.fail_after(30):
        async with connect("memory", registry) as session, anyio.create_task_group() as tg:
            tg.start_soon(session.call_tool, "hostile/loop", {})
            await wait_all_tasks_blocked()  # the guest is spinning on its worker thread
            tg.cancel_scope.cancel()
        # Leaving the session waited for the guest's thread: the call has ended.
    (record,) = sink.records
    assert (record["method"], record["outcome"]) == ("loop", "cancelled")
