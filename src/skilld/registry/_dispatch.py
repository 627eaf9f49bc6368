"""Dispatch: the registry's part of a call (hops 2 and 5 of the one call path, told in
``skilld/call.py``'s docstring): a tool name to (skill, method), the call's context and
slot, its backend, and its one audit record with the error class's own outcome.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

from skilld import telemetry
from skilld.audit import CallRecorder
from skilld.call import Call, CallContext, Inline, NullChannel, RemoteInvoker
from skilld.errors import (
    CallCancelled,
    DeadlineExceeded,
    ErrorCode,
    GuestError,
    HostCallError,
    RegistryError,
    RunOnThread,
    ServerShutdown,
    SkilldError,
)
from skilld.registry._audit import AuditTrail, audited
from skilld.registry._catalogue import Catalogue, SkillEntry
from skilld.registry._contract import LOCAL, AnswersInline
from skilld.types import AuditSink, Caller, CallOutput, ClientChannel, Decision

T = TypeVar("T")


@runtime_checkable
class CancelReason(Protocol):
    """A channel that says why it was cancelled (``client``, or ``shutdown``: the server's
    drain grace ran out; None while not cancelled)."""

    cancel_reason: str | None


@runtime_checkable
class InvokeChecks(Protocol):
    """The typed ``invoke`` questions a compiled checker answers (``SkillPermissions``);
    a checker without them is asked the generic ``check("invoke", ...)``."""

    def check_invoke(self, callee: str, depth: int = 1, chain: Sequence[str] = ()) -> Decision:
        """May this skill call ``callee`` at ``depth`` (1: direct), past ``chain``?"""
        ...

    def check_remote_caller(self, node: str, caller: str) -> Decision:
        """May skill ``caller`` of cluster node ``node`` invoke this skill?"""
        ...


class Registry(Catalogue):
    """Skills by id, tools by name; implements the Dispatcher contract (see the module).

    Args:
        audit: where one record per call goes (``None``: nowhere).
    """

    def __init__(self, audit: AuditSink | None = None):
        super().__init__()
        self._trail = AuditTrail(audit)

    def emit_audit(self, record: dict[str, Any]) -> None:
        """Send one record that is not a call's (an MCP task's lifecycle) to the audit sink.

        Raises:
            AuditError: the sink could not record.
        """
        self._trail.emit(record)

    def call(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        channel: ClientChannel,
        *,
        caller: Caller = LOCAL,
    ) -> CallOutput:
        """Run one tool call to the end (see the module docstring).

        Arguments are not checked against the tool's input schema here: the MCP
        layer does that before it calls (a per-skill tool's schema holds each
        method's parameters, see :func:`per_skill_schema`).

        Raises:
            RegistryError: no such tool.
            UsageError: a per-skill tool's ``args`` is not an object.
            GuestError, GuestFault: the guest's failure, audited.
        """
        sid, method, args = self.resolve(tool, arguments)
        return self.call_method(Call(sid, method, args, channel, tool=tool, caller=caller))

    def call_inline(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        channel: ClientChannel,
        budget_s: float,
        *,
        caller: Caller = LOCAL,
    ) -> CallOutput:
        """Try the call on this thread without blocking it for more than about ``budget_s``.

        For the MCP server's event loop: a quick guest that needs no blocking host
        call finishes here, saving the hand-off to a worker thread and back. Only a
        backend that runs no guest code answers (delegate's ``kit_list``); the attempt
        gives up with :class:`RunOnThread`, unaudited and unseen and before any guest
        code runs, for everything else and when the skill has no free slot; the caller
        then runs :meth:`call` on a worker thread, once.

        Raises:
            RunOnThread: as above.
            RegistryError, UsageError, GuestError, GuestFault: as for :meth:`call`.
        """
        sid, method, args = self.resolve(tool, arguments)
        return self.call_method(Call(sid, method, args, channel, caller=caller, inline_s=budget_s))

    def call_method(self, call: Call) -> CallOutput:
        """Run ``call`` (a method of a skill, named directly: tools, ``invoke``, a routed
        call, ``skilld call``) to the end.

        ``call.inline_s`` makes it an inline attempt (see :meth:`call_inline`; a routed
        call from another node of a cluster is tried inline the same way);
        ``call.remote`` makes it an ``invoke`` routed from another node of a cluster, to
        which the callee's own policy must consent.

        Raises:
            RegistryError: no such skill.
            GuestError, GuestFault: the guest's failure, audited; ``not-permitted``
                (audited) when ``call.remote`` has no consent.
            RunOnThread: an inline attempt gave up (nothing audited).
        """
        entry = self._skills.get(call.skill)
        if entry is None:
            raise RegistryError(f"no skill named '{call.skill}'")
        component = entry.component
        if call.inline_s is not None and not (
            isinstance(component, AnswersInline) and component.answers_inline
        ):
            # It would give up before its guest runs: give up before the call is set up.
            raise RunOnThread
        if call.under_caller_rules:
            self._permit(entry, call)
        args_json = json.dumps(call.arguments, separators=(",", ":"), sort_keys=True)
        remote, method = call.remote, call.method

        def guest(ctx: CallContext) -> CallOutput:
            if remote is not None:
                _consent(entry, remote, ctx)
            return entry.component.call(method, args_json, ctx)

        return self._run(
            entry,
            method,
            args_json,
            call.channel,
            guest,
            caller=call.caller,
            depth=call.depth,
            chain=call.chain,
            inline=None if call.inline_s is None else Inline.for_s(call.inline_s),
            deadline=call.deadline,
        )

    def _permit(self, entry: SkillEntry, call: Call) -> None:
        """Refuse ``call`` unless this node's caller rules let its caller call the tool.

        Every entry comes through here: a call routed from another node of a cluster is
        checked against this node's own rules for the caller its entry node verified (its
        principal), whatever the entry node decided. A method no tool exposes is named by
        no caller rule (only nested calls and ``skilld delegate`` reach it) and passes.

        Raises:
            GuestError: ``not-permitted``, naming the rule that refused (``default-deny``
                when none allows) and the caller; audited as refused with the caller.
        """
        tool = call.tool or self.tool_of(call.skill, call.method)
        if tool is None:
            return
        try:
            self.view(call.caller).permit("tool", tool, call.skill)
        except GuestError as exc:
            self._trail.refused(
                call.skill,
                entry.spec.version,
                call.method,
                call.arguments,
                exc.code,
                str(exc),
                call.caller,
            )
            raise

    def _run(
        self,
        entry: SkillEntry,
        method: str,
        input_text: str,
        channel: ClientChannel | None,
        guest: Callable[[CallContext], T],
        *,
        caller: Caller,
        depth: int = 0,
        chain: tuple[str, ...] = (),
        target: str | None = None,
        inline: Inline | None = None,
        deadline: float | None = None,
    ) -> T:
        """The one way guest code runs: a slot of the skill, a fresh context, one audit record.

        Tool calls, ``invoke``, resource reads and prompts all come through here.

        Raises:
            SkillBusy: no slot freed up in time.
            GuestError: the guest's own.
            GuestFault: the guest trapped, ran out of time, memory or stack, or was cancelled.
        """
        skill_id = entry.spec.id
        recorder = CallRecorder(
            skill_id,
            entry.spec.version,
            method,
            caller=caller,
            input=input_text,
            depth=depth,
            target=target,
        )
        ctx = CallContext(
            skill_id=skill_id,
            recorder=recorder,
            limits=entry.limits,
            # The sandbox stops the guest once this channel says the client cancelled.
            channel=channel or NullChannel(),
            kv=entry.kv,
            checker=entry.checker,
            invoker=lambda callee, m, a, d: self._invoke(skill_id, callee, m, a, d, ctx),
            services=entry.services,
            depth=depth,
            chain=chain,
            inline=inline,
            caller=caller,
            # A nested call ends by its caller's deadline if that comes first; others
            # get theirs when the guest starts (instantiation included).
            deadline=None
            if deadline is None
            else min(deadline, time.monotonic() + entry.limits.timeout_ms / 1000),
        )
        # The started record goes out (flushed) before the first state write is made,
        # so a write that completed just before a crash names its call (docs/runtime.md).
        ctx.before_first_write = lambda: self._trail.emit(recorder.started())
        outcome: str = "ok"
        out: T | None = None
        error: Exception | None = None
        # A nested call (invoke) never waits for a slot: waiting inside a call chain
        # that already holds slots of the same skill could deadlock it. Nor does an
        # inline attempt: waiting is for a thread, not the event loop. A call the MCP
        # layer runs takes the slot it was lent (skilld.call.CallGate).
        wait = entry.limits.timeout_ms / 1000 if depth == 0 and inline is None else 0
        # Slots are shared out per principal, nested calls included: a nested call holds
        # a slot of the callee's gate, which its outer call's slot (of another gate, or
        # of this one and already counted) does not cover. Counted for nobody, one
        # caller's calls of a skill that invokes this one took all of this one's slots.
        try:
            with telemetry.stage("skilld.gate.wait", {"skilld.skill": skill_id}):
                slot = entry.gate.take(wait, ctx.channel.cancelled, caller.key)
        except SkilldError as exc:  # SkillBusy, or CallCancelled while it waited
            if inline is not None:
                inline.give_up()
            outcome, error = exc.outcome, exc
        else:
            try:
                with telemetry.call_span(
                    skill_id,
                    method,
                    caller=caller,
                    depth=depth,
                    arguments=input_text,
                    record=entry.record_arguments,
                ) as span:
                    out = guest(ctx)
                    span.result(out)
            except SkilldError as exc:
                outcome, error = exc.outcome, exc
                # The server's drain ended it (skilld.mcp), not the client: say so, here
                # and only here.
                if (
                    isinstance(exc, CallCancelled)
                    and isinstance(ctx.channel, CancelReason)
                    and ctx.channel.cancel_reason == "shutdown"
                ):
                    error = ServerShutdown(
                        f"the server shut down: the call to {skill_id} was still running when "
                        "its drain grace ran out; retry elsewhere"
                    )
                    error.__cause__ = exc
                    outcome = error.outcome
            except Exception as exc:  # noqa: BLE001 - a bug below the seam: audited, raised
                outcome, error = SkilldError.outcome, exc
            finally:
                slot.release()
                # The invoker and hook closures refer back to ctx; without them the
                # context is freed at once rather than by the garbage collector.
                ctx.invoker = None
                ctx.before_first_write = None
        self._trail.emit(
            recorder.finish(
                outcome, output=None if error is not None else audited(out), error=error
            )
        )
        if error is not None:
            raise error
        assert out is not None
        return out

    def _invoke(
        self, caller: str, callee: str, method: str, args_json: str, depth: int, ctx: CallContext
    ) -> str:
        checker = self._skills[caller].checker
        decision = None
        if isinstance(checker, InvokeChecks):
            # The compiled checker knows depth limits and cycles; a plain one only the edge.
            decision = ctx.record(checker.check_invoke(callee, depth, ctx.chain))
        elif checker is not None:
            decision = ctx.record(checker.check("invoke", "call", callee))
        if decision is None or not decision.allowed:
            rule = decision.rule if decision else "default-deny"
            reason = decision.reason if decision else "no policy allows invoke"
            raise HostCallError(
                ErrorCode.NOT_PERMITTED,
                f"'{caller}' may not invoke '{callee}': {reason}",
                rule=rule,
            )
        try:
            args = json.loads(args_json)
        except json.JSONDecodeError as exc:
            raise HostCallError(
                "invalid-argument", f"invoke arguments are not JSON: {exc}"
            ) from exc
        try:
            out = self.call_method(
                Call(
                    callee,
                    method,
                    args,
                    ctx.channel,
                    caller=ctx.caller.as_skill(caller),
                    depth=depth,
                    chain=(*ctx.chain, caller),
                    deadline=ctx.deadline,
                )
            )
        except RegistryError as exc:
            raise HostCallError("not-found", exc.message) from exc
        except GuestError as exc:
            raise HostCallError(exc.code, exc.message, rule=exc.rule) from exc
        except DeadlineExceeded as exc:
            raise HostCallError(
                "timeout",
                f"'{callee}' was stopped at its deadline (its own wall time or what was left "
                f"of '{caller}''s, whichever came first)",
            ) from exc
        except CallCancelled as exc:
            raise HostCallError("cancelled", f"'{callee}' was cancelled") from exc
        except SkilldError as exc:
            raise HostCallError("internal", f"'{callee}' failed: {exc}") from exc
        return json.dumps(out.value)

    def refused(
        self,
        skill: str,
        label: str,
        arguments: Mapping[str, Any],
        outcome: str,
        error: str,
        *,
        caller: Caller = LOCAL,
    ) -> None:
        """Audit a request the MCP layer refused before any guest code ran.

        ``label`` is the tool's name, ``resource:URI`` or ``prompt:NAME``; ``outcome``
        says why (``invalid-argument``, ``busy``, ``draining``). The record has the
        shape of a call's, with ``refused: true``, no output and no decisions; its
        method is the tool's method where the tool names one, else ``label``.

        Raises:
            AuditError: the sink could not record.
        """
        method = label
        found = self._tools.get(label)
        if found is not None:
            method = found[2] if found[2] is not None else str(arguments.get("method", ""))
        entry = self._skills.get(skill)
        version = entry.spec.version if entry is not None else None
        self._trail.refused(skill, version, method, arguments, outcome, error, caller)

    def read_resource(
        self, uri: str, channel: ClientChannel, *, caller: Caller = LOCAL
    ) -> Sequence[CallOutput]:
        """Read a resource from the skill that serves it, as a call: slot, context, audit.

        Raises:
            RegistryError: no skill serves ``uri``.
            GuestError, GuestFault: as for :meth:`call`, audited.
        """
        entry = self._resource_owner(uri)
        return self._run(
            entry,
            "read-resource",
            uri,
            channel,
            lambda ctx: entry.component.read_resource(uri, ctx),
            caller=caller,
            target=uri,
        )

    def get_prompt(
        self,
        name: str,
        arguments: Mapping[str, Any],
        channel: ClientChannel,
        *,
        caller: Caller = LOCAL,
    ) -> Sequence[Mapping[str, Any]]:
        """Render a prompt from the skill that serves it, as a call: slot, context, audit.

        Raises:
            RegistryError: no skill serves the prompt.
            GuestError, GuestFault: as for :meth:`call`, audited.
        """
        entry = self._prompt_owner(name)
        args_json = json.dumps(dict(arguments), separators=(",", ":"), sort_keys=True)
        return self._run(
            entry,
            "get-prompt",
            args_json,
            channel,
            lambda ctx: entry.component.get_prompt(name, args_json, ctx),
            caller=caller,
            target=name,
        )


def _consent(entry: SkillEntry, remote: RemoteInvoker, ctx: CallContext) -> None:
    """This node's consent to an ``invoke`` of ``entry`` by a skill of another cluster node.

    Raises:
        GuestError: ``not-permitted`` (the decision is recorded for the audit).
    """
    node, caller = remote.node, remote.skill
    checker = entry.checker
    decision = None
    if isinstance(checker, InvokeChecks):
        decision = checker.check_remote_caller(node, caller)
    elif checker is not None:
        # A plain checker answers only the generic question, about the text NODE/SKILL.
        decision = checker.check("invoke", "called-by", f"{node}/{caller}")
    if decision is not None:
        ctx.record(decision)
    if decision is None or not decision.allowed:
        reason = decision.reason if decision else "no policy allows invoke"
        raise GuestError(
            ErrorCode.NOT_PERMITTED,
            f"'{caller}' of node {node} may not invoke '{entry.spec.id}': {reason}",
            rule=decision.rule if decision else "default-deny",
            location=entry.spec.id,
        )
