"""A drain longer than its grace: the calls still running end as a server shutdown."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import anyio.to_thread
import pytest
from mcp import types

from skilld.audit import MemorySink
from skilld.call import CallContext
from skilld.errors import CallCancelled
from skilld.registry import Registry, SkillEntry
from skilld.types import CallOutput, Limits, MethodSpec, SkillSpec
from support.mcp_fakes import memory_service, memory_session, text_of

pytestmark = pytest.mark.anyio


class _Waits:
    """A skill whose call runs until cancelled, polling the channel as a guest does."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.saw_cancel = threading.Event()

    def call(self, method: str, args_json: str, ctx: CallContext) -> CallOutput:
        self.started.set()
        while not ctx.channel.cancelled():
            threading.Event().wait(0.005)
        self.saw_cancel.set()
        raise CallCancelled("work: stopped on request")

    def read_resource(self, uri: str, ctx: CallContext) -> list[CallOutput]:
        raise AssertionError("not served")

    def get_prompt(self, name: str, args_json: str, ctx: CallContext) -> list[dict[str, Any]]:
        raise AssertionError("not served")


async def test_a_call_past_the_drain_grace_is_answered_server_shutdown() -> None:
    """Past the grace the running call is ended and its client told the server shut down
    (not that it cancelled), its audit record says ``shutdown``; the drain reports False,
    and ends within a second more."""
    sink = MemorySink()
    registry = Registry(audit=sink)
    backend = _Waits()
    spec = SkillSpec("work", "1.0.0", "work", (MethodSpec("wait", "wait", {"type": "object"}),))
    registry.add(SkillEntry(spec=spec, component=backend, limits=Limits(timeout_ms=30_000)))
    registry.mark_ready()
    service = memory_service(registry)
    results: list[types.CallToolResult] = []
    drained: list[bool] = []

    async def call() -> None:
        results.append(await session.call_tool("work/wait", {}))

    with anyio.fail_after(30):
        async with memory_session(service) as session, anyio.create_task_group() as tg:
            tg.start_soon(call)
            await anyio.to_thread.run_sync(backend.started.wait)
            started = anyio.current_time()
            drained.append(await service.drain(0.2))
            took = anyio.current_time() - started
    assert drained == [False]
    assert backend.saw_cancel.is_set()
    assert took < 5, took  # the call itself would wait for ever
    (result,) = results
    assert result.is_error
    text = text_of(result)
    assert text.startswith("[unavailable] the server shut down"), text
    assert "drain grace ran out" in text
    assert "client" not in text
    (record,) = [r for r in sink.records if r.get("event") == "call"]
    assert record["outcome"] == "shutdown"
