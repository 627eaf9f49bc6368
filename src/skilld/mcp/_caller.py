"""Who sent an MCP request: the one place the adapter learns its :class:`~skilld.types.Caller`.

Everything downstream (the ring, tasks, rounds, the audit, the worker threads' fair
share) reads the caller this returns and never looks at a header again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcp import types
from mcp.shared.exceptions import MCPError

from skilld.errors import GuestError
from skilld.mcp import _auth
from skilld.mcp._relay import ForwardedSession, is_forwarded
from skilld.mcp._ring import Ring
from skilld.registry import TargetKind
from skilld.types import Caller


def caller_of(ctx: Any) -> Caller:
    """The caller of the request ``ctx`` (an SDK ``ServerRequestContext``).

    The transport's authentication has already run; :func:`skilld.mcp._auth.caller_of`
    says what its verified credential makes the request (an OAuth principal, a named
    token, the anonymous client of a server that authenticates no one, or the local
    user on stdio), never from how a header was spelled. A round's retry another entry
    node forwarded is its entry node's caller (carried in the relay message).
    """
    if isinstance(ctx.session, ForwardedSession):
        # A retry another entry node forwarded: the caller that node verified.
        return ctx.session.caller
    return _auth.caller_of(ctx.request)


def refused_error(refusal: GuestError) -> MCPError:
    """A request the caller rules refused (``resources/read``, ``prompts/get``,
    ``resources/subscribe``, ``skills/get``): JSON-RPC invalid params, the code and the
    rule in the message (as a refused tool call's text has them) and in ``data``."""
    return MCPError(
        types.INVALID_PARAMS,
        f"[{refusal.code}, rule {refusal.rule}] {refusal.message}",
        data={"code": refusal.code, "rule": refusal.rule},
    )


def not_permitted(
    ring: Ring,
    ctx: Any,
    caller: Caller,
    kind: TargetKind,
    name: str,
    skill: str,
    label: str,
    arguments: Mapping[str, Any],
) -> GuestError | None:
    """The refusal (counted and audited under ``label``, :meth:`Ring.denied`) when the
    request ``ctx``'s ``caller`` (:func:`caller_of`) may not call the ``kind`` (tool,
    resource, prompt) named ``name``; else None.

    Asked before a request is validated and before a task or a round exists; the ring's
    dispatcher asks the same rules again for a tool call (``Registry._permit``). A retry
    another entry node forwarded was checked there, against its own caller.
    """
    if is_forwarded(ctx):
        return None
    try:
        ring.dispatcher.view(caller).permit(kind, name, skill)
    except GuestError as exc:
        ring.denied(exc, skill, label, arguments, caller)
        return exc
    return None
