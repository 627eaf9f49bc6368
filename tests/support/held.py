"""``held``: a host-implemented skill whose ``hold`` runs until the test lets it go, and
``relay``, whose ``relay`` invokes ``held/hold`` (a nested call): for tests of the gate
and of callers' shares of its slots."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

from skilld.audit import MemorySink
from skilld.call import CallContext
from skilld.errors import CallCancelled
from skilld.registry import Registry, SkillEntry
from skilld.types import CallOutput, Decision, Limits, MethodSpec, SkillSpec
from support.checkers import TextQuestions

_OBJECT = {"type": "object"}


class HeldBackend:
    """``hold`` runs until :attr:`release` is set (or the call is cancelled) for the calls
    ``holds`` picks (every call by default), answering ``held for CALLER``, and answers
    ``at once for CALLER`` to the others;
    :attr:`running` (and its peak :attr:`most`) counts the calls it holds."""

    def __init__(self, holds: Callable[[CallContext], bool] = lambda ctx: True) -> None:
        self.holds = holds
        self.started = threading.Event()
        self.release = threading.Event()
        self.running = 0
        self.most = 0
        self._lock = threading.Lock()

    def call(self, method: str, args_json: str, ctx: CallContext) -> CallOutput:
        ctx.thread_only()
        if method == "relay":
            assert ctx.invoker is not None
            return CallOutput(json.loads(ctx.invoker("held", "hold", "{}", ctx.depth + 1)))
        if not self.holds(ctx):
            return CallOutput(f"at once for {ctx.caller.key}")
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
        self.started.set()
        try:
            while not self.release.wait(0.005):
                if ctx.channel.cancelled():
                    raise CallCancelled("held: cancelled")
        finally:
            with self._lock:
                self.running -= 1
        return CallOutput(f"held for {ctx.caller.key}")

    def read_resource(self, uri: str, ctx: CallContext) -> list[CallOutput]:
        raise AssertionError("not served")

    def get_prompt(self, name: str, args_json: str, ctx: CallContext) -> list[dict[str, Any]]:
        raise AssertionError("not served")


class AllowAll(TextQuestions):
    """A permission checker that allows everything (the gate is what these tests try)."""

    def check(self, capability: str, action: str, target: str) -> Decision:
        return Decision(True, capability, action, target, "test-allow", "a test allows it")


def held_registry(
    held_slots: int, relay_slots: int, timeout_ms: int, backend: HeldBackend
) -> tuple[Registry, MemorySink]:
    """A ready registry of ``held`` and ``relay`` served by ``backend``, and its audit."""
    sink = MemorySink()
    registry = Registry(audit=sink)
    for sid, method, slots in (("held", "hold", held_slots), ("relay", "relay", relay_slots)):
        spec = SkillSpec(sid, "1.0.0", sid, (MethodSpec(method, method, _OBJECT),))
        registry.add(
            SkillEntry(
                spec=spec,
                component=backend,
                limits=Limits(timeout_ms=timeout_ms, max_concurrency=slots),
                checker=AllowAll(),
            )
        )
    registry.mark_ready()
    return registry, sink
