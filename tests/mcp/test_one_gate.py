"""One concurrency gate per skill, whoever calls: an MCP request, a routed call, an invoke."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.to_thread
import pytest

from skilld.audit import MemorySink
from skilld.errors import SkillBusy
from skilld.mcp import ServeConfig
from skilld.registry import Call, NullChannel, Registry
from skilld.types import Caller
from support.held import HeldBackend, held_registry
from support.mcp_fakes import memory_service, memory_session, text_of

# A routed call as a worker sees it: the entry node n2 and the caller it verified.
N2 = Caller.anonymous().routed_from("n2")

pytestmark = pytest.mark.anyio


def _registry(limit: int) -> tuple[Registry, MemorySink, HeldBackend]:
    backend = HeldBackend()
    registry, sink = held_registry(limit, limit, 300, backend)
    return registry, sink, backend


async def test_an_mcp_call_and_a_routed_call_wait_on_the_same_gate() -> None:
    """With the skill's one slot held by an MCP call, a routed call is refused busy (same
    words), and the other way round; the MCP call took one slot, not two."""
    reg, sink, backend = _registry(limit=1)
    service = memory_service(reg, ServeConfig(queue_timeout_s=0.2, inline_ms=0))
    gate = reg.gate("held")
    with anyio.fail_after(30):
        async with memory_session(service) as session, anyio.create_task_group() as tg:
            tg.start_soon(session.call_tool, "held/hold", {})
            await anyio.to_thread.run_sync(backend.started.wait)
            # Lent, not taken twice: a limit of 1 let the MCP call run at all.
            assert (gate.running, gate.waiting) == (1, 0)
            with pytest.raises(SkillBusy) as routed:
                await anyio.to_thread.run_sync(
                    lambda: reg.call_method(Call("held", "hold", {}, NullChannel(), caller=N2))
                )
            backend.release.set()
        assert gate.running == 0
        backend.release.clear()
        backend.started.clear()

        def routed_call() -> Any:
            return reg.call_method(Call("held", "hold", {}, NullChannel(), caller=N2)).value

        async with memory_session(service) as session, anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, routed_call)
            await anyio.to_thread.run_sync(backend.started.wait)
            busy = await session.call_tool("held/hold", {})
            backend.release.set()
    assert busy.is_error
    assert text_of(busy) == f"[limit-exceeded] {routed.value.message}"
    assert routed.value.message == "skill held is busy (1 calls running); retry later"
    assert backend.most == 1
    assert [(r["caller"], r["outcome"]) for r in sink.records if r["event"] == "call"] == [
        ("node:n2<anonymous", "busy"),  # refused while the MCP call ran
        ("local:stdio", "ok"),
        ("local:stdio", "busy"),  # refused by the MCP layer while the routed call ran
        ("node:n2<anonymous", "ok"),
    ]
    assert [r.get("refused", False) for r in sink.records if r["outcome"] == "busy"] == [
        False,  # the registry's: a call record of a call that never got a slot
        True,  # the MCP layer's: a refusal before the call reached the registry
    ]


async def test_an_invoke_inside_an_mcp_call_takes_its_own_slot() -> None:
    """An invoke nested in an MCP call of another skill takes a slot of the callee's gate;
    with the callee's slots taken it is refused busy at once, typed, to the caller."""
    reg, sink, backend = _registry(limit=1)
    service = memory_service(reg, ServeConfig(queue_timeout_s=0.2))
    with anyio.fail_after(30):
        async with memory_session(service) as session, anyio.create_task_group() as tg:
            tg.start_soon(session.call_tool, "held/hold", {})
            await anyio.to_thread.run_sync(backend.started.wait)
            relayed = await session.call_tool("relay/relay", {})
            backend.release.set()
    assert relayed.is_error
    assert "[limit-exceeded] skill held is busy (1 calls running)" in text_of(relayed)
    calls = [(r["skill"], r["caller"], r["outcome"]) for r in sink.records if r["event"] == "call"]
    assert ("held", "skill:relay<local:stdio", "busy") in calls
    assert reg.gate("held").running == reg.gate("relay").running == 0


async def test_a_storm_of_cancelled_calls_leaves_no_slot_behind() -> None:
    """Twelve MCP calls of one caller on a skill of two slots (the caller's share: one),
    half of them cancelled while queued or running: never more than its share run at once,
    every slot comes back, the rest all finish."""
    reg, _sink, backend = _registry(limit=2)
    service = memory_service(reg, ServeConfig(queue_timeout_s=30, inline_ms=0))
    gate = reg.gate("held")
    finished: list[str] = []

    async def call(scope: anyio.CancelScope) -> None:
        with scope:
            finished.append(text_of(await session.call_tool("held/hold", {})))

    with anyio.fail_after(30):
        async with memory_session(service) as session, anyio.create_task_group() as tg:
            scopes = [anyio.CancelScope() for _ in range(12)]
            for scope in scopes:
                tg.start_soon(call, scope)
            while gate.waiting < 11:  # a condition, not a pause: the queue fills up
                await anyio.sleep(0.001)
            assert gate.running == gate.share == 1
            for scope in scopes[::2]:
                scope.cancel()
            while gate.waiting > 5:  # the cancelled waiters leave the queue
                await anyio.sleep(0.001)
            backend.release.set()
    assert finished == ["held for local"] * 6
    assert backend.most == 1
    assert (gate.running, gate.waiting) == (0, 0)
