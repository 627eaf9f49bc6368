"""A guest blocked in a WASI wait (a Python script's sleep) still ends at its deadline or cancel.

The runner (``sandbox/pyrunner``) runs an Agent Skill's script the way the ``wasm``
executor does: the script's directory preopened at ``/skill``, a workspace at
``/workspace``, an instance of its own per call.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from skilld import paths
from skilld.call import CallContext
from skilld.errors import CallCancelled, DeadlineExceeded
from skilld.package.build import build_component
from skilld.registry import NullChannel
from skilld.sandbox import Component, Sandbox
from skilld.types import Limits
from support.env import cache_dir

SCRIPTS = {
    "nap.py": "import sys, time\ntime.sleep(float(sys.argv[1]))\nprint('woke')\n",
    "wait.py": (
        "import select, selectors, sys\n"
        "select.select([], [], [], float(sys.argv[1]))\n"
        "selectors.DefaultSelector().select(float(sys.argv[1]))\n"
        "print('woke')\n"
    ),
}


class _Cancel(NullChannel):
    """A channel whose client cancels once ``cancel`` is set."""

    def __init__(self) -> None:
        self.cancel = threading.Event()

    def cancelled(self) -> bool:
        """True once the test cancelled."""
        return self.cancel.is_set()


@pytest.fixture(scope="module")
def runner(sandbox: Sandbox) -> Iterator[Component]:
    """The CPython runner component, built from ``sandbox/pyrunner``."""
    wasm = build_component(paths.runner_dir(), cache_dir=cache_dir())
    comp = sandbox.load(wasm.read_bytes(), name="pyrunner")
    yield comp
    comp.close()


@pytest.fixture(scope="module")
def skill_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A skill directory whose scripts wait."""
    root = tmp_path_factory.mktemp("skill")
    (root / "scripts").mkdir()
    for name, text in SCRIPTS.items():
        (root / "scripts" / name).write_text(text)
    return root


def _context(skill_dir: Path, tmp_path: Path, limits: Limits, channel: NullChannel) -> CallContext:
    ctx = CallContext("napper", limits, channel)
    workspace = tmp_path / f"ws-{id(ctx)}"
    workspace.mkdir()
    ctx.preopens = ((str(skill_dir), "/skill", False), (str(workspace), "/workspace", True))
    return ctx


def _run(runner: Component, ctx: CallContext, script: str, seconds: float) -> object:
    args = {"path": f"scripts/{script}", "argv": [str(seconds)]}
    return runner.call("run_script", json.dumps(args), ctx).value


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_a_sleep_past_the_deadline_ends_at_the_deadline(
    runner: Component, skill_dir: Path, tmp_path: Path, script: str
) -> None:
    """A 25 s wait under a 400 ms wall time ends within 20 ms of the deadline, as ``deadline``.

    Before, the guest ran no wasm code while WASI slept, so the epoch check never saw it
    (a 25 s sleep under a 5 s wall time returned after 25.1 s). The best of three tries
    counts: on a 2-core machine under a load of 14, a thread now and then waits more than
    20 ms for a core (26 ms seen), which says nothing about the mechanism; a sleep that
    ignores its deadline is 25 s late every time.
    """
    lateness = []
    for _ in range(3):
        ctx = _context(skill_dir, tmp_path, Limits(timeout_ms=400), NullChannel())
        with pytest.raises(DeadlineExceeded):
            _run(runner, ctx, script, 25)
        assert ctx.deadline is not None
        lateness.append(time.monotonic() - ctx.deadline)
        if lateness[-1] <= 0.020:
            break
    assert min(lateness) <= 0.020, f"ended {min(lateness) * 1000:.1f} ms after the deadline"


def test_a_short_sleep_still_sleeps_its_time(
    runner: Component, skill_dir: Path, tmp_path: Path
) -> None:
    """Waiting in slices changes nothing for a script within its time: it sleeps as long."""
    ctx = _context(skill_dir, tmp_path, Limits(timeout_ms=5000), NullChannel())
    started = time.monotonic()
    out = _run(runner, ctx, "nap.py", 0.3)
    assert isinstance(out, dict) and out["stdout"] == "woke\n", out
    assert 0.3 <= time.monotonic() - started < 2.0


def test_forty_cancelled_sleeping_calls_leave_nothing_in_flight(
    runner: Component, sandbox: Sandbox, skill_dir: Path, tmp_path: Path
) -> None:
    """Forty scripts sleeping 60 s, cancelled: each ends ``cancelled`` and nothing stays running.

    Before, 64 calls were still in flight after ``tasks/cancel`` of 40 sleeping tasks,
    holding their slots and threads for as long as the scripts slept.
    """
    channel = _Cancel()
    outcomes: list[BaseException | None] = []
    asleep = threading.Barrier(41)

    def call() -> None:
        ctx = _context(skill_dir, tmp_path, Limits(timeout_ms=120_000), channel)
        asleep.wait()
        try:
            _run(runner, ctx, "nap.py", 60)
        except BaseException as exc:  # collected for the main thread
            outcomes.append(exc)
        else:
            outcomes.append(None)

    threads = [threading.Thread(target=call) for _ in range(40)]
    for thread in threads:
        thread.start()
    asleep.wait()
    # Every call is running (the ticker counts it) before the client cancels them.
    deadline = time.monotonic() + 60
    while sandbox.engine.ticker._active < 40:
        assert time.monotonic() < deadline, "the forty calls never all started"
        time.sleep(0.01)  # polling the ticker's count, which has no event to wait on
    cancelled_at = time.monotonic()
    channel.cancel.set()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    assert time.monotonic() - cancelled_at < 10
    assert len(outcomes) == 40
    assert all(isinstance(o, CallCancelled) for o in outcomes), outcomes
    assert sandbox.engine.ticker._active == 0
