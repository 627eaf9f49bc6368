"""The threads that run blocking guest calls for the event loop.

skilld needs to see a cancellation while a call runs on its thread, which with
``anyio.to_thread.run_sync`` took a task group and a shielded worker task around
it. A plain queue of jobs and one asyncio future settled from the worker thread does
the same for about a fifth of the CPU: 31 us per hand-off against 138-157 us
(``bench/bench_handoff.py``, 16 concurrent callers of a no-op).

The server runs on asyncio (uvicorn, and ``anyio.run``'s default backend), so the
future is an asyncio one; anyio's cancel scopes cancel the awaiting task, which is
where the call is told to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio

from skilld import telemetry

T = TypeVar("T")

# An idle thread leaves after this long, so a quiet server (or a test) keeps none.
_IDLE_S = 10.0

_Job = Callable[[], None]


class WorkerPool:
    """Up to ``size`` threads, started on demand, running one job at a time each.

    Jobs beyond ``size`` wait in the queue for the next free thread.
    """

    def __init__(self, size: int, name: str = "skilld-call"):
        self.size = size
        self._name = name
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        # Idle threads no submitted job has been promised to.
        self._unpromised = 0

    @property
    def threads(self) -> int:
        """How many threads are alive now."""
        return self._threads

    def submit(self, job: _Job) -> None:
        """Queue ``job``; wake an idle thread, or start one while below ``size``."""
        with self._lock:
            if self._unpromised > 0:
                self._unpromised -= 1
                start = False
            else:
                start = self._threads < self.size
                self._threads += start
        self._jobs.put(job)
        if start:
            threading.Thread(target=self._work, name=self._name, daemon=True).start()

    def _work(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=_IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._unpromised > 0:
                        self._unpromised -= 1
                        self._threads -= 1
                        return
                # A job was promised to an idle thread just now: wait for it.
                continue
            job()
            del job  # what it holds (its result, its future) is not kept while idle
            with self._lock:
                self._unpromised += 1

    async def run(self, fn: Callable[[], T], on_cancel: Callable[[], None]) -> T:
        """Run ``fn`` on a worker thread and return what it returns (or raise what it raised).

        If the awaiting task is cancelled meanwhile, ``on_cancel`` is called at once
        (it should make ``fn`` stop soon), the call is still waited for, and then the
        cancellation goes on: nothing ``fn`` holds outlives this await.
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

        self.submit(job)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            on_cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.wait([future])
            # The shield stopped watching ``future`` when we were cancelled: what it
            # raised is seen here, or asyncio reports it as never retrieved.
            future.exception()
            raise


def _set_result(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
