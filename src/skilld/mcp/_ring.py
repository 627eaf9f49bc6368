"""The ring around every guest call an MCP request makes: drain, gate, thread, outcome.

Every request's guest code runs through :meth:`Ring.call`: at once from ``_requests``, or
started by input-required rounds (``_rounds``) and tasks (``_tasks``), which are handed it
bound; each calls it downward, and it calls nothing back in them. The ring refuses while
draining, awaits a slot of the skill's one gate (``dispatcher.gate``) on the event loop,
tries the call inline or runs it on a worker thread (``_workers``), and gives one outcome
word (the error class's) to ``/metrics`` and the ``tool_call`` log line, as the audit
record says it. It also counts the calls in flight, which is what :meth:`Ring.drain`
waits for.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Protocol, TypeVar

import anyio

from skilld import telemetry
from skilld.errors import ErrorCode, GuestError, RunOnThread, SkillBusy, SkilldError
from skilld.mcp._channel import SessionChannel
from skilld.mcp._config import ServeConfig
from skilld.mcp._content import error_text
from skilld.mcp._logging import Logger
from skilld.mcp._metrics import Metrics
from skilld.mcp._workers import WorkerPool
from skilld.registry import Dispatcher, Slot
from skilld.types import Caller

T = TypeVar("T")

# Past the drain's grace, the calls still running get this long to end and be answered
# "the server shut down" before the connections close (a guest stops at its next epoch
# check, a confined process tree is killed at once).
_CUT_S = 1.0


class Parked(Protocol):
    """The calls kept across input-required rounds (``_rounds.ParkedCalls``), as a drain
    ends them."""

    def cancel_waiting(self) -> int:
        """End the calls parked on a question (they would hold the drain to their deadline);
        how many."""
        ...

    def cancel_all(self, reason: str) -> None:
        """Tell every kept call to stop, for ``reason``."""
        ...


class Ring:
    """Runs the guest calls of one server's requests; build once per server run.

    Args:
        dispatcher: whose gates and audit the calls use.
        config: ``queue_timeout_s``, ``worker_threads``, ``worker_idle_s``.
        log: where the call log goes (one JSON line per call).
        metrics: the counters ``/metrics`` reports.
    """

    def __init__(
        self, dispatcher: Dispatcher, config: ServeConfig, log: Logger, metrics: Metrics
    ) -> None:
        self.dispatcher = dispatcher
        self.metrics = metrics
        self._log = log
        self._queue_timeout_s = config.queue_timeout_s
        self._workers = WorkerPool(config.worker_threads, idle_s=config.worker_idle_s)
        self._in_flight = 0
        # The channels of the calls in flight: what a drain past its grace ends.
        self._running: set[SessionChannel] = set()
        self._idle: anyio.Event | None = None
        self.draining = False

    async def drain(self, timeout: float, parked: Parked) -> bool:
        """Refuse new calls and wait up to ``timeout`` seconds for calls in flight.

        Past the grace the calls still running are ended as ``shutdown`` (not as a client's
        cancel): their clients are answered ``[unavailable] the server shut down ...``
        while the connections are still open, within ``_CUT_S`` more.

        Returns True when every call finished in time.
        """
        self.draining = True
        # A call parked on a question would hold the drain until its deadline.
        parked.cancel_waiting()
        if self._in_flight == 0:
            return True
        self._idle = anyio.Event()
        self._log.info("draining", in_flight=self._in_flight, grace_s=timeout)
        with anyio.move_on_after(timeout):
            await self._idle.wait()
        if self._in_flight == 0:
            return True
        self._log.warning("drain_cut", in_flight=self._in_flight, grace_s=timeout)
        # Calls running in the background (2026-07-28 requests, tasks) have no request
        # for the transport to cancel at shutdown: tell each to stop, as a cancelled
        # request's call is told (the guest stops at its next epoch check).
        parked.cancel_all("shutdown")
        for channel in list(self._running):
            channel.cancel("shutdown")
        with anyio.move_on_after(_CUT_S):
            await self._idle.wait()
        return False

    def denied(
        self,
        refusal: GuestError,
        skill: str,
        label: str,
        arguments: Mapping[str, Any],
        caller: Caller,
    ) -> None:
        """Count and audit a request the caller rules refused (``refusal``) under ``label``."""
        code, rule, text = error_text(refusal)
        self.metrics.denied(skill, rule or "default-deny")
        self.refused(skill, label, code, text, arguments, caller)

    def refused(
        self,
        skill: str,
        label: str,
        outcome: str,
        text: str,
        arguments: Mapping[str, Any] | None,
        caller: Caller,
    ) -> None:
        """Count and audit a request ``caller`` made, refused before its guest ran.

        An audit failure is logged, not raised: the request is refused either way,
        and the client should see why it was refused, not the audit's trouble.
        """
        self.metrics.refused(skill, label, outcome)
        try:
            self.dispatcher.refused(skill, label, arguments or {}, outcome, text, caller=caller)
        except SkilldError as exc:
            self._log.error("audit_failed", tool=label, skill=skill, error=str(exc))

    async def call(
        self,
        channel: SessionChannel,
        *,
        skill: str,
        label: str,
        run: Callable[[SessionChannel], T],
        inline: Callable[[SessionChannel], T] | None = None,
        arguments: Mapping[str, Any] | None = None,
        caller: Caller,
        request_id: Any = None,
    ) -> T:
        """Run guest code for one request: the one path tools, resources and prompts take.

        Refuses while draining, waits up to ``queue_timeout_s`` for one of the skill's
        slots (its one gate, ``dispatcher.gate``; lent to the call, which takes no
        other), counts the call in flight (what :meth:`drain` waits for), runs ``run``
        on a worker thread with ``channel`` to the client, and records metrics and one
        ``tool_call`` log line (``label`` names the tool, resource or prompt).
        ``inline``, when given, is tried first on the event loop itself; when it
        raises :class:`RunOnThread` (the call could block, or needs longer than an
        inline attempt may take), ``run`` goes to the thread as above.

        Raises:
            GuestError: ``unavailable`` while draining; the guest has not run.
            SkillBusy: the skill stayed busy; the guest has not run.
            RegistryError: no such skill.
            SkilldError: whatever ``run`` raised (``RegistryError`` for unknown names).
            Exception: a bug below the seam, logged here with its traceback.
        """
        self._refuse_if_draining(skill, label, arguments, caller)
        gate = self.dispatcher.gate(skill)
        # One wait bound for the slot and the thread together.
        waited_until = time.monotonic() + self._queue_timeout_s
        try:
            with telemetry.stage("skilld.gate.wait", {"skilld.skill": skill}):
                slot = await gate.take_async(self._queue_timeout_s, caller.key)
        except SkillBusy as busy:
            self._log.warning("busy", tool=label, skill=skill, limit=gate.limit)
            self.refused(skill, label, busy.outcome, error_text(busy)[2], arguments, caller)
            raise
        try:
            # Again: drain() may have seen nothing in flight and returned while this
            # call waited for its slot. No await between here and _enter().
            self._refuse_if_draining(skill, label, arguments, caller)
            outcome = "cancelled"
            rule: str | None = None
            started = time.perf_counter()
            self._enter()
            self._running.add(channel)
            try:
                result = await self._inline_or_blocking(
                    run, inline, channel, slot, skill, caller.key, waited_until
                )
            except SkilldError as exc:
                # The error class's own word: what the audit record says, /metrics and
                # this log line say too (skilld.errors' table).
                outcome, rule = exc.outcome, exc.rule
                if isinstance(exc, SkillBusy):
                    # No worker thread took the call in time: refused like a busy gate.
                    self._log.warning("busy", tool=label, skill=skill, threads=self._workers.size)
                if exc.code == ErrorCode.NOT_PERMITTED:
                    self.metrics.denied(skill, rule or "default-deny")
                raise
            except Exception:
                outcome = SkilldError.outcome  # a bug below the seam: a fault
                self._log.exception("tool_crashed", tool=label, skill=skill)
                raise
            else:
                outcome = "ok"
                return result
            finally:
                seconds = time.perf_counter() - started
                self._running.discard(channel)
                self._leave()
                self.metrics.finished(skill, label, outcome, seconds)
                self._log.info(
                    "tool_call",
                    tool=label,
                    skill=skill,
                    caller=caller.label(),
                    outcome=outcome,
                    rule=rule,
                    ms=round(seconds * 1000, 3),
                    request_id=_logged_id(request_id),
                )
        finally:
            slot.release()

    def _refuse_if_draining(
        self, skill: str, label: str, arguments: Mapping[str, Any] | None, caller: Caller
    ) -> None:
        if self.draining:
            refusal = GuestError("unavailable", "the server is shutting down; retry elsewhere")
            self.refused(skill, label, "draining", error_text(refusal)[2], arguments, caller)
            raise refusal

    def _enter(self) -> None:
        self._in_flight += 1
        self.metrics.started()

    def _leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0 and self._idle is not None:
            self._idle.set()

    async def _inline_or_blocking(
        self,
        run: Callable[[SessionChannel], T],
        inline: Callable[[SessionChannel], T] | None,
        channel: SessionChannel,
        slot: Slot,
        skill: str,
        key: str,
        waited_until: float,
    ) -> T:
        # The call runs in the slot taken for it (lent: the dispatcher takes no second one).
        if inline is not None:
            try:
                return slot.lend(inline, channel)
            except RunOnThread:
                pass
        # The guest cannot be interrupted from outside its thread, so a cancellation
        # (the client's ``notifications/cancelled``, or shutdown) marks the channel: the
        # sandbox stops the guest at its next epoch check once the channel says so (and
        # the guest may poll ``cancelled()`` itself); the call still ends before we return.
        return await self._workers.run(
            partial(slot.lend, run, channel),
            channel.cancel,
            key=key,
            skill=skill,
            wait_s=max(0.0, waited_until - time.monotonic()),
        )


# A JSON-RPC id is the client's to choose: a string up to a request body's 4 MiB, an
# integer of thousands of digits. Each call's log line keeps at most this much of it.
_MAX_LOGGED_ID = 128


def _logged_id(request_id: Any) -> Any:
    """``request_id`` as the call's log line shows it: cut to ``_MAX_LOGGED_ID``
    characters (and ``...``) when longer, a very large integer by its size; itself
    otherwise."""
    if isinstance(request_id, int) and request_id.bit_length() > 4 * _MAX_LOGGED_ID:
        # Not its digits: past 4,300 of them str() itself refuses (ValueError).
        return f"an integer of {request_id.bit_length()} bits"
    if isinstance(request_id, str) and len(request_id) > _MAX_LOGGED_ID:
        return request_id[:_MAX_LOGGED_ID] + "..."
    return request_id
