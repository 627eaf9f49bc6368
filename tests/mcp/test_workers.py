"""The worker pool under the MCP server: results, errors, limits, idle exit, cancellation,
the ledger against a model, fairness between callers and bounded waits."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from functools import partial
from typing import Any

import anyio
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from skilld.errors import SkillBusy
from skilld.mcp._workers import Ledger, Queued, WorkerPool, per_caller_share

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


async def test_idle_threads_leave() -> None:
    """A quiet pool keeps no thread."""
    pool = WorkerPool(3, idle_s=0.05)
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


# -- the ledger against a model of threads -----------------------------------------


class _Threads(RuleBasedStateMachine):
    """Threads driving a ``Ledger`` in any interleaving of submits, notifications and timeouts.

    Each simulated thread is ``coming`` (started or woken, about to look at the queue),
    ``waiting`` (inside its wait; a notification may or may not reach it, its timeout
    may fire any time) or running a job. Whatever happens, a job never waits while
    a thread sits idle, and the counters match the threads.
    """

    def __init__(self) -> None:
        super().__init__()
        self.ledger: Ledger[int] = Ledger(size=4, per_caller=per_caller_share(4))
        self.coming: list[str] = []  # thread names on their way to look
        self.waiting: list[str] = []
        self.notified: set[str] = set()
        self.running: dict[str, Queued[int]] = {}
        self.queued: list[Queued[int]] = []
        self.names = 0

    def _wake(self) -> None:
        notify, start = self.ledger.wake()
        # A notification reaches a waiter still in the condition's queue, if any is.
        for name in [w for w in self.waiting if w not in self.notified][:notify]:
            self.notified.add(name)
        for _ in range(start):
            self.names += 1
            self.coming.append(f"t{self.names}")

    def _look(self, name: str) -> None:
        item = self.ledger.take()
        if item is None:
            self.ledger.waiting += 1
            self.waiting.append(name)
            return
        self.queued.remove(item)
        self.running[name] = item
        self._wake()

    @rule(key=st.sampled_from(["alice", "bob", "carol"]), skill=st.sampled_from(["a", "b"]))
    def submit(self, key: str, skill: str) -> None:
        item = Queued(len(self.queued), key, skill)
        self.ledger.add(item)
        self.queued.append(item)
        self._wake()

    @precondition(lambda self: self.coming)
    @rule(data=st.data())
    def arrive(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(self.coming))
        self.coming.remove(name)
        self.ledger.arrived()
        self._look(name)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.running)))
        self.ledger.done(self.running.pop(name))
        self._wake()
        self._look(name)

    @precondition(lambda self: self.waiting)
    @rule(data=st.data(), timed_out=st.booleans())
    def wake_up(self, data: st.DataObject, timed_out: bool) -> None:
        """A waiter wakes: notified, or at its timeout (CPython may report a notified
        waiter as timed out when both happen at once)."""
        name = data.draw(st.sampled_from(self.waiting))
        if not timed_out and name not in self.notified:
            return  # only a notification or a timeout wakes a waiter
        self.waiting.remove(name)
        self.notified.discard(name)
        self.ledger.waiting -= 1
        self.ledger.arrived()
        if timed_out and self.ledger.may_leave():
            return
        self._look(name)

    @precondition(lambda self: self.queued)
    @rule(data=st.data())
    def withdraw(self, data: st.DataObject) -> None:
        item = data.draw(st.sampled_from(self.queued))
        assert self.ledger.withdraw(item)
        self.queued.remove(item)

    @invariant()
    def counters_match_the_threads(self) -> None:
        threads = len(self.coming) + len(self.waiting) + len(self.running)
        assert self.ledger.threads == threads <= self.ledger.size
        assert self.ledger.waiting == len(self.waiting)
        assert 0 <= self.ledger.coming <= len(self.coming) + len(self.notified)
        for key, n in self.ledger.running.items():
            assert 0 < n <= self.ledger.per_caller, key

    @invariant()
    def a_runnable_job_always_has_a_thread_on_its_way(self) -> None:
        """Once every thread on its way has looked, no job it may run is left beside an
        idle thread, and a job waits only while its caller's share or the pool is full."""
        if self.coming or self.notified:
            return  # not settled yet: those threads will look
        runnable = self.ledger.eligible()
        if runnable:
            assert not self.waiting, "a job waits while a thread idles"
            assert self.ledger.threads == self.ledger.size, "a job waits below the size"


TestLedger = _Threads.TestCase
TestLedger.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)


async def test_a_burst_then_quiet_leaves_the_pool_serving() -> None:
    """The issue's wedge: a burst wider than the pool, idle threads timing out, then calls.

    A worker used to count itself idle after each job and take the next queued one
    without un-counting; after a burst the idle count exceeded the live threads, they
    timed out, and later jobs waited for threads that no longer existed.
    """
    pool = WorkerPool(8, idle_s=0.05)
    release = threading.Event()

    def long() -> int:
        release.wait(10)
        return 1

    async with anyio.create_task_group() as tg:
        for i in range(80):
            tg.start_soon(partial(pool.run, long, lambda: None, key=f"c{i % 3}", skill=f"s{i % 9}"))
        with anyio.fail_after(5):
            while pool.queued < 80 - pool.size:
                await anyio.sleep(0.01)
        release.set()
    with anyio.fail_after(5):
        while pool.threads:
            await anyio.sleep(0.02)
    with anyio.fail_after(5):
        results = []
        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(_append, results, pool.run(lambda: 2, lambda: None, key=f"c{i}"))
    assert results == [2] * 20


async def _append(out: list[Any], pending: Any) -> None:
    out.append(await pending)


async def test_waiting_for_a_thread_is_bounded_and_refused_as_busy() -> None:
    """With every thread taken, a call waits wait_s, is refused busy, and never runs."""
    pool = WorkerPool(1)
    release = threading.Event()
    ran: list[str] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(pool.run, lambda: release.wait(10), lambda: None, key="a"))
        with anyio.fail_after(5):
            while pool.threads == 0:
                await anyio.sleep(0.01)
        with pytest.raises(SkillBusy, match="every worker thread"):
            await pool.run(lambda: ran.append("late"), lambda: None, key="a", wait_s=0.1)
        release.set()
    assert pool.queued == 0
    assert ran == []


async def test_a_cancelled_waiting_job_never_runs() -> None:
    """A call cancelled before a thread took it is withdrawn: its job does not run later."""
    pool = WorkerPool(1)
    release = threading.Event()
    ran: list[str] = []
    told: list[str] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(pool.run, lambda: release.wait(10), lambda: None))
        with anyio.fail_after(5):
            while pool.threads == 0:
                await anyio.sleep(0.01)
        with anyio.move_on_after(0.1):
            await pool.run(lambda: ran.append("late"), lambda: told.append("cancel"))
        release.set()
    assert pool.queued == 0
    assert ran == [] and told == []


async def test_one_callers_backlog_leaves_threads_for_another() -> None:
    """Alice's 256 long calls fill her share of the threads; Bob's call runs at once."""
    pool = WorkerPool(8)
    release = threading.Event()
    async with anyio.create_task_group() as tg:
        for i in range(256):
            tg.start_soon(
                partial(
                    pool.run, lambda: release.wait(30), lambda: None, key="alice", skill=f"s{i % 9}"
                )
            )
        with anyio.fail_after(5):
            while pool.queued < 256 - per_caller_share(8):
                await anyio.sleep(0.01)
        # Bob's deadline is far below how long Alice's calls run.
        with anyio.fail_after(2):
            assert await pool.run(lambda: "bob", lambda: None, key="bob", wait_s=1.0) == "bob"
        release.set()
