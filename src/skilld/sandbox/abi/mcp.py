"""``mcp``: the guest talks to the MCP client of its call through the channel.

Progress, logs and the cancellation flag are always allowed; sampling and
elicitation reach the client only when the policy lists them under ``mcp.client``
(``check("mcp", "sample" | "elicit", SKILL)``).
"""

from __future__ import annotations

import json
from typing import Any

from skilld.errors import GuestError, HostCallError
from skilld.sandbox._context import CallContext
from skilld.sandbox.abi import Functions, decide


def progress(ctx: CallContext, value: float, total: float | None, message: str | None) -> None:
    """Forward a progress notification."""
    ctx.channel.progress(value, total, message)


def notify_log(ctx: CallContext, level: str, data: str) -> None:
    """Forward a log message to the client."""
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
    try:
        fn = ctx.channel.sample if kind == "sample" else ctx.channel.elicit
        return json.dumps(dict(fn(body)))
    except GuestError as exc:
        raise HostCallError(exc.code, exc.message) from exc


def sample(ctx: CallContext, params: str) -> str:
    """A sampling request to the client, when the policy allows it.

    Raises:
        HostCallError: ``not-permitted`` without ``sample`` in ``mcp.client``.
    """
    return _ask("sample", ctx, params)


def elicit(ctx: CallContext, params: str) -> str:
    """An elicitation request to the client, when the policy allows it.

    Raises:
        HostCallError: ``not-permitted`` without ``elicit`` in ``mcp.client``.
    """
    return _ask("elicit", ctx, params)


def cancelled(ctx: CallContext) -> bool:
    """Whether the client cancelled this call."""
    return ctx.channel.cancelled()


FUNCTIONS: Functions = {
    "progress": (progress, "plain"),
    "notify-log": (notify_log, "plain"),
    "sample": (sample, "result"),
    "elicit": (elicit, "result"),
    "cancelled": (cancelled, "plain"),
}
