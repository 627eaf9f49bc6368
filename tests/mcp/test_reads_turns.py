"""One caller's resource reads take turns; another caller's never wait for them.

:class:`skilld.mcp._surfaces.CallerReads` in isolation, with :class:`AfterResponse`
standing for the HTTP request (the served attack is in
``tests/agentskills/test_kept_outputs.py``).
"""

from __future__ import annotations

import anyio
import pytest

from skilld.mcp._after import AfterResponse, after_response
from skilld.mcp._surfaces import CallerReads

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_callers_reads_wait_for_its_turns_not_for_others() -> None:
    reads = CallerReads(2)
    inside: list[str] = []
    hold = anyio.Event()

    async def read(key: str) -> None:
        async with reads.turn(key):
            inside.append(key)
            await hold.wait()

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(read, "mallory")
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(read, "alice")
        await anyio.wait_all_tasks_blocked()
        # mallory holds her two turns; alice is in at once, not behind mallory's three.
        assert sorted(inside) == ["alice", "mallory", "mallory"]
        hold.set()
    assert len(inside) == 6
    assert reads._turns == {}  # nothing kept for callers with no read


async def test_a_read_cancelled_while_it_waits_leaves_nothing() -> None:
    reads = CallerReads(1)
    release = anyio.Event()

    async def first() -> None:
        async with reads.turn("mallory"):
            await release.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        await anyio.wait_all_tasks_blocked()
        with anyio.move_on_after(0.05):
            async with reads.turn("mallory"):
                raise AssertionError("the second read got a turn while the first held it")
        release.set()
    assert reads._turns == {}
    async with reads.turn("mallory"):  # the turn the cancelled wait never took is free
        pass


async def test_a_turn_taken_in_an_http_request_ends_with_its_response() -> None:
    """Inside a request (AfterResponse), the turn outlives the block until the app
    returns, i.e. until the response is written; outside one it ends with the block."""
    reads = CallerReads(1)
    seen: list[bool] = []

    async def app(scope: object, receive: object, send: object) -> None:
        async with reads.turn("alice"):
            pass
        # The answer is being written: alice's turn is still held.
        seen.append(bool(reads._turns))

    await AfterResponse(app)({"type": "http"}, None, None)  # type: ignore[arg-type]
    assert seen == [True]
    assert reads._turns == {}
    async with reads.turn("alice"):
        pass
    assert reads._turns == {}
    assert after_response(lambda: None) is False  # no request here
