"""Inline attempts: guest code never runs on the caller's thread; the call runs once on a thread.

``Registry.call_inline`` is what the MCP server tries on its event loop before it hands
a call to a worker thread. What must hold: a guest's attempt gives up before any of its
code runs (no instance taken, no host call acted, no audit record), and the call then runs
its guest exactly once. A guest body run inline and again on a thread would show here as
a second ``started`` record (each run writes one before its first state write) or a second
instance taken from the pool.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from skilld.audit import MemorySink
from skilld.call import Inline
from skilld.errors import RunOnThread
from skilld.registry import NullChannel, Registry, SkillEntry
from skilld.sandbox import CallContext, Component, Sandbox
from skilld.state import SqliteState
from skilld.types import Limits

LIMITS = Limits(timeout_ms=2000)


@pytest.fixture
def inline_registry(
    sandbox: Sandbox, component_path: Callable[[str], Path], tmp_path: Path
) -> tuple[Registry, MemorySink, SqliteState]:
    """echo-wat (small: microseconds to instantiate) and hostile (CPython, with kv)."""
    sink = MemorySink()
    reg = Registry(audit=sink)
    state = SqliteState(tmp_path / "state.db")
    for name in ("echo-wat", "hostile"):
        comp = sandbox.load(component_path(name).read_bytes(), name=name)
        spec = comp.describe(CallContext(name, LIMITS, NullChannel()))
        reg.add(SkillEntry(spec=spec, component=comp, kv=state.store(name), limits=LIMITS))
    reg.mark_ready()
    return reg, sink, state


def _component(reg: Registry, skill: str) -> Component:
    comp = next(e.component for e in reg.skills() if e.spec.id == skill)
    assert isinstance(comp, Component)
    return comp


def _warm(reg: Registry, sink: MemorySink, skill: str, depth: int = 1) -> Component:
    """Make the skill keep warm instances, wait until they are ready, forget the audit so far."""
    comp = _component(reg, skill)
    comp.prewarm(LIMITS, depth=depth)
    reg.call(f"{skill}/ok", {}, NullChannel())  # the pool fills after a call
    deadline = time.monotonic() + 60
    while comp._pool.qsize() < depth:
        assert time.monotonic() < deadline, "no warm instance appeared"
        time.sleep(0.01)
    sink.records.clear()
    return comp


@pytest.mark.parametrize(
    ("tool", "args", "value"),
    [("echo-wat/echo", {"text": "hi"}, "hi"), ("hostile/ok", {}, "fine")],
    ids=["echo-wat", "hostile"],
)
def test_a_guest_never_runs_inline(
    inline_registry: tuple[Registry, MemorySink, SqliteState],
    tool: str,
    args: dict[str, str],
    value: str,
) -> None:
    """A small guest and a CPython guest both give up inline before their code runs."""
    reg, sink, _ = inline_registry
    reg.call(tool, args, NullChannel())  # instantiated once: its cost is known
    sink.records.clear()
    with pytest.raises(RunOnThread):
        reg.call_inline(tool, args, NullChannel(), 30.0)
    assert sink.records == []
    assert reg.call(tool, args, NullChannel()).value == value
    assert [r["outcome"] for r in sink.records] == ["ok"]


def test_a_guest_with_side_effects_runs_once_per_call(
    inline_registry: tuple[Registry, MemorySink, SqliteState],
) -> None:
    """Attempt inline, then run on a thread (as the MCP layer does): one run, one instance.

    The guest writes keys (kv.set), and each run writes a ``started`` record before
    its first write: a body run twice for the call would leave two.
    """
    reg, sink, state = inline_registry
    comp = _warm(reg, sink, "hostile", depth=2)
    ready = comp._pool.qsize()
    with pytest.raises(RunOnThread):
        reg.call_inline("hostile/write_keys", {"count": 3}, NullChannel(), 30.0)
    assert comp._pool.qsize() == ready  # no instance was taken: no guest code ran
    assert state.store("hostile").keys("", 100) == []
    assert reg.call("hostile/write_keys", {"count": 3}, NullChannel()).value == 3
    assert state.store("hostile").keys("", 100) == ["k000000", "k000001", "k000002"]
    assert [(r["event"], r["method"], r.get("outcome")) for r in sink.records] == [
        ("started", "write_keys", None),
        ("call", "write_keys", "ok"),
    ]


def test_the_sandbox_gives_up_before_instantiating(
    sandbox: Sandbox, component_path: Callable[[str], Path]
) -> None:
    """Straight to the component: an inline context raises before any instance exists."""
    comp = sandbox.load(component_path("echo-wat").read_bytes(), name="echo-wat")
    ctx = CallContext("echo-wat", LIMITS, NullChannel(), inline=Inline.for_s(30.0))
    with pytest.raises(RunOnThread):
        comp.call("echo", '{"text":"hi"}', ctx)
    assert comp._instantiate_s == float("inf")  # never instantiated
    out = comp.call("echo", '{"text":"hi"}', CallContext("echo-wat", LIMITS, NullChannel()))
    assert out.value == "hi"


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
        with pytest.raises(RunOnThread):
            reg.call_inline("echo-wat/echo", {"text": "x"}, NullChannel(), 0.05)
        assert time.perf_counter() - started < 0.5
    finally:
        for slot in held:
            slot.release()
    assert len(sink.records) == 1


def test_attempts_and_thread_calls_interleave_from_many_threads(
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
    for i in range(150):
        with pytest.raises(RunOnThread):
            reg.call_inline("echo-wat/echo", {"text": f"in-{i}"}, NullChannel(), 0.05)
        assert reg.call("echo-wat/echo", {"text": f"in-{i}"}, NullChannel()).value == f"in-{i}"
    for t in threads:
        t.join()
    assert errors == []
    assert len(sink.records) == 1 + 3 * 50 + 150
