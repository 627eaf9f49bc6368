"""The hand-off of a blocking call to a thread and back: skilld's pool against anyio's.

16 tasks on one event loop each hand ``ROUNDS`` no-op calls to a thread, so what is
measured is the hand-off alone (queueing, waking a thread, settling the result on the
loop). Three ways, side by side, CPU time of the process per call:

- ``anyio.to_thread.run_sync`` on a ``CapacityLimiter`` (the baseline);
- the same inside a task group with a shielded worker task, which is what skilld's
  server needed around it to see a cancellation while the call runs (before
  ``skilld/mcp/_workers.py``);
- ``WorkerPool.run`` (what the server uses now).

Run: ``python bench/bench_handoff.py``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import anyio.to_thread

sys.path.insert(0, str(Path(__file__).resolve().parent))

from skilld.mcp._workers import WorkerPool

CALLERS = 16
CALLS = 4000
ROUNDS = 5


def _noop() -> int:
    return 1


async def _measure(handoff: Callable[[], Awaitable[object]], calls: int) -> float:
    """CPU seconds per call with ``CALLERS`` tasks making ``calls`` calls in all."""

    async def caller() -> None:
        for _ in range(calls // CALLERS):
            await handoff()

    started = time.process_time()
    async with anyio.create_task_group() as tg:
        for _ in range(CALLERS):
            tg.start_soon(caller)
    return (time.process_time() - started) / calls


async def main(calls: int, rounds: int) -> None:
    """Print CPU per hand-off for each way, and the ratios to anyio's."""
    limiter = anyio.CapacityLimiter(64)
    pool = WorkerPool(64)

    async def to_thread() -> object:
        return await anyio.to_thread.run_sync(_noop, limiter=limiter)

    async def to_thread_in_task_group() -> object:
        values: list[object] = []
        done = anyio.Event()

        async def work() -> None:
            with anyio.CancelScope(shield=True):
                try:
                    values.append(await anyio.to_thread.run_sync(_noop, limiter=limiter))
                finally:
                    done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(work)
            await done.wait()
        return values[0]

    async def worker_pool() -> object:
        return await pool.run(_noop, lambda: None)

    ways = {
        "anyio.to_thread.run_sync": to_thread,
        "to_thread in a task group (skilld before)": to_thread_in_task_group,
        "WorkerPool.run (skilld now)": worker_pool,
    }
    cpu: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds):  # alternating, so a drifting machine hits every way alike
        for name, handoff in ways.items():
            cpu[name].append(await _measure(handoff, calls))
    base = statistics.median(cpu["anyio.to_thread.run_sync"])
    print(f"{CALLERS} concurrent callers, {calls} no-op calls per round, {rounds} rounds")
    print()
    print("| hand-off | CPU us/call (median of rounds) | ratio to anyio.to_thread |")
    print("|---|---|---|")
    for name, values in cpu.items():
        median = statistics.median(values)
        print(f"| {name} | {median * 1e6:.1f} | {median / base:.2f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="a few iterations: that it runs (CI; no targets)"
    )
    quick = parser.parse_args().quick
    anyio.run(main, 160 if quick else CALLS, 1 if quick else ROUNDS)
