"""The threads that run blocking guest calls for the event loop.

skilld needs to see a cancellation while a call runs on its thread, which with
``anyio.to_thread.run_sync`` took a task group and a shielded worker task around
it. A queue of jobs and one asyncio future settled from the worker thread does the
same for about a fifth of the CPU (``bench/bench_handoff.py``, 16 concurrent callers
of a no-op).

The pool's bookkeeping is a plain state machine, :class:`Ledger`, that the threads
drive under one lock; it decides which job runs next and how many threads to wake
or start, and it never trusts a promise a thread may not keep:

- every thread that is waiting wakes (notified, or at its idle timeout) and *looks*
  at the queue before it may leave, and it leaves only when it finds nothing it may
  run; a submitted job therefore always finds a thread, however notifications and
  timeouts interleave (``tests/mcp/test_workers.py`` checks it against a model);
- ``coming`` counts the threads on their way to look (started, or notified) and is
  only ever an under-estimate, so the pool may wake one thread too many, never one
  too few;
- jobs queue per caller (``Caller.key``) and, within a caller, per skill, and are
  taken round-robin; one caller holds at most :attr:`Ledger.per_caller` threads, so
  a caller's backlog of long calls leaves threads for everyone else's;
- a job that waited ``wait_s`` without a thread is taken out of the queue and
  refused as :class:`~skilld.errors.SkillBusy`, like a call that waited too long for
  its skill's slot.

The server runs on asyncio (uvicorn, and ``anyio.run``'s default backend), so the
future is an asyncio one; anyio's cancel scopes cancel the awaiting task, which is
where the call is told to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import anyio

from skilld import telemetry
from skilld.errors import SkillBusy

T = TypeVar("T")
J = TypeVar("J")

# An idle thread leaves after this long, so a quiet server (or a test) keeps none.
IDLE_S = 10.0


def per_caller_share(size: int) -> int:
    """How many of ``size`` threads one caller may hold: all but a quarter (at least one)."""
    return max(1, size - size // 4)


@dataclass(eq=False)
class Queued(Generic[J]):
    """A job in the ledger: what to run, for whom, and where it stands."""

    job: J
    key: str = ""
    skill: str = ""
    state: str = "queued"  # queued -> running -> done, or queued -> withdrawn


@dataclass
class Ledger(Generic[J]):
    """The pool's state and decisions, without threads (driven under the pool's lock).

    Counters: ``threads`` alive; ``waiting`` inside their wait (woken or not);
    ``coming`` an under-estimate of the threads on their way to look at the queue
    (started, or notified and not yet awake).
    """

    size: int
    per_caller: int
    threads: int = 0
    waiting: int = 0
    coming: int = 0
    # caller key -> skill -> jobs, both levels in round-robin order (the front is next).
    queues: dict[str, dict[str, deque[Queued[J]]]] = field(default_factory=dict)
    running: dict[str, int] = field(default_factory=dict)

    def add(self, item: Queued[J]) -> None:
        """Queue ``item`` behind its caller's and skill's earlier jobs."""
        self.queues.setdefault(item.key, {}).setdefault(item.skill, deque()).append(item)

    def withdraw(self, item: Queued[J]) -> bool:
        """Take a still-queued ``item`` out of the queue; False once a thread took it."""
        if item.state != "queued":
            return False
        by_skill = self.queues[item.key]
        jobs = by_skill[item.skill]
        jobs.remove(item)
        if not jobs:
            del by_skill[item.skill]
            if not by_skill:
                del self.queues[item.key]
        item.state = "withdrawn"
        return True

    def eligible(self) -> int:
        """How many queued jobs a thread could take now (their callers below their share)."""
        if not self.queues:
            return 0
        return sum(
            min(sum(len(q) for q in by_skill.values()), self.per_caller - self.running.get(k, 0))
            for k, by_skill in self.queues.items()
        )

    def take(self) -> Queued[J] | None:
        """The next job to run (round-robin over callers, then skills), or None."""
        for key in list(self.queues):
            by_skill = self.queues.pop(key)
            if self.running.get(key, 0) >= self.per_caller:
                self.queues[key] = by_skill  # to the back: others come first next time
                continue
            skill, jobs = next(iter(by_skill.items()))
            del by_skill[skill]
            item = jobs.popleft()
            if jobs:
                by_skill[skill] = jobs
            if by_skill:
                self.queues[key] = by_skill
            self.running[key] = self.running.get(key, 0) + 1
            item.state = "running"
            return item
        return None

    def done(self, item: Queued[J]) -> None:
        """``item``'s job returned (or raised)."""
        left = self.running[item.key] - 1
        if left:
            self.running[item.key] = left
        else:
            del self.running[item.key]
        item.state = "done"

    def wake(self) -> tuple[int, int]:
        """How many waiting threads to notify and how many to start, counted as coming."""
        if self.waiting <= self.coming and self.threads >= self.size:
            return 0, 0  # no thread to wake or start: skip counting (the common case)
        need = self.eligible() - self.coming
        notify = max(0, min(need, self.waiting - self.coming))
        start = max(0, min(need - notify, self.size - self.threads))
        self.coming += notify + start
        self.threads += start
        return notify, start

    def arrived(self) -> None:
        """A thread that was started or woke up is about to look at the queue."""
        if self.coming:
            self.coming -= 1

    def may_leave(self) -> bool:
        """A thread that timed out waiting leaves unless there is a job it may take."""
        if self.eligible():
            return False
        self.threads -= 1
        return True


class WorkerPool:
    """Up to ``size`` threads, started on demand, running one job at a time each.

    Jobs beyond what threads can take wait in per-caller queues (see the module's
    docstring); an idle thread leaves after ``idle_s``.
    """

    def __init__(self, size: int, name: str = "skilld-call", idle_s: float = IDLE_S):
        self.size = size
        self.idle_s = idle_s
        self._name = name
        self._lock = threading.Lock()
        # Each waiting thread's own wake-up lock (held while it sleeps), most recent last.
        self._idle: list[threading.Lock] = []
        self._ledger: Ledger[Callable[[], None]] = Ledger(size, per_caller_share(size))

    @property
    def threads(self) -> int:
        """How many threads are alive now."""
        return self._ledger.threads

    @property
    def queued(self) -> int:
        """How many jobs wait for a thread now."""
        with self._lock:
            return sum(len(q) for s in self._ledger.queues.values() for q in s.values())

    def submit(self, job: Callable[[], None], key: str = "", skill: str = "") -> Queued[Any]:
        """Queue ``job`` for caller ``key`` and ``skill``; wake or start threads as needed."""
        item: Queued[Callable[[], None]] = Queued(job, key, skill)
        with self._lock:
            self._ledger.add(item)
            self._wake()
        return item

    def withdraw(self, item: Queued[Any]) -> bool:
        """Take ``item`` out of the queue if no thread took it yet (True if so)."""
        with self._lock:
            return self._ledger.withdraw(item)

    def _wake(self) -> None:
        notify, start = self._ledger.wake()
        # The most recently idle first: the others may reach their idle timeout and leave.
        for _ in range(min(notify, len(self._idle))):
            self._idle.pop().release()
        for _ in range(start):
            threading.Thread(target=self._work, name=self._name, daemon=True).start()

    def _work(self) -> None:
        ledger = self._ledger
        lock = self._lock
        wake = threading.Lock()
        wake.acquire()
        with lock:
            ledger.arrived()
            while True:
                item = ledger.take()
                if item is None:
                    ledger.waiting += 1
                    self._idle.append(wake)
                    lock.release()
                    notified = wake.acquire(timeout=self.idle_s)
                    lock.acquire()
                    ledger.waiting -= 1
                    if not notified:
                        if wake in self._idle:
                            self._idle.remove(wake)  # nobody woke it: a true timeout
                        else:
                            # Woken as it timed out: take the release (made under the lock).
                            notified = wake.acquire(blocking=False)
                    ledger.arrived()
                    if not notified and ledger.may_leave():
                        return
                    continue
                # Others may now be eligible too (this thread took only one).
                self._wake()
                lock.release()
                try:
                    item.job()
                finally:
                    lock.acquire()
                    ledger.done(item)
                    del item  # what the job holds (its result, its future) is not kept idle
                    self._wake()

    async def run(
        self,
        fn: Callable[[], T],
        on_cancel: Callable[[], None],
        *,
        key: str = "",
        skill: str = "",
        wait_s: float | None = None,
    ) -> T:
        """Run ``fn`` on a worker thread and return what it returns (or raise what it raised).

        ``key`` (the caller's :attr:`~skilld.types.Caller.key`) and ``skill`` place the job
        in the fair queue. If the awaiting task is cancelled while the job waits for a
        thread, the job is withdrawn and never runs; once it runs, ``on_cancel`` is
        called at once (it should make ``fn`` stop soon), the call is still waited for,
        and then the cancellation goes on: nothing ``fn`` holds outlives this await.

        Raises:
            SkillBusy: no thread took the job within ``wait_s`` seconds; it did not run.
            BaseException: whatever ``fn`` raised.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        fn = telemetry.carry(fn)  # the request's trace goes on in the thread

        def job() -> None:
            settle: Callable[..., None]
            try:
                value: Any = fn()
                settle = _set_result
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
                value, settle = exc, _set_exception
            # RuntimeError: the loop closed while the call ran; nobody is waiting any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle, future, value)

        item = self.submit(job, key, skill)
        timer = None
        if wait_s is not None and item.state == "queued":

            def expire() -> None:
                if self.withdraw(item):
                    _set_exception(future, _no_thread(skill, self.size, wait_s))

            timer = loop.call_later(wait_s, expire)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            if self.withdraw(item):
                raise
            on_cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.wait([future])
            # The shield stopped watching ``future`` when we were cancelled: what it
            # raised is seen here, or asyncio reports it as never retrieved.
            future.exception()
            raise
        finally:
            if timer is not None:
                timer.cancel()


def _no_thread(skill: str, size: int, wait_s: float) -> SkillBusy:
    return SkillBusy(
        skill,
        size,
        message=f"every worker thread ({size}) stayed busy for {wait_s:g} s, so the call to "
        f"skill {skill} did not start; retry later",
    )


def _set_result(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
