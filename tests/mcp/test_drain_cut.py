"""A drain longer than its grace: the calls still running end as a server shutdown."""

from __future__ import annotations

import anyio
import anyio.to_thread
import pytest
from mcp import types

from support.mcp_fakes import Gate, fake_dispatcher, memory_service, memory_session, text_of

pytestmark = pytest.mark.anyio


async def test_a_call_past_the_drain_grace_is_answered_server_shutdown() -> None:
    """Past the grace the running call is ended and its client told the server shut down
    (not that it cancelled); the drain reports False, and ends within a second more."""
    gate = Gate()
    service = memory_service(fake_dispatcher(gate))
    results: list[types.CallToolResult] = []
    drained: list[bool] = []

    async def call() -> None:
        results.append(await session.call_tool("work/wait", {}))

    with anyio.fail_after(30):
        async with memory_session(service) as session, anyio.create_task_group() as tg:
            tg.start_soon(call)
            await anyio.to_thread.run_sync(gate.started.wait)
            started = anyio.current_time()
            drained.append(await service.drain(0.2))
            took = anyio.current_time() - started
    assert drained == [False]
    assert gate.saw_cancel.is_set()
    assert took < 1.2, took
    (result,) = results
    assert result.is_error
    text = text_of(result)
    assert text.startswith("[unavailable] the server shut down"), text
    assert "drain grace of 0.2 s" in text
    assert "client" not in text
