"""Host implementations of the ``skilld:skill`` imports, one module per capability.

Each module exposes ``FUNCTIONS``: WIT function name → (implementation, kind),
where an implementation takes the current :class:`~skilld.call.CallContext`
and plain Python arguments (records arrive as dicts with snake_case keys) and
returns plain Python values (records as dicts), raising
:class:`~skilld.errors.HostCallError` to refuse. ``kind`` says how the WIT result
is shaped: ``plain`` (no result), ``result`` or ``result-tagged`` (the ok type is a
record, so the value must be tagged). No module here imports wasmtime.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from skilld.errors import ErrorCode, HostCallError

if TYPE_CHECKING:
    from skilld.call import CallContext
    from skilld.types import Decision, PermissionChecker

# A typed permission question: ``lambda c: c.check_argv(argv)``.
Question = Callable[["PermissionChecker"], "Decision"]

Kind = Literal["plain", "result", "result-tagged"]
HostFn = Callable[..., Any]
Functions = dict[str, tuple[HostFn, Kind]]


def url_question(url: str, method: str) -> Question:
    """``check_url(url, method)``: the typed question of an HTTP request (``http``, the proxy)."""
    return lambda checker: checker.check_url(url, method)


def ask(
    ctx: CallContext,
    capability: str,
    action: str,
    target: str,
    question: Question | None = None,
) -> Decision:
    """Ask the skill's tables and record the decision for the audit, allowed or not.

    ``question`` asks it typed (``check_path``, ``check_url``, ``check_argv``,
    ``check_address``, ``check_tcp``); without it the plain ``check(capability, action,
    target)`` is asked (a question about one name: kv, env, invoke, shell's cwd, ...). ``target``
    names the question where no policy applies to the skill at all.

    For host functions that act on a denial themselves (``fs.glob`` leaves refused
    matches out); the others use :func:`decide`.
    """
    from skilld.types import Decision

    if ctx.checker is None:
        decision = Decision(
            False, capability, action, target, "default-deny", "no policy applies to this skill"
        )
    elif question is not None:
        decision = question(ctx.checker)
    else:
        decision = ctx.checker.check(capability, action, target)
    return ctx.record(decision)


def decide(
    ctx: CallContext,
    capability: str,
    action: str,
    target: str,
    shown: str | None = None,
    question: Question | None = None,
) -> Decision:
    """Ask the skill's tables (typed with ``question``, see :func:`ask`); record the
    decision; refuse with its rule when denied.

    Raises:
        HostCallError: ``not-permitted`` naming the rule and the reason.
    """
    decision = ask(ctx, capability, action, target, question)
    if not decision.allowed:
        raise HostCallError(
            ErrorCode.NOT_PERMITTED,
            f"{capability}.{action} {shown or target} denied: {decision.reason}",
            rule=decision.rule,
        )
    return decision


def rule_settings(ctx: CallContext, decision: Decision) -> Mapping[str, Any]:
    """The deciding rule's settings (caps, timeouts, env), or ``{}`` when the checker has none.

    Only a checker built from compiled tables knows its rules (``.rule(rule_id)``);
    a plain :class:`~skilld.types.PermissionChecker` leaves the host defaults in force.
    """
    lookup = getattr(ctx.checker, "rule", None)
    if lookup is None:
        return {}
    found = lookup(decision.rule)
    return found if isinstance(found, Mapping) else {}
