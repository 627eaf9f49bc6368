"""The call contract every backend shares, below the sandbox; and the path of one call.

One ``tools/call``, in five hops (each stage in one place):

1. **MCP adapter and ring** (``mcp/``; each module entered once, going down):
   ``_server.McpService._call_tool`` finds the tool, takes the request's typed
   :class:`~skilld.types.Caller` (``_caller.caller_of``), refuses early what the caller
   rules refuse (``_caller.not_permitted``) and checks the arguments against the tool's
   input schema (``_schema``); ``_requests`` then runs the call at once (handshake
   era), in input-required rounds (``_rounds.in_rounds``, 2026-07-28) or as a task
   (``_tasks.as_task``), handing them ``Ring.call`` as what starts it. **The ring**
   (``_ring.Ring.call``) refuses while draining, awaits a slot of the skill's one
   :class:`CallGate` on the event loop (``dispatcher.gate(skill).take_async``; none in
   time: :class:`~skilld.errors.SkillBusy`) and lends it (:meth:`Slot.lend`) to the call,
   tried inline on the loop first for a tool, else run on a thread of ``_workers``' pool
   (shared fairly between callers and skills, waited for within what is left of
   ``queue_timeout_s``, else ``SkillBusy`` too). On that thread ``_content.call_tool``
   calls the dispatcher and maps its output to MCP content; the ring then counts the
   outcome for ``/metrics`` and writes the ``tool_call`` log line. A routed call from
   another node (``cluster/_worker.py``, its entry node's caller sealed in the message),
   ``invoke`` (the caller's skill), delegate's runner and ``skilld delegate``
   (``local:cli``) enter at hop 2 on their own thread; ``skilld call`` runs one component
   at hop 3, without a registry.
2. **Registry** (``registry/_dispatch.py``, ``Registry.call``, ``call_method``, ``_run``):
   the tool name to (skill, method), made a :class:`Call` (every other entry builds its
   own); the bundle's caller rules for the call's caller (``Registry._permit``; every
   call a client or another node sent, :attr:`Call.under_caller_rules`: a routed call
   is checked here against this node's rules, and the MCP adapter refused early what
   the same rules refuse, before a task or a round exists); an inline attempt (:class:`Inline`); a
   :class:`CallContext` with its :class:`~skilld.audit.CallRecorder`; the slot
   (:meth:`CallGate.take`: the lent one, or one waited for here).
3. **Backend** (``SkillBackend.call``, ``registry/_contract.py``): a wasm component
   (``sandbox/_sandbox.py``, which makes the context :func:`current` with
   :func:`entered` for the guest), an Agent Skill, a delegate kit or a remote node.
4. **Host functions** (``sandbox/abi/``): each finds the call with :func:`current`,
   asks the permission checker typed (``check_path``, ``check_url``, ``check_argv``,
   ``check_address``, ``check_tcp``; ``abi.decide``) and records the decision on the
   context (:meth:`CallContext.record`); ``invoke`` comes back to hop 2 for the callee.
5. **Outcome and audit** (``Registry._run``): the error class carries its WIT code and
   its outcome (``errors.py``'s table), which the audit, ``/metrics`` and the
   ``tool_call`` log line all say; a cancel from the server's drain becomes
   ``ServerShutdown`` here, once; the slot goes back; the recorder's one
   ``call`` record goes to the sink (``registry/_audit.py``; a ``started`` record went
   before the call's first state write); the result or the error goes back up the way
   it came: mapped to content on the call's thread (``mcp/_content.py``), counted and
   logged by the ring, answered by the adapter (or kept for the task or the round).

:class:`CallContext` is everything one call of one skill acts in: its limits, its
key-value namespace, its permission checker, the client channel, the orchestrator
for ``invoke``, its deadline and the decisions it took. A guest runs synchronously
on the thread that called it, and host functions are called back on that same
thread, so the current call is kept in a context variable holding a stack (a stack,
because ``invoke`` nests calls).
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, NoReturn, TypeVar

from skilld import telemetry
from skilld.audit import CallRecorder
from skilld.errors import CallCancelled, GuestError, HostCallError, RunOnThread, SkillBusy
from skilld.types import (
    Caller,
    ClientChannel,
    Decision,
    DecisionKey,
    KeyValueStore,
    Limits,
    PermissionChecker,
)

T = TypeVar("T")
W = TypeVar("W", bound="_Waiter")

# invoke(callee_skill, method, args_json, depth) -> result JSON
Invoker = Callable[[str, str, str, int], str]

MAX_LOG_LINES = 200
MAX_CAPTURE = 64 * 1024
# A host call that waits (on a socket, the client, another thread) looks at the
# cancel flag this often, so a cancelled call lets go of its slot within it.
WAIT_SLICE_S = 0.05


class NullChannel:
    """A channel with no client behind it: ``skilld call``, warm-up, ``describe`` at build.

    Notifications are dropped; asking the client (sampling, elicitation) is refused with
    ``unavailable`` and the reason given (``why``).
    """

    __slots__ = ("why",)

    def __init__(self, why: str = "no MCP client is attached to this call") -> None:
        self.why = why

    def progress(self, progress: float, total: float | None, message: str | None) -> None:
        """Drop the notification."""

    def log(self, level: str, data: Any) -> None:
        """Drop the message."""

    def sample(self, params: Mapping[str, Any]) -> Mapping[str, Any]:
        """Refuse: there is no client to sample from.

        Raises:
            GuestError: always, with code ``unavailable``.
        """
        raise GuestError("unavailable", self.why)

    def elicit(self, params: Mapping[str, Any]) -> Mapping[str, Any]:
        """Refuse: there is no client to ask.

        Raises:
            GuestError: always, with code ``unavailable``.
        """
        raise GuestError("unavailable", self.why)

    def cancelled(self) -> bool:
        """Never cancelled."""
        return False


def caller_share(limit: int) -> int:
    """How many of a skill's ``limit`` slots one caller may hold: all but a quarter, and
    at least one left for other callers (a skill of one slot: that slot)."""
    return max(1, limit - max(1, limit // 4))


class CallGate:
    """At most ``limit`` calls of one skill at once: the one concurrency gate.

    Every call of a skill holds one of its slots while its guest runs: a request of an
    MCP client, a routed call from another node, an ``invoke``, ``skilld call``, a
    resource read, a prompt. The MCP layer waits for one on the event loop without
    tying up a thread (:meth:`take_async`); everyone else waits on their own thread
    (:meth:`take`, which gives up as soon as the client cancels). Waiters on either
    side are served in the order they came. A call that gets no slot in time is
    refused with :class:`~skilld.errors.SkillBusy`, whichever side it waited on.

    Slots are shared out per caller (``key``: ``Caller.key``, the principal's, for a
    nested call too; empty: not counted per caller): one caller holds at most
    :func:`caller_share` of them (all but a quarter, at least one left for others), so
    one caller's long calls, tasks, unanswered rounds or calls of skills that invoke
    this one never make another caller of the skill wait or fail busy. Its further
    calls wait, behind other callers' waiters, until one of its own slots frees up. A
    skill of one slot stays first come, first served.

    A slot is taken once per call: the MCP layer takes it before it hands the call to
    a thread and lends it to the call it runs (:meth:`Slot.lend`); the registry's
    :meth:`take` there finds it lent and does not count the call again (a nested call
    of the same skill, made while it is borrowed, takes a slot of its own).
    """

    def __init__(self, skill: str, limit: int):
        self.skill = skill
        self.limit = max(1, limit)
        self._lock = threading.Lock()
        self._free = self.limit
        self.share = caller_share(self.limit)
        self._held: collections.Counter[str] = collections.Counter()  # slots per caller key
        self._waiters: collections.deque[_Waiter] = collections.deque()

    @property
    def running(self) -> int:
        """How many slots are taken now."""
        return self.limit - self._free

    @property
    def waiting(self) -> int:
        """How many calls wait for a slot now."""
        return len(self._waiters)

    def take(
        self, wait_s: float, cancelled: Callable[[], bool] = lambda: False, key: str = ""
    ) -> Slot:
        """A slot for a call of caller ``key`` on this thread: the one lent here, a free
        one within the caller's share, or one that frees up within ``wait_s`` (0: no
        waiting), given up as soon as ``cancelled()``.

        Raises:
            SkillBusy: no slot freed up in time.
            CallCancelled: the client cancelled the call while it waited.
        """
        lent = _lent.get()
        if lent is not None and lent.gate is self and lent.lendable():
            return Slot(self, lent.key, lender=lent)
        waiter = self._join(wait_s, _OnThread, key)
        if waiter is None:
            return Slot(self, key)
        end = time.monotonic() + wait_s
        while not cancelled():
            left = end - time.monotonic()
            if left <= 0:
                break
            if waiter.event.wait(min(left, WAIT_SLICE_S)):
                return Slot(self, key)
        if self._abandon(waiter):
            if not cancelled():
                return Slot(self, key)  # it came as the time ran out
            self._give_back(key)
        if cancelled():
            raise CallCancelled(
                f"{self.skill}: the client cancelled the call while it waited for a slot"
            )
        raise self._busy(key)

    async def take_async(self, wait_s: float, key: str = "") -> Slot:
        """A slot for a call of caller ``key``, awaited on the running event loop for up
        to ``wait_s``.

        A cancelled await takes no slot (one handed over meanwhile is given back).

        Raises:
            SkillBusy: no slot freed up in time.
        """
        waiter = self._join(wait_s, _OnLoop, key)
        if waiter is None:
            return Slot(self, key)
        try:
            await asyncio.wait_for(waiter.event.wait(), wait_s)
        except TimeoutError:
            if not self._abandon(waiter):
                raise self._busy(key) from None
        except BaseException:
            if self._abandon(waiter):
                self._give_back(key)
            raise
        return Slot(self, key)

    def _within(self, key: str) -> bool:
        """Whether caller ``key`` may take one more slot (under the lock). ``""``: a call
        not counted per caller."""
        return not key or self._held[key] < self.share

    def _busy(self, key: str) -> SkillBusy:
        """The refusal for caller ``key``: its own share, or the skill's slots, are taken."""
        with self._lock:
            mine = self._held[key]
        if key and mine >= self.share and self.share < self.limit:
            return SkillBusy(
                self.skill,
                self.limit,
                message=f"skill {self.skill} is busy for this caller: its calls hold "
                f"{mine} of the skill's {self.limit} slots, its share (the rest are kept "
                "for other callers); retry when one of them has ended",
            )
        return SkillBusy(self.skill, self.limit)

    def _join(self, wait_s: float, waiter: Callable[[], W], key: str) -> W | None:
        """Take a free slot (None), or queue a new ``waiter()`` for one.

        Never ahead of a waiter that could take it: the queue is first come, first
        served among callers within their share.

        Raises:
            SkillBusy: no slot is free and ``wait_s`` allows no waiting.
        """
        with self._lock:
            ahead = any(self._within(w.key) for w in self._waiters)
            if self._free > 0 and self._within(key) and not ahead:
                self._free -= 1
                self._held[key] += 1
                return None
            if wait_s > 0:
                queued = waiter()
                queued.key = key
                self._waiters.append(queued)
                return queued
        raise self._busy(key)  # no waiting allowed (outside the lock: _busy takes it)

    def _abandon(self, waiter: _Waiter) -> bool:
        """A waiter stops waiting; True when a slot was handed to it meanwhile (it holds it)."""
        with self._lock:
            if waiter.granted:
                return True
            self._waiters.remove(waiter)
            return False

    def _give_back(self, key: str) -> None:
        """Caller ``key``'s slot is free: hand it to the first waiter within its caller's
        share, else count it free."""
        with self._lock:
            self._held[key] -= 1
            if self._held[key] <= 0:
                del self._held[key]
            for waiter in list(self._waiters):
                if not self._within(waiter.key):
                    continue  # over its share: it waits for a slot of its own caller's
                self._waiters.remove(waiter)
                try:
                    waiter.wake()
                except RuntimeError:  # its event loop closed: nobody waits there any more
                    continue
                waiter.granted = True
                self._held[waiter.key] += 1
                return
            self._free += 1


class _Waiter:
    """A call waiting for a slot; ``granted`` once one was handed to it (under the gate's lock)."""

    __slots__ = ("granted", "key")

    def __init__(self) -> None:
        self.granted = False
        self.key = ""  # its caller's Caller.key

    def wake(self) -> None:
        """Tell the waiting call its slot came (from any thread).

        Raises:
            RuntimeError: nobody can be told (its event loop closed).
        """
        raise NotImplementedError


class _OnThread(_Waiter):
    __slots__ = ("event",)

    def __init__(self) -> None:
        super().__init__()
        self.event = threading.Event()

    def wake(self) -> None:
        self.event.set()


class _OnLoop(_Waiter):
    __slots__ = ("event", "loop")

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.get_running_loop()
        self.event = asyncio.Event()

    def wake(self) -> None:
        self.loop.call_soon_threadsafe(self.event.set)


class Slot:
    """One slot of a :class:`CallGate`, held until :meth:`release` (a second release does nothing).

    Also a context manager that releases it on exit.
    """

    __slots__ = ("_held", "_lender", "_out", "gate", "key")

    def __init__(self, gate: CallGate, key: str = "", *, lender: Slot | None = None) -> None:
        self.gate = gate
        self.key = key  # the caller holding it (CallGate shares slots out per caller)
        self._held = True
        self._lender = lender  # the lent slot this one borrows (releasing returns it)
        self._out = False  # lent out to a call running now

    def release(self) -> None:
        """Give the slot back (a borrowed one to its lender)."""
        if not self._held:
            return
        self._held = False
        if self._lender is not None:
            self._lender._out = False
        else:
            self.gate._give_back(self.key)

    def lendable(self) -> bool:
        """True while held and not lent out to a call running now; marks it lent out."""
        if not self._held or self._out:
            return False
        self._out = True
        return True

    def lend(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, during which the first call of this slot's skill takes this slot.

        For the MCP layer, which takes the slot on the event loop and runs the call
        on the loop (an inline attempt) or a worker thread: call ``lend`` where the
        call runs. An inline attempt that gives up returns it, for the thread.
        """
        token = _lent.set(self)
        try:
            return fn(*args)
        finally:
            _lent.reset(token)

    def __enter__(self) -> Slot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# The slot lent to the call about to run here (Slot.lend), if any.
_lent: contextvars.ContextVar[Slot | None] = contextvars.ContextVar("skilld_lent", default=None)


@dataclass(slots=True)
class Inline:
    """One inline attempt at a call: on a thread that must not block (the server's event loop).

    The whole inline strategy of a call, in one place. The registry starts an attempt
    (``Registry.call_method``); a backend answers it only when it
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


@dataclass(frozen=True, slots=True)
class RemoteInvoker:
    """The skill of another cluster node whose ``invoke`` a routed call is: the verified
    sending node and the calling skill's id there (the callee's own policy must consent,
    ``called_by`` in its ``invoke`` grant)."""

    node: str
    skill: str


@dataclass(frozen=True, slots=True)
class Call:
    """One call of one skill's method, as every entry hands it to the registry
    (``Registry.call_method``): an MCP ``tools/call`` (after the tool name is resolved), a
    call routed from another node (``cluster/_worker.py``), ``invoke``, a delegate program's
    runner, ``skilld call``/``skilld delegate``.

    ``tool`` is the tool name the client called, when it came as one (else the registry
    finds the tool exposing ``method``, for the caller rules). ``caller`` is who the call
    acts for (:attr:`CallContext.caller`); ``deadline``
    (monotonic; a nested call's caller's) ends it sooner than its own wall time would;
    ``depth`` and ``chain`` place a nested call (``invoke``) in its chain of skills,
    outermost first; ``inline_s`` makes it an inline attempt of about that long
    (:class:`Inline`); ``remote`` makes it an ``invoke`` routed from a skill of another
    cluster node.
    """

    skill: str
    method: str
    arguments: Mapping[str, Any]
    channel: ClientChannel | None = None
    _: KW_ONLY
    tool: str | None = None
    caller: Caller = field(default_factory=Caller.local)
    deadline: float | None = None
    depth: int = 0
    chain: tuple[str, ...] = ()
    inline_s: float | None = None
    remote: RemoteInvoker | None = None

    @property
    def under_caller_rules(self) -> bool:
        """Whether the bundle's caller rules decide this call: every call a client or
        another node sent. Not a nested call (``invoke``, a delegate program's runner),
        whose caller is a skill acting for the outer call's caller: the calling skill's
        ``invoke`` grant decides it (checked when it invoked), and the callee need not be
        a tool the client may call. Nor a routed ``invoke`` (``remote``), to which the
        callee's own ``called_by`` consents."""
        return self.remote is None and self.caller.kind != "skill"


@dataclass
class CallContext:
    """Everything host functions need to act for one call of one skill."""

    skill_id: str
    limits: Limits
    channel: ClientChannel
    # Who makes this call (the principal behind it: ``caller.key``). Warm instances, kept
    # outputs, tasks and shares are bound to it.
    caller: Caller = field(default_factory=Caller.local)
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
            self.recorder = CallRecorder(self.skill_id, "", "", caller=self.caller, input=b"")
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
        telemetry.decision(decision)  # on the host function's span, when tracing is on
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
