"""Warm instances: one caller's calls may share one; never two callers', never after a fault."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from skilld.call import CallContext
from skilld.errors import CallCancelled, DeadlineExceeded, GuestTrap, MemoryExhausted
from skilld.registry import NullChannel, Registry, SkillEntry
from skilld.sandbox import Component, Sandbox
from skilld.types import Caller, Limits
from support.callers import open_to_authenticated

Loader = Callable[[str], Path]
WARM = Limits(memory_bytes=64 << 20)


class _Cancelled(NullChannel):
    """A channel whose client has cancelled."""

    def cancelled(self) -> bool:
        """Always: the call is stopped at its first check."""
        return True


@pytest.fixture
def hostile(sandbox: Sandbox, component_path: Loader) -> Iterator[Component]:
    """The hostile test skill (``remember``/``recall`` keep module state), loaded per test."""
    comp = sandbox.load(component_path("hostile").read_bytes(), name="hostile")
    yield comp
    comp.close()


def _call(
    comp: Component,
    method: str,
    caller: Caller,
    limits: Limits = WARM,
    channel: NullChannel | None = None,
    **args: object,
) -> object:
    ctx = CallContext("hostile", limits, channel or NullChannel(), caller=caller)
    out = comp.call(method, json.dumps(args), ctx)
    return out.value


def _recall(comp: Component, caller: Caller, limits: Limits = WARM) -> list[str]:
    value = _call(comp, "recall", caller, limits)
    assert isinstance(value, list)
    return value


def test_eight_callers_at_once_never_read_each_others_secrets(hostile: Component) -> None:
    """Eight callers store secrets in module state and memory; each sees only its own.

    Each caller runs two threads, so one caller's warm instances are used concurrently
    and handed between its threads; a caller that recalls a secret it never stored (or
    an instance that went to another caller) fails the test. Each caller must also see
    some of its own: reuse is at work, or the test would prove nothing.
    """
    hostile.prewarm(WARM, depth=2)
    callers = [Caller.token(f"client-{n}") for n in range(8)]
    seen: dict[str, set[str]] = {c.key: set() for c in callers}
    stored: dict[str, set[str]] = {c.key: set() for c in callers}
    failures: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(16)

    def run(caller: Caller, half: int) -> None:
        try:
            start.wait()
            for i in range(10):
                secret = f"{caller.key} {half}.{i}"
                with lock:
                    stored[caller.key].add(secret)
                _call(hostile, "remember", caller, secret=secret)
                found = _recall(hostile, caller)
                with lock:
                    seen[caller.key].update(s for s in found if len(s) < 64)
        except BaseException as exc:  # reported by the main thread below
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(c, h)) for c in callers for h in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(thread.is_alive() for thread in threads)
    assert not failures, failures[0]
    for caller in callers:
        assert seen[caller.key] <= stored[caller.key], (caller.key, seen[caller.key])
        assert seen[caller.key], f"{caller.key} never met its own warm instance"


def test_one_callers_next_call_reuses_its_instance_and_the_audit_says_so(
    hostile: Component,
) -> None:
    """A caller's second call finds its first call's state; the audit facts count the calls."""
    alice = Caller.token("alice")
    ctx = CallContext("hostile", WARM, NullChannel(), caller=alice)
    hostile.call("remember", json.dumps({"secret": "a"}), ctx)
    assert ctx.audit["instances"] == "warm"
    assert ctx.audit["instance_call"] == 1
    ctx = CallContext("hostile", WARM, NullChannel(), caller=alice)
    assert [s for s in hostile.call("recall", "{}", ctx).value if len(s) < 64] == ["a"]
    assert ctx.audit["instance_call"] == 2
    # Another caller, and the same principal with other scopes, start afresh.
    assert _recall(hostile, Caller.token("bob")) == []
    assert _recall(hostile, Caller.token("alice", frozenset({"admin"}))) == []
    # A nested call made for alice (a skill acting for her) is hers.
    assert _recall(hostile, alice.as_skill("delegate"))[0] == "a"


def test_fresh_policy_gets_a_new_instance_every_call(hostile: Component) -> None:
    """``instances: fresh`` (one call per instance): nothing reaches the next call, same caller."""
    fresh = Limits(memory_bytes=64 << 20, instance_calls=1)
    alice = Caller.token("alice")
    for i in range(5):
        ctx = CallContext("hostile", fresh, NullChannel(), caller=alice)
        assert hostile.call("recall", "{}", ctx).value == []
        assert ctx.audit == {"instances": "fresh", "instance_call": 1}
        _call(hostile, "remember", alice, fresh, secret=f"s{i}")


@pytest.mark.parametrize(
    ("method", "limits", "channel", "error"),
    [
        ("trap", WARM, None, GuestTrap),
        ("loop", Limits(memory_bytes=64 << 20, timeout_ms=200), None, DeadlineExceeded),
        ("loop", WARM, _Cancelled(), CallCancelled),
        ("alloc", WARM, None, MemoryExhausted),
    ],
    ids=["trap", "deadline", "cancelled", "memory"],
)
def test_a_failed_instance_is_never_used_again(
    hostile: Component,
    method: str,
    limits: Limits,
    channel: NullChannel | None,
    error: type[Exception],
) -> None:
    """After a trap, a deadline, a cancel or the memory cap, the caller's next call is fresh.

    The caller's one warm instance holds a secret; the failing call takes it (the most
    recently used), so a next call that still found the secret would run on it.
    """
    alice = Caller.token("alice")
    _call(hostile, "remember", alice, limits, secret="before")
    assert _recall(hostile, alice, limits)  # the warm instance is there
    with pytest.raises(error):
        _call(hostile, method, alice, limits, channel)
    assert _recall(hostile, alice, limits) == []


def test_a_refusal_ends_the_instance(hostile: Component) -> None:
    """A call that met a permission refusal leaves no warm instance behind."""
    alice = Caller.token("alice")
    _call(hostile, "remember", alice, secret="before")
    assert str(_call(hostile, "forbidden", alice)).startswith("not-permitted")
    assert _recall(hostile, alice) == []


def test_an_instance_serves_at_most_its_policys_calls(hostile: Component) -> None:
    """``instances.max_calls``: after that many calls the caller's instance is replaced."""
    three = Limits(memory_bytes=64 << 20, instance_calls=3)
    alice = Caller.token("alice")
    _call(hostile, "remember", alice, three, secret="x")  # call 1
    assert len(_recall(hostile, alice, three)) == 2  # call 2
    assert len(_recall(hostile, alice, three)) == 2  # call 3: the last on it
    assert _recall(hostile, alice, three) == []


def test_an_idle_instance_is_freed_after_its_idle_time(
    hostile: Component, sandbox: Sandbox
) -> None:
    """``instances.idle``: an instance unused that long is dropped without waiting for a call."""
    brief = Limits(memory_bytes=64 << 20, instance_idle_ms=100)
    alice = Caller.token("alice")
    _call(hostile, "remember", alice, brief, secret="x")
    assert sandbox.warm.count(hostile) == 1
    deadline = time.monotonic() + 10
    while sandbox.warm.count(hostile):
        assert time.monotonic() < deadline, "the idle instance was never dropped"
        time.sleep(0.01)  # polling the sweeper thread, which has no event to wait on
    assert _recall(hostile, alice, brief) == []


def test_warm_instances_are_capped_least_recently_used_first(
    hostile: Component, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the per-component cap the least recently used caller's instance goes first."""
    monkeypatch.setattr(sandbox.warm, "per_component", 3)
    callers = [Caller.token(f"c{n}") for n in range(4)]
    for caller in callers:
        _call(hostile, "remember", caller, secret=caller.key)
    assert sandbox.warm.count(hostile) == 3
    assert _recall(hostile, callers[0]) == []  # the oldest was dropped
    assert _recall(hostile, callers[3])[0] == callers[3].key
    hostile.close()
    assert sandbox.warm.count(hostile) == 0


def test_through_the_registry_each_caller_gets_its_own_warm_instance(
    sandbox: Sandbox, component_path: Loader
) -> None:
    """The registry's typed caller (``CallContext.caller``) decides which warm instance serves.

    Two callers of the same tool through the registry: each finds only what its own
    earlier call left.
    """
    comp = sandbox.load(component_path("hostile").read_bytes(), name="hostile")
    spec = comp.describe(CallContext("hostile", WARM, NullChannel()))
    # Token callers call only what caller rules give them (the registry checks every call).
    registry = open_to_authenticated(Registry())
    registry.add(SkillEntry(spec=spec, component=comp, limits=WARM))
    registry.mark_ready()
    alice, bob = Caller.token("alice"), Caller.token("bob")
    try:
        registry.call("hostile/remember", {"secret": "alice's"}, NullChannel(), caller=alice)
        registry.call("hostile/remember", {"secret": "bob's"}, NullChannel(), caller=bob)
        mine = registry.call("hostile/recall", {}, NullChannel(), caller=alice).value
        theirs = registry.call("hostile/recall", {}, NullChannel(), caller=bob).value
    finally:
        comp.close()
    assert [s for s in mine if len(s) < 64] == ["alice's"]
    assert [s for s in theirs if len(s) < 64] == ["bob's"]
