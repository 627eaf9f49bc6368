"""Who sent an MCP request: the one place the adapter learns its :class:`~skilld.types.Caller`.

Everything downstream (the ring, tasks, rounds, the audit, the worker threads' fair
share) reads the caller this returns and never looks at a header again.
"""

from __future__ import annotations

from typing import Any

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from starlette.requests import HTTPConnection

from skilld.types import Caller

STDIO = Caller.local("stdio")


def caller_of(ctx: Any) -> Caller:
    """The caller of the request ``ctx`` (an SDK ``ServerRequestContext``).

    Over HTTP the transport's authentication has already run: a request it let through
    with one of the operator's bearer tokens is that token's caller (named by a short
    stable digest of the token, the principal ``mcp._http.TokenVerifier`` gives it);
    without authentication every client is the one anonymous caller. A request with no
    HTTP request behind it comes from the local user on stdio. The spelling of a header
    never matters: ``Bearer``/``bearer`` with the same token are one caller.
    """
    request = ctx.request
    if not isinstance(request, HTTPConnection):
        return STDIO
    user = request.scope.get("user")
    if isinstance(user, AuthenticatedUser):
        return Caller.token(user.access_token.client_id.removeprefix("token-"))
    return Caller.anonymous()
