"""The worker pool under the MCP server: results, errors, limits, idle exit, cancellation."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from typing import Any

import anyio
import pytest

from skilld.mcp import _workers
from skilld.mcp._workers import WorkerPool

pytestmark = pytest.mark.anyio


async def test_results_and_errors_come_back_from_the_thread() -> None:
    """A value returns; an exception is raised in the awaiting task with its own type."""
    pool = WorkerPool(4)
    caller = threading.get_ident()
    ran_on: list[int] = []

    def work() -> str:
        ran_on.append(threading.get_ident())
        return "done"

    assert await pool.run(work, lambda: None) == "done"
    assert ran_on and ran_on[0] != caller

    def fail() -> None:
        raise KeyError("nope")

    with pytest.raises(KeyError, match="nope"):
        await pool.run(fail, lambda: None)


async def test_threads_start_on_demand_and_never_exceed_the_size() -> None:
    """Eight blocking jobs on a pool of two: two run at a time, two threads exist."""
    pool = WorkerPool(2)
    running = 0
    most = 0
    lock = threading.Lock()

    def job() -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.02)
        with lock:
            running -= 1

    assert pool.threads == 0
    async with anyio.create_task_group() as tg:
        for _ in range(8):
            tg.start_soon(pool.run, job, lambda: None)
    assert most == 2
    assert pool.threads == 2


async def test_idle_threads_leave(monkeypatch: pytest.MonkeyPatch) -> None:
    """A quiet pool keeps no thread."""
    monkeypatch.setattr(_workers, "_IDLE_S", 0.05)
    pool = WorkerPool(3)
    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(pool.run, lambda: time.sleep(0.01), lambda: None)
    assert pool.threads >= 1
    with anyio.fail_after(5):
        while pool.threads:
            await anyio.sleep(0.02)
    # ... and starts again when work comes.
    assert await pool.run(lambda: 7, lambda: None) == 7


async def test_cancel_tells_the_job_and_waits_for_it() -> None:
    """On cancellation on_cancel runs at once; the await ends only after the job ended."""
    pool = WorkerPool(2)
    stop = threading.Event()
    ended = threading.Event()
    unretrieved: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: unretrieved.append(ctx))

    def job() -> None:
        stop.wait(10)
        ended.set()
        raise RuntimeError("stopped late")  # an error nobody will read

    with anyio.move_on_after(0.05) as scope:
        await pool.run(job, stop.set)
    assert scope.cancelled_caught
    assert stop.is_set() and ended.is_set()
    # The job's error was retrieved, not reported as "never retrieved" later.
    gc.collect()
    await anyio.sleep(0.01)
    assert unretrieved == []
