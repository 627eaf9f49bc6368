"""``mcp``: the guest talks to the MCP client of its call through the channel.

Progress, logs and the cancellation flag are always allowed; sampling, elicitation
and the client's roots reach the client only when the policy lists them under
``mcp.client`` (``check("mcp", "sample" | "elicit" | "roots", SKILL)``); ``ask``
puts several of them to the client at once, each one checked.

What the protocol forbids is refused here, at the boundary, not passed on: a
progress or total that is not a finite number (JSON has no NaN, and the client
would see ``null``), and a log level that is not one of RFC 5424's (or a known
alias). Both are dropped and recorded as refused decisions for the audit.

A sampling or elicitation request waits for the client no longer than the call's
deadline, and gives up within a slice when the client cancels the call: the
request runs on a helper thread while the guest's thread waits in slices
(``CallContext.waits``); a request given up is abandoned on the channel.
"""

from __future__ import annotations

import json
import math
from typing import Any

from skilld.call import CallContext
from skilld.errors import GuestError, HostCallError
from skilld.sandbox.abi import Functions, decide
from skilld.types import LOG_LEVEL_ALIASES, LOG_LEVELS, Decision

BAD_VALUE_RULE = "mcp.bad-value"
_LEVELS = frozenset(LOG_LEVELS) | frozenset(LOG_LEVEL_ALIASES)


def _refuse(ctx: CallContext, action: str, target: str, reason: str) -> None:
    ctx.record(Decision(False, "mcp", action, target, BAD_VALUE_RULE, reason))


def progress(ctx: CallContext, value: float, total: float | None, message: str | None) -> None:
    """Forward a progress notification (refused unless progress and total are finite)."""
    if not math.isfinite(value) or (total is not None and not math.isfinite(total)):
        _refuse(
            ctx, "progress", f"{value!r}/{total!r}", "progress and total must be finite numbers"
        )
        return
    ctx.channel.progress(value, total, message)


def notify_log(ctx: CallContext, level: str, data: str) -> None:
    """Forward a log message to the client (refused for an unknown level)."""
    if level.lower() not in _LEVELS:
        _refuse(
            ctx,
            "notify-log",
            level[:64],
            f"unknown log level; use one of {', '.join(LOG_LEVELS)}",
        )
        return
    try:
        parsed: Any = json.loads(data)
    except json.JSONDecodeError:
        parsed = data
    ctx.channel.log(level, parsed)


def _ask(kind: str, ctx: CallContext, params: str) -> str:
    decide(ctx, "mcp", kind, ctx.skill_id, shown=f"for skill '{ctx.skill_id}'")
    try:
        body = json.loads(params)
    except json.JSONDecodeError as exc:
        raise HostCallError("invalid-argument", f"{kind} params are not JSON: {exc}") from exc
    fn = ctx.channel.sample if kind == "sample" else ctx.channel.elicit
    return _relay(ctx, kind, lambda: dict(fn(body)))


def sample(ctx: CallContext, params: str) -> str:
    """A sampling request to the client, when the policy allows it.

    Raises:
        HostCallError: ``not-permitted`` without ``sample`` in ``mcp.client``;
            ``timeout`` at the call's deadline, ``cancelled``; the client's refusal.
    """
    return _ask("sample", ctx, params)


def elicit(ctx: CallContext, params: str) -> str:
    """An elicitation request to the client, when the policy allows it.

    Raises:
        HostCallError: as for :func:`sample`.
    """
    return _ask("elicit", ctx, params)


_KINDS = {
    "elicitation/create": "elicit",
    "sampling/createMessage": "sample",
    "roots/list": "roots",
}


def _channel_roots(ctx: CallContext) -> Any:
    ask = getattr(ctx.channel, "roots", None)
    if ask is None:
        raise HostCallError("unavailable", "this call's client channel cannot list roots")
    return ask


def _relay(ctx: CallContext, kind: str, fn: Any) -> str:
    try:
        return json.dumps(ctx.off_thread(f"mcp.{kind}", fn))
    except GuestError as exc:
        raise HostCallError(exc.code, exc.message) from exc
    except HostCallError as exc:
        if exc.code in ("timeout", "cancelled"):
            # Do not leave the request waiting on the client for its own timeout.
            abandon = getattr(ctx.channel, "abandon_requests", None)
            if abandon is not None:
                abandon()
        raise


def roots(ctx: CallContext) -> str:
    """The client's roots (``roots/list``), when the policy lists ``roots`` in ``mcp.client``.

    Raises:
        HostCallError: as for :func:`sample`.
    """
    decide(ctx, "mcp", "roots", ctx.skill_id, shown=f"for skill '{ctx.skill_id}'")
    fn = _channel_roots(ctx)
    return _relay(ctx, "roots", lambda: dict(fn()))


def ask(ctx: CallContext, requests: str) -> str:
    """Several questions to the client at once; each is checked against ``mcp.client``.

    A channel that can ask them together (a 2026-07-28 request: one input-required
    round) does; any other asks them one after the other.

    Raises:
        HostCallError: ``invalid-argument`` for a malformed request or an unknown
            method; ``not-permitted`` when any one is not granted (none is sent);
            as for :func:`sample` otherwise.
    """
    try:
        body = json.loads(requests)
    except json.JSONDecodeError as exc:
        raise HostCallError("invalid-argument", f"ask requests are not JSON: {exc}") from exc
    if not isinstance(body, dict) or not body:
        raise HostCallError("invalid-argument", "ask takes a non-empty object of key -> request")
    wanted: dict[str, tuple[str, dict[str, Any]]] = {}
    for key, request in body.items():
        method = request.get("method") if isinstance(request, dict) else None
        params = request.get("params", {}) if isinstance(request, dict) else None
        if method not in _KINDS or not isinstance(params, dict):
            raise HostCallError(
                "invalid-argument",
                f"ask[{key!r}] must be {{method, params}} with method one of {', '.join(_KINDS)}",
            )
        wanted[key] = (str(method), params)
    for kind in sorted({_KINDS[m] for m, _p in wanted.values()}):
        decide(ctx, "mcp", kind, ctx.skill_id, shown=f"for skill '{ctx.skill_id}'")
    together = getattr(ctx.channel, "ask", None)

    def one_by_one() -> dict[str, Any]:
        answers: dict[str, Any] = {}
        for key, (method, params) in wanted.items():
            if method == "roots/list":
                answers[key] = dict(_channel_roots(ctx)())
            elif method == "sampling/createMessage":
                answers[key] = dict(ctx.channel.sample(params))
            else:
                answers[key] = dict(ctx.channel.elicit(params))
        return answers

    fn = (lambda: dict(together(wanted))) if together is not None else one_by_one
    return _relay(ctx, "ask", fn)


def cancelled(ctx: CallContext) -> bool:
    """Whether the client cancelled this call."""
    return ctx.channel.cancelled()


FUNCTIONS: Functions = {
    "progress": (progress, "plain"),
    "notify-log": (notify_log, "plain"),
    "sample": (sample, "result"),
    "elicit": (elicit, "result"),
    "roots": (roots, "result"),
    "ask": (ask, "result"),
    "cancelled": (cancelled, "plain"),
}
