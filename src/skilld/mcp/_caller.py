"""Who sent an MCP request, as the one typed answer (:class:`skilld.types.Caller`).

The transports leave the HTTP request on the request context; the authentication
middleware leaves the verified credential on it. A request with no HTTP request behind it
came over stdio (or an in-process client): the local user. Everything downstream asks
``caller.principal``, never a header.
"""

from __future__ import annotations

from typing import Any

from mcp import types
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from starlette.requests import Request

from skilld.errors import GuestError
from skilld.types import Caller


def caller_of(ctx: ServerRequestContext[Any, Any]) -> Caller:
    """The caller of the request ``ctx``: a token's holder, an anonymous HTTP client (a
    server that authenticates no one), or the local user (stdio)."""
    request = ctx.request
    if not isinstance(request, Request):
        return Caller.local("stdio")
    user = request.scope.get("user")
    if isinstance(user, AuthenticatedUser):
        token = user.access_token
        return Caller.token(token.client_id, frozenset(token.scopes))
    return Caller.anonymous()


def refused_error(refusal: GuestError) -> MCPError:
    """A request the caller rules refused (``resources/read``, ``prompts/get``,
    ``resources/subscribe``, ``skills/get``): JSON-RPC invalid params, the code and the
    rule in the message (as a refused tool call's text has them) and in ``data``."""
    return MCPError(
        types.INVALID_PARAMS,
        f"[{refusal.code}, rule {refusal.rule}] {refusal.message}",
        data={"code": refusal.code, "rule": refusal.rule},
    )
