"""The MCP layer over a real registry: per-skill arguments checked, cancellation reaching wasm."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio import wait_all_tasks_blocked

from skilld.audit import MemorySink
from skilld.errors import RunOnThread
from skilld.mcp import ServeConfig
from skilld.registry import Exposure, NullChannel, Registry, SkillEntry
from skilld.sandbox import CallContext, Sandbox
from skilld.state import SqliteState
from skilld.types import Limits
from support.mcp_fakes import Inbox, connect, memory_service, memory_session, text_of

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
        # A u32 parameter: the schema says minimum 0, so -1 never reaches kv.keys (a trap).
        ({"method": "list", "args": {"limit": -1}}, "-1 is less than the minimum of 0"),
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
    # Audited as refused: the guest never ran.
    assert [(r["outcome"], r.get("refused")) for r in sink.records] == [("invalid-argument", True)]


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
    assert [r["method"] for r in sink.records if r["event"] == "call"] == ["add", "list"]


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


async def test_guest_calls_go_to_a_thread_without_an_inline_attempt(
    sandbox: Sandbox, component_path: Callable[[str], Path]
) -> None:
    """A wasm guest's tools are never tried on the event loop (``Tool.inline`` is False:
    the attempt could only give up): each guest body runs once (its progress notifications
    are not repeated), one audit record per call, and a guest that spins does so on a
    worker thread (others' calls go on)."""
    limits = Limits(timeout_ms=60_000)
    sink = MemorySink()
    registry = Registry(audit=sink)
    for name in ("echo-wat", "hostile"):
        comp = sandbox.load(component_path(name).read_bytes(), name=name)
        registry.add(
            SkillEntry(
                spec=comp.describe(CallContext(name, limits, NullChannel())),
                component=comp,
                limits=limits,
            )
        )
        if name == "hostile":  # warm instances: the attempt still gives up before using one
            comp.prewarm(limits, depth=2)
            registry.call("hostile/ok", {}, NullChannel())
            warm = comp
    registry.mark_ready()

    async def warmed() -> None:
        while warm._pool.qsize() < 2:
            await anyio.sleep(0.01)

    attempts: list[tuple[str, str]] = []  # (tool, "inline" | "gave up" | "gave up, ran")
    call_inline = registry.call_inline

    def spy(tool: str, *args: Any, **kwargs: Any) -> Any:
        try:
            out = call_inline(tool, *args, **kwargs)
        except RunOnThread:
            attempts.append((tool, "gave up"))
            raise
        attempts.append((tool, "inline"))
        return out

    registry.call_inline = spy  # type: ignore[method-assign]
    inbox = Inbox()
    # A budget no stall of a loaded machine exhausts in the middle of echo-wat's call.
    service = memory_service(registry, ServeConfig(inline_ms=100))
    with anyio.fail_after(60):
        async with memory_session(service, inbox) as session:
            for i in range(5):
                result = await session.call_tool("echo-wat/echo", {"text": f"hi {i}"})
                assert text_of(result) == f"hi {i}"
            await warmed()
            chatty = await session.call_tool(
                "hostile/chatty", {"steps": 3}, progress_callback=inbox.on_progress
            )
            assert text_of(chatty) == "3"
            assert [p[0] for p in inbox.progress] == [1, 2, 3]
            await warmed()
            async with anyio.create_task_group() as tg:
                tg.start_soon(session.call_tool, "hostile/loop", {})
                await wait_all_tasks_blocked()  # the guest spins on a worker thread now
                with anyio.fail_after(5):
                    quick = await session.call_tool("echo-wat/echo", {"text": "still here"})
                assert text_of(quick) == "still here"
                tg.cancel_scope.cancel()
    assert attempts == []
    assert not any(tool.inline for tool in registry.tools())
    outcomes = [(r["skill"], r["method"], r["outcome"]) for r in sink.records]
    assert outcomes == [
        ("hostile", "ok", "ok"),
        *[("echo-wat", "echo", "ok")] * 5,
        ("hostile", "chatty", "ok"),
        ("echo-wat", "echo", "ok"),
        ("hostile", "loop", "cancelled"),
    ]
