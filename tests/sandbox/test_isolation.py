"""No call sees another call's data under ``instances: fresh``: pooled, warmed and concurrently
used instances (one caller's warm instances: tests/sandbox/test_warm.py)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from skilld.call import CallContext
from skilld.registry import NullChannel
from skilld.sandbox import Component, Sandbox
from skilld.types import Limits

Loader = Callable[[str], Path]


@pytest.fixture(scope="module")
def hostile(sandbox: Sandbox, component_path: Loader) -> Component:
    """The hostile test skill, loaded (its ``remember``/``recall`` keep module state)."""
    return sandbox.load(component_path("hostile").read_bytes(), name="hostile")


@pytest.mark.parametrize("depth", [0, 2])
def test_concurrent_calls_never_read_each_others_secrets(hostile: Component, depth: int) -> None:
    """Threads storing secrets in module state and memory never recall any, warm pool or not.

    Each call first asks the guest what earlier calls left in its module state, then
    stores a secret of its own there (and in a buffer spread over many memory pages).
    With eight threads calling at once, instances are taken from the warm pool, made on
    the spot, and freed by the background worker into slots the next instances reuse: a
    slot or instance handed on without its memory reset would show a secret here.
    """
    limits = Limits(instance_calls=1)  # instances: fresh
    hostile.prewarm(limits, depth=depth)
    seen: list[str] = []
    failures: list[BaseException] = []
    start = threading.Barrier(8)

    def caller(n: int) -> None:
        try:
            start.wait()
            for i in range(12):
                ctx = CallContext("hostile", limits, NullChannel())
                seen.extend(hostile.call("recall", "{}", ctx).value)
                ctx = CallContext("hostile", limits, NullChannel())
                secret = json.dumps({"secret": f"thread {n} call {i}"})
                assert hostile.call("remember", secret, ctx).value == 2
        except BaseException as exc:  # reported by the main thread below
            failures.append(exc)

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(8)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
    finally:
        hostile.prewarm(limits, depth=0)
    assert not any(thread.is_alive() for thread in threads)
    assert not failures, failures[0]
    assert seen == []


def test_a_call_finds_at_most_the_hosts_warm_up_never_another_call(
    sandbox: Sandbox, component_path: Loader
) -> None:
    """An instance served from the pool ran the host's warm-up call and nothing else.

    The warm-up call here stores a marker: the first call after a warm instance is
    ready finds it (so the test sees the pool at work), and no call ever finds the
    secret of another call beside it.
    """
    # A component of its own: the module's has instances in its pool warmed by the
    # tests before (with the default warm-up), which the first calls here would take.
    hostile = sandbox.load(component_path("hostile").read_bytes(), name="hostile-warm-up")
    limits = Limits(instance_calls=1)  # instances: fresh
    marker = [["warm", "warm" * 16]]  # what recall returns after the warm-up alone
    hostile.prewarm(limits, depth=2, warm_call=("remember", json.dumps({"secret": "warm"})))
    found: list[list[str]] = []
    try:
        hostile.call("recall", "{}", CallContext("hostile", limits, NullChannel()))
        deadline = time.monotonic() + 120  # the pool fills after a call
        while hostile._pool.qsize() == 0:
            assert time.monotonic() < deadline, "no warm instance appeared"
            time.sleep(0.01)  # polling the background worker, which has no event to wait on
        for i in range(30):
            ctx = CallContext("hostile", limits, NullChannel())
            found.append(hostile.call("recall", "{}", ctx).value)
            ctx = CallContext("hostile", limits, NullChannel())
            hostile.call("remember", json.dumps({"secret": f"call {i}"}), ctx)
    finally:
        hostile.close()
    assert all(f in ([], *marker) for f in found), found
    # Every instance in the pool was warmed by this test's warm-up, and nothing else
    # takes one: the first call after one was ready took it.
    assert found[0] == marker[0], found
