"""Instance lifecycle under load: freeing, warming, and the GIL around wasmtime calls."""

from __future__ import annotations

import ctypes
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from wasmtime import _bindings

from skilld.call import CallContext
from skilld.errors import CallCancelled, DeadlineExceeded
from skilld.package.build import build_component
from skilld.registry import NullChannel, Registry, SkillEntry
from skilld.sandbox import Component, Sandbox, _sandbox
from skilld.sandbox._sandbox import _MAX_UNFREED
from skilld.types import Decision, Limits
from support.checkers import TextQuestions
from support.env import SKILLS, cache_dir


def _load(sandbox: Sandbox, component_path: Callable[[str], Path], name: str) -> Component:
    return sandbox.load(component_path(name).read_bytes(), name=name)


def test_a_burst_of_calls_never_exhausts_the_instance_pool(
    sandbox: Sandbox, component_path: Callable[[str], Path]
) -> None:
    """Calls faster than the background worker frees leave at most a bounded backlog.

    Each used instance holds a slot of the engine's pool until it is freed; a task
    per call used to queue up behind warming, and after about 500 back-to-back calls
    the pool ran out and calls trapped ("maximum concurrent limit ... reached").
    """
    echo = _load(sandbox, component_path, "echo")
    limits = Limits()
    echo.prewarm(limits, depth=2)
    try:
        for i in range(700):
            # A context per call, as the registry makes: its deadline is that call's.
            ctx = CallContext("echo", limits, NullChannel())
            assert echo.call("echo", json.dumps({"text": f"t{i}"}), ctx).value == f"t{i}"
            assert len(echo._used) <= _MAX_UNFREED + 1
    finally:
        echo.close()


@pytest.mark.parametrize("small", [True, False])
def test_only_components_slow_to_instantiate_are_warmed(
    sandbox: Sandbox,
    component_path: Callable[[str], Path],
    monkeypatch: pytest.MonkeyPatch,
    small: bool,
) -> None:
    """Warming pays for a guest runtime; a small component would only do each call twice.

    The threshold is moved to either extreme, so the test does not depend on how fast
    this machine instantiates (bench/bench_sandbox.py measures that).
    """
    monkeypatch.setattr(_sandbox, "_WARM_WORTH_S", 3600.0 if small else 0.0)
    wat = _load(sandbox, component_path, "echo-wat")
    limits = Limits(memory_bytes=16 << 20)
    wat.prewarm(limits, depth=2)
    ctx = CallContext("echo-wat", limits, NullChannel())
    try:
        for i in range(5):
            assert wat.call("echo", json.dumps({"text": str(i)}), ctx).value == str(i)
        if small:
            # freed on the caller's thread, never queued, never warmed
            assert not wat._used
            assert wat._pool.qsize() == 0
        else:
            deadline = time.monotonic() + 10
            while wat._pool.qsize() < 2 and time.monotonic() < deadline:
                time.sleep(0.01)  # polling the background worker
            assert wat._pool.qsize() == 2
    finally:
        wat.close()


def _keeps_gil(func: object) -> bool:
    flags: int = func._flags_  # type: ignore[attr-defined]
    return bool(flags & ctypes._FUNCFLAG_PYTHONAPI)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "name",
    [
        "wasmtime_component_func_call",
        "wasmtime_component_func_post_return",
        "wasmtime_component_linker_instantiate",
        "wasmtime_store_delete",
        "wasmtime_component_deserialize",
        "wasmtime_component_new",
    ],
)
def test_calls_that_run_guest_code_or_take_long_release_the_gil(
    sandbox: Sandbox, name: str
) -> None:
    """Guest code never runs holding the GIL: the event loop and other calls go on."""
    assert not _keeps_gil(getattr(_bindings, f"_{name}"))


@pytest.mark.parametrize(
    "name",
    [
        "wasmtime_store_new",
        "wasmtime_component_val_delete",
        "wasmtime_component_record_type_field_nth",
        "wasmtime_context_set_epoch_deadline",
        "wasmtime_engine_increment_epoch",
    ],
)
def test_quick_calls_keep_the_gil(sandbox: Sandbox, name: str) -> None:
    """The quick ones do not hand the GIL to another thread and wait to get it back."""
    assert _keeps_gil(getattr(_bindings, f"_{name}"))


@pytest.fixture(scope="module")
def spinning_start(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Component:
    """echo-wat with a core start function that never returns: instantiating it spins."""
    src = tmp_path_factory.mktemp("spin") / "echo-wat"
    shutil.copytree(SKILLS["echo-wat"], src)
    text = (src / "skill.wat").read_text()
    memory = '    (memory (export "memory") 1)\n'
    assert memory in text
    spin = "    (func $spin (loop $forever (br $forever)))\n    (start $spin)\n"
    (src / "skill.wat").write_text(text.replace(memory, memory + spin, 1))
    wasm = build_component(src, cache_dir=cache_dir())
    return sandbox.load(wasm.read_bytes(), name="spinning-start")


@pytest.mark.parametrize("wall_ms", [100, 300])
def test_start_code_counts_against_the_call(spinning_start: Component, wall_ms: int) -> None:
    """A component whose start code spins is stopped at the call's deadline, not after 10 s."""
    for _ in range(3):
        ctx = CallContext("spin", Limits(timeout_ms=wall_ms, memory_bytes=16 << 20), NullChannel())
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            spinning_start.call("echo", '{"text": "x"}', ctx)
        assert time.monotonic() - started <= wall_ms / 1000 + 1.0  # the start code spins 10 s


def test_cancel_stops_start_code(spinning_start: Component) -> None:
    """A cancel reaches a guest still in its start code."""

    class Cancelled(NullChannel):
        def cancelled(self) -> bool:
            return True

    ctx = CallContext("spin", Limits(timeout_ms=60_000, memory_bytes=16 << 20), Cancelled())
    started = time.monotonic()
    with pytest.raises(CallCancelled):
        spinning_start.call("echo", '{"text": "x"}', ctx)
    assert time.monotonic() - started <= 1.0  # far below its 60 s


class _InvokeAnything(TextQuestions):
    """Allows invoke and nothing else."""

    def check(self, capability: str, action: str, target: str) -> Decision:
        ok = capability == "invoke"
        return Decision(ok, capability, action, target, "test.invoke", "test")


def test_a_nested_calls_refill_waits_for_the_outermost_call(
    sandbox: Sandbox, component_path: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A program's tool call leaves the refill to the end of the program, not during it.

    hostile relays to echo (invoke): echo's used instance goes to the background worker
    only once hostile's own call has ended, so the program keeps the cores. With no
    ready instance left, a nested call refills at once (the next one would instantiate).
    Fresh instances per call: a warm one is kept, never retired.
    """
    limits = Limits(timeout_ms=10_000, instance_calls=1)
    reg = Registry()
    comps: dict[str, Component] = {}
    for name in ("echo", "hostile"):
        comp = _load(sandbox, component_path, name)
        spec = comp.describe(CallContext(name, limits, NullChannel()))
        checker = _InvokeAnything() if name == "hostile" else None
        reg.add(SkillEntry(spec=spec, component=comp, limits=limits, checker=checker))
        comps[name] = comp
    reg.mark_ready()
    echo, hostile = comps["echo"], comps["hostile"]
    echo.prewarm(limits, depth=2)
    reg.call("echo/echo", {"text": "fill"}, NullChannel())  # the pool fills after a call
    deadline = time.monotonic() + 60
    while echo._pool.qsize() < 2 or echo._tending:
        assert time.monotonic() < deadline, "the pool did not fill"
        time.sleep(0.01)
    events: list[tuple[str, str]] = []
    retire, submit = Component._retire, sandbox.background.submit

    def retiring(self: Component, inst: Any, *args: Any) -> None:
        events.append(("retire", self.name))
        retire(self, inst, *args)

    def submitting(fn: Callable[[], None]) -> Any:
        events.append(("worker", getattr(fn, "__self__", hostile).name))
        return submit(fn)

    monkeypatch.setattr(Component, "_retire", retiring)
    monkeypatch.setattr(sandbox.background, "submit", submitting)
    relay = {"skill_id": "echo", "method": "echo", "args": {"text": "via"}}
    try:
        assert reg.call("hostile/relay", relay, NullChannel()).value == "via"
        # hostile is small or warm: its own worker may or may not start; echo's waits.
        assert events.index(("worker", "echo")) > events.index(("retire", "hostile"))
        assert events.index(("retire", "echo")) < events.index(("retire", "hostile"))
        # Now drain the pool: the nested call that takes the last instance refills at once.
        while echo._tending:
            time.sleep(0.01)
        while echo._pool.qsize() > 1:
            echo._pool.get_nowait()
        events.clear()
        assert reg.call("hostile/relay", relay, NullChannel()).value == "via"
        assert events.index(("worker", "echo")) < events.index(("retire", "hostile"))
    finally:
        echo.close()
        hostile.close()
