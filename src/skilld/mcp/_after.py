"""Work that waits for the HTTP response of the request that asked for it.

A handler's answer is serialized and written after the handler returns, by the SDK's
transport, in the task of the HTTP request that carried it (the handler runs in a
task of its own that inherits that request's context). :class:`AfterResponse` wraps
an ASGI app: while a request is served, :func:`after_response` hands it what to run
once that request's response has been written, or has failed, or the client left.
Outside an HTTP request (stdio, tests in process) there is nothing to wait for and
:func:`after_response` says so.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send


class _Pending:
    """What runs when one request's response is done; ``done`` once it ran."""

    __slots__ = ("done", "fns")

    def __init__(self) -> None:
        self.fns: list[Callable[[], None]] = []
        self.done = False

    def run(self) -> None:
        self.done = True
        while self.fns:
            self.fns.pop()()


_pending: contextvars.ContextVar[_Pending | None] = contextvars.ContextVar(
    "skilld_after_response", default=None
)


def after_response(fn: Callable[[], None]) -> bool:
    """Run ``fn`` once the current HTTP request's response is done; False (``fn`` not
    taken: run it yourself) when no HTTP request is being served here or its response
    is done already (a legacy SSE ``POST`` ends at 202, before its answer exists)."""
    pending = _pending.get()
    if pending is None or pending.done:
        return False
    pending.fns.append(fn)
    return True


class AfterResponse:
    """Runs what :func:`after_response` was given when the request's app returns."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        pending = _Pending()
        token = _pending.set(pending)
        try:
            await self._app(scope, receive, send)
        finally:
            _pending.reset(token)
            pending.run()
