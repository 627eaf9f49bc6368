"""Inline attempts: a quick guest finishes on the caller's thread; anything else gives up unseen.

``Registry.call_inline`` is what the MCP server tries on its event loop before it hands
a call to a worker thread. What must hold: an attempt that gives up did nothing anyone
can see (no host call acted, no audit record, nothing kept), it gives up in about its
budget even against a guest that never returns, and the rerun on a thread behaves as if
the call ran once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from skilld.audit import MemorySink
from skilld.call import Inline
from skilld.errors import DeadlineExceeded, RunOnThread
from skilld.registry import NullChannel, Registry, SkillEntry
from skilld.sandbox import CallContext, Component, Sandbox, _sandbox
from skilld.state import SqliteState
from skilld.types import Limits

LIMITS = Limits(timeout_ms=2000)


@pytest.fixture
def inline_registry(
    sandbox: Sandbox, component_path: Callable[[str], Path], tmp_path: Path
) -> tuple[Registry, MemorySink, SqliteState]:
    """echo-wat (small: instantiated inline) and hostile (CPython: inline only when warm)."""
    sink = MemorySink()
    reg = Registry(audit=sink)
    state = SqliteState(tmp_path / "state.db")
    for name in ("echo-wat", "hostile"):
        comp = sandbox.load(component_path(name).read_bytes(), name=name)
        spec = comp.describe(CallContext(name, LIMITS, NullChannel()))
        reg.add(SkillEntry(spec=spec, component=comp, kv=state.store(name), limits=LIMITS))
        if name == "echo-wat":
            # Counted as small whatever the machine's load made its first instantiation
            # look like: these tests are about what happens once it counts as small.
            comp._instantiate_s = 0.0
    reg.mark_ready()
    return reg, sink, state


def _component(reg: Registry, skill: str) -> Component:
    return next(e.component for e in reg.skills() if e.spec.id == skill)


def _warm(reg: Registry, sink: MemorySink, skill: str) -> None:
    """Make the skill keep a warm instance, wait until one is ready, forget the audit so far."""
    comp = _component(reg, skill)
    comp.prewarm(LIMITS, depth=1)
    reg.call(f"{skill}/ok", {}, NullChannel())  # the pool fills after a call
    deadline = time.monotonic() + 60
    while comp._pool.qsize() == 0:
        assert time.monotonic() < deadline, "no warm instance appeared"
        time.sleep(0.01)
    sink.records.clear()


def test_a_quick_guest_finishes_inline_and_is_audited_once(
    inline_registry: tuple[Registry, MemorySink, SqliteState],
) -> None:
    """After its first instantiation, echo-wat answers inline exactly as it does on a thread."""
    reg, sink, _ = inline_registry
    on_thread = reg.call("echo-wat/echo", {"text": "hi ✓"}, NullChannel())
    inline = reg.call_inline("echo-wat/echo", {"text": "hi ✓"}, NullChannel(), 0.05)
    assert inline == on_thread
    assert [r["outcome"] for r in sink.records] == ["ok", "ok"]
    assert sink.records[0]["input_sha256"] == sink.records[1]["input_sha256"]
    assert sink.records[0]["output_sha256"] == sink.records[1]["output_sha256"]


def test_a_component_never_instantiated_is_not_instantiated_inline(
    sandbox: Sandbox, component_path: Callable[[str], Path]
) -> None:
    """How long its instantiation takes is unknown: the attempt gives up before it starts."""
    comp = sandbox.load(component_path("echo-wat").read_bytes(), name="echo-wat")
    ctx = CallContext("echo-wat", LIMITS, NullChannel(), inline=Inline.for_s(0.05))
    with pytest.raises(RunOnThread) as gave_up:
        comp.call("echo", '{"text":"hi"}', ctx)
    assert not gave_up.value.ran
    on_thread = comp.call("echo", '{"text":"hi"}', CallContext("echo-wat", LIMITS, NullChannel()))
    ctx = CallContext("echo-wat", LIMITS, NullChannel(), inline=Inline.for_s(0.05))
    # Measured now: instantiated inline only if that took under the threshold.
    if comp._instantiate_s < _sandbox._WARM_WORTH_S:
        assert comp.call("echo", '{"text":"hi"}', ctx) == on_thread
    else:
        with pytest.raises(RunOnThread) as gave_up:
            comp.call("echo", '{"text":"hi"}', ctx)
        assert not gave_up.value.ran


def test_a_host_call_inline_acts_not_and_the_rerun_acts_once(
    inline_registry: tuple[Registry, MemorySink, SqliteState],
) -> None:
    """kv.set is refused inline (nothing written, nothing audited); the thread call writes."""
    reg, sink, state = inline_registry
    _warm(reg, sink, "hostile")
    store = state.store("hostile")
    # A budget far beyond the call: only the host call can make it give up.
    with pytest.raises(RunOnThread) as gave_up:
        reg.call_inline("hostile/write_keys", {"count": 3}, NullChannel(), 30.0)
    assert gave_up.value.ran
    assert store.keys("", 100) == []
    assert sink.records == []
    # The method is not tried inline again for a while: no guest runs for those attempts.
    with pytest.raises(RunOnThread) as backing_off:
        reg.call_inline("hostile/write_keys", {"count": 3}, NullChannel(), 30.0)
    assert not backing_off.value.ran
    assert reg.call("hostile/write_keys", {"count": 3}, NullChannel()).value == 3
    assert store.keys("", 100) == ["k000000", "k000001", "k000002"]
    assert [(r["method"], r["outcome"]) for r in sink.records if r["event"] == "call"] == [
        ("write_keys", "ok")
    ]


def test_a_looping_guest_gives_up_inline_within_its_budget(
    inline_registry: tuple[Registry, MemorySink, SqliteState],
) -> None:
    """A guest that never returns holds the caller's thread about the budget, not its deadline."""
    reg, sink, _ = inline_registry
    _warm(reg, sink, "hostile")
    started = time.perf_counter()
    with pytest.raises(RunOnThread) as gave_up:
        reg.call_inline("hostile/loop", {}, NullChannel(), 0.005)
    held = time.perf_counter() - started
    assert gave_up.value.ran
    # The epoch ticks every millisecond and the check comes within a tick or two;
    # the call's own deadline (2 s) is far away. Generous for a loaded machine.
    assert held < 0.5, held
    assert sink.records == []
    with pytest.raises(DeadlineExceeded):
        reg.call("hostile/loop", {}, NullChannel())
    assert [r["outcome"] for r in sink.records] == ["deadline"]


def test_no_free_slot_sends_the_call_to_a_thread_without_waiting(
    inline_registry: tuple[Registry, MemorySink, SqliteState],
) -> None:
    """An inline attempt never waits for a slot of the skill: the waiting is a thread's."""
    reg, sink, _ = inline_registry
    reg.call("echo-wat/echo", {"text": "x"}, NullChannel())
    entry = next(e for e in reg.skills() if e.spec.id == "echo-wat")
    held = [entry.gate.take(0) for _ in range(entry.gate.limit)]
    try:
        started = time.perf_counter()
        with pytest.raises(RunOnThread) as gave_up:
            reg.call_inline("echo-wat/echo", {"text": "x"}, NullChannel(), 0.05)
        assert not gave_up.value.ran
        assert time.perf_counter() - started < 0.5
    finally:
        for slot in held:
            slot.release()
    # Not backed off: a slot-less attempt ran no guest.
    assert reg.call_inline("echo-wat/echo", {"text": "x"}, NullChannel(), 0.05).value == "x"
    assert len(sink.records) == 2


def test_inline_and_thread_calls_interleave_from_many_threads(
    inline_registry: tuple[Registry, MemorySink, SqliteState],
) -> None:
    """Inline attempts on one thread while calls run on others: every call audited once."""
    reg, sink, _ = inline_registry
    reg.call("echo-wat/echo", {"text": "first"}, NullChannel())
    errors: list[BaseException] = []

    def on_thread(n: int) -> None:
        try:
            for i in range(50):
                assert reg.call("echo-wat/echo", {"text": f"{n}-{i}"}, NullChannel()).value == (
                    f"{n}-{i}"
                )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=on_thread, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    inline = 0
    for i in range(150):
        try:
            out = reg.call_inline("echo-wat/echo", {"text": f"in-{i}"}, NullChannel(), 0.05)
        except RunOnThread:
            out = reg.call("echo-wat/echo", {"text": f"in-{i}"}, NullChannel())
        else:
            inline += 1
        assert out.value == f"in-{i}"
    for t in threads:
        t.join()
    assert errors == []
    assert inline > 0
    assert len(sink.records) == 1 + 3 * 50 + 150
