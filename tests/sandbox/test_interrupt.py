"""Between and during calls: stopping a guest from outside, capping output, no leftovers."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from skilld.errors import CallCancelled, DeadlineExceeded, GuestError
from skilld.registry import NullChannel
from skilld.sandbox import CallContext, Component, Sandbox
from skilld.types import Limits

Loader = Callable[[str], Path]


class CancellingChannel(NullChannel):
    """A channel whose client cancels once ``cancel`` is set."""

    def __init__(self) -> None:
        self.cancel = threading.Event()

    def cancelled(self) -> bool:
        """True once the test cancelled."""
        return self.cancel.is_set()


@pytest.fixture(scope="module")
def hostile(sandbox: Sandbox, component_path: Loader) -> Component:
    """The hostile test skill, loaded."""
    return sandbox.load(component_path("hostile").read_bytes(), name="hostile")


def test_cancel_stops_a_guest_that_never_looks(hostile: Component) -> None:
    """A guest looping without polling cancelled() is stopped soon after the client cancels."""
    channel = CancellingChannel()
    ctx = CallContext("hostile", Limits(timeout_ms=20_000), channel)
    timer = threading.Timer(0.2, channel.cancel.set)
    started = time.monotonic()  # before the timer starts: it fires 0.2 s after its start
    timer.start()
    try:
        with pytest.raises(CallCancelled, match="client cancelled"):
            hostile.call("loop", "{}", ctx)
    finally:
        timer.cancel()
    elapsed = time.monotonic() - started
    assert 0.2 <= elapsed < 2.0, elapsed  # far below the 20 s deadline


def test_deadline_still_stops_a_loop(hostile: Component) -> None:
    """Without cancellation the loop ends at its deadline, reported as such."""
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded, match="deadline of 150 ms"):
        hostile.call("loop", "{}", CallContext("hostile", Limits(timeout_ms=150), NullChannel()))
    assert 0.145 <= time.monotonic() - started < 1.5  # the loop never ends by itself


def test_cancelled_call_leaves_the_component_usable(hostile: Component) -> None:
    """After a cancelled call, the next call on the same component answers normally."""
    channel = CancellingChannel()
    channel.cancel.set()
    with pytest.raises(CallCancelled):
        hostile.call("loop", "{}", CallContext("hostile", Limits(), channel))
    out = hostile.call(
        "ok", json.dumps({"text": "after"}), CallContext("h", Limits(), NullChannel())
    )
    assert out.value == "after"


def test_output_over_the_limit_is_refused(hostile: Component) -> None:
    """A result larger than limits.output_bytes is a limit-exceeded error, not a reply."""
    ctx = CallContext("hostile", Limits(output_bytes=1000), NullChannel())
    with pytest.raises(GuestError, match="over the skill's output limit of 1000 bytes") as info:
        hostile.call("ok", json.dumps({"text": "x" * 2000}), ctx)
    assert info.value.code == "limit-exceeded"
    small = hostile.call("ok", json.dumps({"text": "x" * 500}), ctx)
    assert small.value == "x" * 500


def test_nothing_survives_into_the_next_call(hostile: Component) -> None:
    """Under ``instances: fresh``, module state a call leaves behind is gone in the next call,
    pooled slots included."""
    fresh = Limits(instance_calls=1)
    ctx = CallContext("hostile", fresh, NullChannel())
    hostile.prewarm(fresh, depth=2)
    try:
        for i in range(20):
            assert hostile.call("recall", "{}", ctx).value == []
            assert hostile.call("remember", json.dumps({"secret": f"s{i}"}), ctx).value == 2
    finally:
        hostile.prewarm(Limits(), depth=0)
