"""The one concurrency gate of a skill (``skilld.call.CallGate``), on threads and an event loop."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import anyio
import anyio.to_thread
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skilld.call import CallGate, Slot
from skilld.errors import CallCancelled, GuestError, SkillBusy


def test_the_gate_serves_threads_and_an_event_loop_in_turn() -> None:
    """Waiters on a thread and on an event loop share one queue; none is counted twice and a
    waiter that gave up holds nothing."""
    gate = CallGate("s", 1)
    first = gate.take(0)
    order: list[str] = []
    got: list[Any] = []

    def on_thread() -> None:
        slot = gate.take(10)
        order.append("thread")
        got.append(slot)

    async def on_loop() -> None:
        slot = await gate.take_async(10)
        order.append("loop")
        slot.release()

    thread = threading.Thread(target=on_thread)
    thread.start()
    while gate.waiting < 1:
        threading.Event().wait(0.001)

    async def main() -> None:
        task = asyncio.ensure_future(on_loop())
        while gate.waiting < 2:
            await asyncio.sleep(0)
        first.release()
        await anyio.to_thread.run_sync(thread.join)
        assert gate.running == 1
        got[0].release()
        await task

    asyncio.run(main())
    assert order == ["thread", "loop"]
    assert (gate.running, gate.waiting) == (0, 0)
    held = gate.take(0)

    async def gives_up() -> None:
        with pytest.raises(SkillBusy):
            await gate.take_async(0.01)
        waiter = asyncio.ensure_future(gate.take_async(10))
        while gate.waiting < 1:
            await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter

    asyncio.run(gives_up())
    held.release()
    assert (gate.running, gate.waiting) == (0, 0)


def test_a_lent_slot_is_taken_once_and_returned_to_its_lender() -> None:
    """Within ``lend`` the first take of that gate borrows the slot; a second (a nested call
    of the same skill) takes one of its own; a cancelled or timed-out wait holds nothing."""
    gate = CallGate("s", 2)
    lent = gate.take(0)

    def run() -> tuple[int, int]:
        borrowed = gate.take(0)
        counts = gate.running
        nested = gate.take(0)
        both = gate.running
        nested.release()
        borrowed.release()
        return counts, both

    assert lent.lend(run) == (1, 2)
    assert gate.running == 1  # still the lender's
    assert lent.lend(run) == (1, 2)  # returned: the next attempt (a thread's) borrows it again
    lent.release()
    lent.release()  # a second release does nothing
    assert gate.running == 0
    held = [gate.take(0), gate.take(0)]
    with pytest.raises(CallCancelled, match="while it waited for a slot"):
        gate.take(5, lambda: True)
    with pytest.raises(GuestError, match="busy"):
        gate.take(0.02)
    assert gate.waiting == 0
    for slot in held:
        slot.release()
    assert gate.running == 0


@settings(max_examples=200, deadline=None)
@given(
    limit=st.integers(1, 4),
    ops=st.lists(st.sampled_from(["take", "release", "lend", "cancelled"]), max_size=40),
)
def test_any_sequence_keeps_the_count_true(limit: int, ops: list[str]) -> None:
    """Whatever a caller does (take, release twice, borrow a lent slot, give up cancelled),
    the gate counts exactly the slots held, never more than its limit."""
    gate = CallGate("s", limit)
    held: list[Slot] = []
    for op in ops:
        if op == "take":
            try:
                held.append(gate.take(0))
            except SkillBusy:
                assert len(held) == limit
        elif op == "release" and held:
            slot = held.pop(0)
            slot.release()
            slot.release()
        elif op == "lend" and held:
            lender = held[0]
            inner = lender.lend(gate.take, 0)
            assert gate.running == len(held)  # borrowed: not counted again
            inner.release()
        elif op == "cancelled":
            while len(held) < limit:
                held.append(gate.take(0))
            with pytest.raises(CallCancelled):
                gate.take(1, lambda: True)
        assert gate.running == len(held) <= limit
        assert gate.waiting == 0


def test_one_caller_holds_at_most_its_share() -> None:
    """Of four slots one caller holds three; the fourth is kept for other callers. A call
    of a caller at its share waits for a slot of its own caller's, never another's; a
    call of no key is not counted per caller."""
    gate = CallGate("s", 4)
    assert gate.share == 3
    mine = [gate.take(0, key="a") for _ in range(3)]
    with pytest.raises(SkillBusy, match="busy for this caller: its calls hold 3"):
        gate.take(0, key="a")
    theirs = gate.take(0, key="b")  # the quarter kept for others
    got: list[Slot] = []
    waiting = threading.Thread(target=lambda: got.append(gate.take(10, key="a")))
    waiting.start()
    while gate.waiting < 1:
        threading.Event().wait(0.001)
    theirs.release()  # b's slot: a is over its share, so it stays free
    assert (gate.running, gate.waiting, got) == (3, 1, [])
    mine[0].release()  # a's own: its waiter takes it
    waiting.join(10)
    assert len(got) == 1 and (gate.running, gate.waiting) == (3, 0)
    uncounted = gate.take(0)  # no key: not counted per caller
    assert gate.running == 4
    for slot in [*mine[1:], *got, uncounted]:
        slot.release()
    assert (gate.running, gate.waiting) == (0, 0)
