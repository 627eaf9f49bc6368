"""The call contract every backend shares, below the sandbox.

:class:`CallContext` is everything one call of one skill acts in: its limits, its
key-value namespace, its permission checker, the client channel, the orchestrator
for ``invoke``, its deadline and the decisions it took. The registry builds one per
call (``registry/_dispatch.py``); every backend (a wasm component, an Agent Skill, a
delegate kit, a remote node) is handed it, and host functions find it again with
:func:`current`.

A guest runs synchronously on the thread that called it, and host functions are
called back on that same thread, so the current call is kept in a context variable
holding a stack (a stack, because ``invoke`` nests calls).
"""

from __future__ import annotations

import contextvars
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

from skilld.audit import CallRecorder
from skilld.errors import GuestError, HostCallError, RunOnThread
from skilld.types import (
    ClientChannel,
    Decision,
    DecisionKey,
    KeyValueStore,
    Limits,
    PermissionChecker,
)

T = TypeVar("T")

# invoke(callee_skill, method, args_json, depth) -> result JSON
Invoker = Callable[[str, str, str, int], str]

MAX_LOG_LINES = 200
MAX_CAPTURE = 64 * 1024
# A host call that waits (on a socket, the client, another thread) looks at the
# cancel flag this often, so a cancelled call lets go of its slot within it.
WAIT_SLICE_S = 0.05


def busy(skill: str, limit: int) -> GuestError:
    """The one refusal of a call for want of a slot of its skill (audit outcome ``busy``).

    The same words whichever gate refused: the MCP layer's queue or the skill's own
    ``max_concurrency`` (``registry/_dispatch.py``).
    """
    return GuestError(
        "limit-exceeded", f"skill {skill} is busy ({limit} calls running); retry later"
    )


@dataclass(slots=True)
class Inline:
    """One inline attempt at a call: on a thread that must not block (the server's event loop).

    The whole inline strategy of a call, in one place. The registry starts an attempt
    (``registry/_dispatch.py``'s ``InlineStrategy``); a backend answers it only when it
    can without running guest code or blocking (delegate's ``kit_list``, say), and
    otherwise gives up (:meth:`give_up`, through :meth:`CallContext.thread_only`) before
    anything runs: when the skill has no free slot, and always for guest code (a wasm
    component runs on a thread, ``skilld.sandbox``), a script, a remote node or a
    delegate program. Giving up happens before any guest code runs, so nothing anyone can
    observe happened (no host call acted, nothing audited), and the caller runs the call
    once on a worker thread: no guest body ever runs twice for one call.
    """

    until: float  # monotonic time at which the attempt's budget ends

    @classmethod
    def for_s(cls, budget_s: float) -> Inline:
        """An attempt of about ``budget_s`` seconds from now."""
        return cls(time.monotonic() + budget_s)

    def give_up(self) -> NoReturn:
        """End the attempt, before anything ran.

        Raises:
            RunOnThread: always.
        """
        raise RunOnThread


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
    # Builds the call's audit record: its decisions, host faults and a backend's facts.
    # The registry makes one per call; a context made without one gets its own.
    recorder: CallRecorder | None = None
    logs: list[tuple[str, str]] = field(default_factory=list)
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    dropped_output: int = 0
    # Open host resources (tcp connections) by handle; closed when the call ends.
    handles: dict[int, Any] = field(default_factory=dict)
    # An inline attempt (on the server's event loop); None for a call on a worker thread.
    inline: Inline | None = None
    # Monotonic time at which the guest call's wall time ends; every host call is
    # bounded by what is left of it (``remaining``). Set when the call starts.
    deadline: float | None = None
    # Run once, right before the call's first state write (the registry writes the
    # audit record that the write can be traced to after a crash).
    before_first_write: Callable[[], None] | None = None
    # WASI directories for this call only: (host path, guest path, writable). A call
    # with preopens gets an instance of its own, never a pooled one (whose WASI
    # context was made without them). Agent Skills' wasm executor sets them.
    preopens: tuple[tuple[str, str, bool], ...] = ()

    def __post_init__(self) -> None:
        if self.recorder is None:
            self.recorder = CallRecorder(self.skill_id, "", "", caller="local", input=b"")
        self._recorder: CallRecorder = self.recorder

    @property
    def decisions(self) -> list[Decision]:
        """The first MAX_AUDITED_DECISIONS decisions taken (the recorder's)."""
        return self._recorder.decisions

    @property
    def decisions_beyond(self) -> dict[DecisionKey, int]:
        """Decisions past the cap, counted per (capability, action, allowed, rule)."""
        return self._recorder.decisions_beyond

    @property
    def host_faults(self) -> list[str]:
        """Host functions' own failures during the call (the recorder's)."""
        return self._recorder.host_faults

    @property
    def audit(self) -> dict[str, Any]:
        """Facts a backend adds to its call's audit record (the recorder's ``facts``)."""
        return self._recorder.facts

    def thread_only(self) -> None:
        """Say this call always blocks: an inline attempt gives up here, before it acts.

        Raises:
            RunOnThread: the call is an inline attempt.
        """
        if self.inline is not None:
            self.inline.give_up()

    def remaining(self) -> float:
        """Seconds left before the call's deadline (0 when past it; inf when unset)."""
        if self.deadline is None:
            return math.inf
        return max(0.0, self.deadline - time.monotonic())

    def live(self, what: str) -> None:
        """Refuse to start or go on with a host call past the deadline or after a cancel.

        Raises:
            HostCallError: ``cancelled`` once the client cancelled the call, ``timeout``
                once its wall time is spent.
        """
        if self.channel.cancelled():
            raise HostCallError("cancelled", f"{what}: the client cancelled the call")
        if self.remaining() <= 0:
            raise HostCallError("timeout", f"{what}: the call's wall time ran out")

    def waits(self, what: str, timeout_s: float | None = None) -> Iterator[float]:
        """How long to wait next, in slices of at most ``WAIT_SLICE_S``, until the
        smaller of ``timeout_s`` (the guest's own) and the call's deadline.

        A host call that blocks loops over it, waiting one slice at a time, so that
        neither the deadline nor a cancellation has to wait for the peer.

        Raises:
            HostCallError: ``timeout`` when the time is up (the guest's or the call's),
                ``cancelled`` once the client cancelled the call.
        """
        own = math.inf if timeout_s is None else time.monotonic() + max(timeout_s, 0.0)
        while True:
            self.live(what)
            left = own - time.monotonic()
            if left <= 0:
                raise HostCallError("timeout", f"{what} timed out after {timeout_s:g} s")
            # Never 0: a zero timeout would turn a socket non-blocking.
            yield max(min(left, self.remaining(), WAIT_SLICE_S), 0.001)

    def off_thread(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()`` on a helper thread, waited for in slices (see :meth:`waits`).

        For a blocking call that cannot wait in slices itself (a name lookup, a
        request to the client). When the time runs out or the call is cancelled the
        guest goes on and ``fn`` is abandoned on its daemon thread, which ends when
        ``fn`` does and cannot hold up the process's exit.

        Raises:
            HostCallError: ``timeout``, ``cancelled``; whatever ``fn`` raised.
        """
        answer: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()

        def run() -> None:
            try:
                answer.put((True, fn()))
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting call
                answer.put((False, exc))

        self.live(what)
        threading.Thread(target=run, name=f"skilld-{what}", daemon=True).start()
        for wait in self.waits(what):
            try:
                ok, value = answer.get(timeout=wait)
            except queue.Empty:
                continue
            if not ok:
                raise value
            result: T = value
            return result
        raise AssertionError("unreachable: waits() raises when the time is up")  # pragma: no cover

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
        return self._recorder.record(decision)

    def record_fault(self, text: str) -> None:
        """Note a host function's own failure for the audit record (bounded)."""
        self._recorder.host_fault(text)

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


# The calls running in this context, innermost last (a tuple: a copied context, such
# as a worker thread's, never shares a mutable stack with the one it came from).
_stack: contextvars.ContextVar[tuple[CallContext, ...]] = contextvars.ContextVar(
    "skilld_call", default=()
)


def current() -> CallContext:
    """The context of the call running here (on this thread, in this context).

    Raises:
        RuntimeError: no call is running here (a host bug).
    """
    stack = _stack.get()
    if not stack:
        raise RuntimeError("host function called outside of a guest call")
    return stack[-1]


@contextmanager
def entered(ctx: CallContext) -> Iterator[CallContext]:
    """Make ``ctx`` the current context for the duration of a guest call."""
    token = _stack.set((*_stack.get(), ctx))
    try:
        yield ctx
    finally:
        _stack.reset(token)
