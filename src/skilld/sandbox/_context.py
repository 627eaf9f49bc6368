"""The per-call context host functions act in.

A guest runs synchronously on the thread that called it, and host functions
are called back on that same thread, so the current call is found through a
thread-local stack (a stack, because ``invoke`` nests calls).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from skilld.types import (
    MAX_AUDITED_DECISIONS,
    ClientChannel,
    Decision,
    DecisionKey,
    KeyValueStore,
    Limits,
    PermissionChecker,
    decision_key,
)

# invoke(callee_skill, method, args_json, depth) -> result JSON
Invoker = Callable[[str, str, str, int], str]

MAX_LOG_LINES = 200
MAX_CAPTURE = 64 * 1024
# Host faults one call keeps for its audit record.
MAX_HOST_FAULTS = 16


@dataclass
class CallContext:
    """Everything host functions need to act for one call of one skill."""

    skill_id: str
    limits: Limits
    channel: ClientChannel
    kv: KeyValueStore | None = None
    checker: PermissionChecker | None = None
    invoker: Invoker | None = None
    services: dict[str, Any] = field(default_factory=dict)
    depth: int = 0
    # The skills that invoked this call, outermost first (for cycle checks).
    chain: tuple[str, ...] = ()
    # The first MAX_AUDITED_DECISIONS decisions; the rest are only counted.
    decisions: list[Decision] = field(default_factory=list)
    decisions_beyond: dict[DecisionKey, int] = field(default_factory=dict)
    logs: list[tuple[str, str]] = field(default_factory=list)
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    dropped_output: int = 0
    host_faults: list[str] = field(default_factory=list)
    # Open host resources (tcp connections) by handle; closed when the call ends.
    handles: dict[int, Any] = field(default_factory=dict)
    # An inline attempt (on the server's event loop) gives up at this monotonic time,
    # or at the first host call that could block or act (``needs_thread``); None
    # for a call on a worker thread. See ``Component.call``.
    inline_until: float | None = None
    needs_thread: bool = False
    # Monotonic time at which the guest call's wall time ends; every host call is
    # bounded by what is left of it (``remaining``). Set when the call starts.
    deadline: float | None = None
    # Run once, right before the call's first state write (the registry writes the
    # audit record that the write can be traced to after a crash).
    before_first_write: Callable[[], None] | None = None

    def remaining(self) -> float:
        """Seconds left before the call's deadline (0 when past it; inf when unset)."""
        if self.deadline is None:
            return math.inf
        return max(0.0, self.deadline - time.monotonic())

    def close_handles(self) -> None:
        """Close whatever the guest left open."""
        for handle in list(self.handles.values()):
            try:
                handle.close()
            except OSError:
                continue
        self.handles.clear()

    def record(self, decision: Decision) -> Decision:
        """Keep a permission decision for the audit record (past the cap, count it); returns it."""
        if len(self.decisions) < MAX_AUDITED_DECISIONS:
            self.decisions.append(decision)
        else:
            key = decision_key(decision)
            self.decisions_beyond[key] = self.decisions_beyond.get(key, 0) + 1
        return decision

    def will_write_state(self) -> None:
        """Say a state write is about to happen: the first runs ``before_first_write``.

        Raises:
            SkilldError: whatever the hook raised (an ``AuditError``): the write must not happen.
        """
        hook, self.before_first_write = self.before_first_write, None
        if hook is not None:
            hook()

    def capture(self, stream: bytearray, data: bytes) -> None:
        """Keep guest output up to a cap; count the rest."""
        room = MAX_CAPTURE - len(stream)
        if room > 0:
            stream += data[:room]
        self.dropped_output += max(0, len(data) - max(room, 0))


_local = threading.local()


def current() -> CallContext:
    """The context of the call running on this thread.

    Raises:
        RuntimeError: no call is running on this thread (a host bug).
    """
    stack: list[CallContext] = getattr(_local, "stack", [])
    if not stack:
        raise RuntimeError("host function called outside of a guest call")
    return stack[-1]


@contextmanager
def entered(ctx: CallContext) -> Iterator[CallContext]:
    """Make ``ctx`` the current context for the duration of a guest call."""
    stack: list[CallContext] = getattr(_local, "stack", None) or []
    _local.stack = stack
    stack.append(ctx)
    try:
        yield ctx
    finally:
        stack.pop()
