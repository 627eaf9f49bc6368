"""The guest's way back to its MCP client, from the worker thread that runs it.

A guest call blocks its thread, so every method here is called off the event loop
(from the worker thread the call runs on, or from a thread the dispatcher starts for
a nested call) and crosses back to the loop with ``anyio.from_thread.run``.
Notifications (progress, logs) are best effort: a client that went away must not
fail the call. Requests (sampling, elicitation) block the guest until the client
answers, the call is cancelled or the timeout passes, and fail as ``GuestError``
with a WIT error code.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar, cast

import anyio
import anyio.from_thread
import anyio.lowlevel
from mcp import types
from mcp.server.connection import allowed_log_levels
from mcp.server.context import ServerRequestContext
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ValidationError

from skilld.errors import GuestError
from skilld.types import LOG_LEVEL_ALIASES
from skilld.types import LOG_LEVELS as GUEST_LOG_LEVELS

# The guest's levels (skilld.types), as the SDK's literal type.
LOG_LEVELS = cast(tuple[types.LoggingLevel, ...], GUEST_LOG_LEVELS)
_ALIASES = cast(Mapping[str, types.LoggingLevel], LOG_LEVEL_ALIASES)

T = TypeVar("T")
R = TypeVar("R", bound=BaseModel)
Ctx = ServerRequestContext[Any, Any]

LEVEL_KEY = "skilld.log_level"
DEFAULT_LEVEL: types.LoggingLevel = "info"


def normalize_level(level: str) -> types.LoggingLevel:
    """The MCP logging level a guest's level name stands for (unknown names read as ``info``)."""
    name = level.lower()
    for known in LOG_LEVELS:
        if known == name:
            return known
    return _ALIASES.get(name, "info")


KEY_META = "io.skilld/input-key"
"""A guest may name its question under this ``_meta`` key: the key of its input-required
round in the 2026-07-28 era (see ``_rounds``); dropped before a handshake-era request."""


def without_key(params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` without skilld's question key (and without an ``_meta`` left empty)."""
    body = dict(params)
    meta = body.pop("_meta", None)
    if isinstance(meta, Mapping):
        rest = {k: v for k, v in meta.items() if k != KEY_META}
        if rest:
            body["_meta"] = rest
    elif meta is not None:
        body["_meta"] = meta
    return body


def session_state(ctx: Ctx) -> dict[str, Any]:
    """Per-session scratch state, kept on the SDK's connection object.

    ``ServerRequestContext`` does not expose the connection yet (the SDK's own
    ``Context`` does, and replaces it in a later 2.x); this is the one place that
    reaches for it.
    """
    state: dict[str, Any] = ctx.session._connection.state
    return state


def modern(ctx: Ctx) -> bool:
    """True for a 2026-07-28 request (stateless; questions to the client go in rounds)."""
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


def min_level_of(ctx: Ctx) -> Callable[[], types.LoggingLevel | None]:
    """The lowest level of guest logs this request's client hears (None: no logs).

    Handshake-era sessions set it with ``logging/setLevel``; a 2026-07-28 request
    asks for logs in its own ``_meta``, and hears none without asking.
    """
    if modern(ctx):
        allowed = allowed_log_levels(ctx.protocol_version, ctx.meta)
        floor = next((lvl for lvl in LOG_LEVELS if lvl in allowed), None)
        return lambda: floor
    state = session_state(ctx)
    return lambda: state.get(LEVEL_KEY, DEFAULT_LEVEL)


def request_channel(ctx: Ctx, skill: str, request_timeout_s: float) -> SessionChannel:
    """The channel of the request ``ctx`` to its client, for a call of ``skill``."""
    return SessionChannel(
        ctx.session,
        ctx.request_id,
        skill=skill,
        min_level=min_level_of(ctx),
        request_timeout_s=request_timeout_s,
    )


class SessionChannel:
    """A :class:`skilld.types.ClientChannel` bound to one MCP request of one session.

    Args:
        session: the SDK's per-request session proxy.
        request_id: the JSON-RPC id of the call, so that messages ride its stream.
        skill: the skill id, reported as the logger name of guest logs.
        min_level: returns the session's current ``logging/setLevel`` threshold, or
            None when the request asked for no logs (2026-07-28, per request).
        request_timeout_s: how long sampling and elicitation wait for the client.
    """

    def __init__(
        self,
        session: ServerSession,
        request_id: types.RequestId | None,
        *,
        skill: str,
        min_level: Callable[[], types.LoggingLevel | None],
        request_timeout_s: float,
    ):
        self._session = session
        self._request_id = request_id
        self._skill = skill
        self._min_level = min_level
        self._timeout = request_timeout_s
        self._cancelled = threading.Event()
        self.cancel_reason: str | None = None
        # Built on the event loop; the token lets any thread reach it (the guest's
        # worker thread, or a thread the dispatcher starts for a nested call).
        self._loop = anyio.lowlevel.current_token()
        # Touched only on the event loop thread (requests run there, cancel() is called there).
        self._scopes: set[anyio.CancelScope] = set()

    # -- called on the event loop -------------------------------------------

    def cancel(self, reason: str = "client") -> None:
        """Mark the call cancelled and abandon any sampling/elicitation it waits on.

        ``reason``: ``client`` (its ``notifications/cancelled``, or its request went away)
        or ``shutdown`` (the server's drain grace ran out): kept in :attr:`cancel_reason`.
        """
        if not self._cancelled.is_set():
            self.cancel_reason = reason
        self._cancelled.set()
        for scope in list(self._scopes):
            scope.cancel()

    # -- called from the guest's worker thread ------------------------------

    def abandon_requests(self) -> None:
        """Give up the sampling and elicitation requests in flight: the call's time ran out.

        Unlike :meth:`cancel` the call is not marked cancelled (it ends at its deadline).
        """

        def run() -> None:
            for scope in list(self._scopes):
                scope.cancel()

        try:
            anyio.from_thread.run_sync(run, token=self._loop)
        # The loop is gone (the server is shutting down): nothing is in flight any more.
        except Exception:  # noqa: BLE001
            return

    def cancelled(self) -> bool:
        """True once the client cancelled this call (or the server is abandoning it)."""
        return self._cancelled.is_set()

    def progress(self, progress: float, total: float | None, message: str | None) -> None:
        """Send ``notifications/progress`` if the client gave a progress token."""
        self._notify(lambda: self._session.report_progress(progress, total, message))

    def log(self, level: str, data: Any) -> None:
        """Send ``notifications/message`` at ``level`` unless the session filters it out."""
        lvl = normalize_level(level)
        floor = self._min_level()
        # None: this request did not opt in to logs (2026-07-28 asks for it per request).
        if floor is None or LOG_LEVELS.index(lvl) < LOG_LEVELS.index(floor):
            return
        note = types.LoggingMessageNotification(
            params=types.LoggingMessageNotificationParams(level=lvl, data=data, logger=self._skill)
        )
        self._notify(lambda: self._session.send_notification(note, self._request_id))

    def sample(self, params: Mapping[str, Any]) -> Mapping[str, Any]:
        """Send ``sampling/createMessage`` and return the client's result.

        Raises:
            GuestError: ``unavailable`` when the client cannot sample or refuses,
                ``invalid-argument`` for malformed params, ``timeout``, ``cancelled``.
        """
        wanted = types.ClientCapabilities(sampling=types.SamplingCapability())
        if not self._session.check_client_capability(wanted):
            raise GuestError("unavailable", "the MCP client does not support sampling")
        try:
            request = types.CreateMessageRequest(
                params=types.CreateMessageRequestParams.model_validate(without_key(params))
            )
        except ValidationError as exc:
            raise GuestError("invalid-argument", f"bad sampling request: {exc}") from exc
        return self._request(request, types.CreateMessageResult)

    def elicit(self, params: Mapping[str, Any]) -> Mapping[str, Any]:
        """Send ``elicitation/create`` and return the client's result.

        Raises:
            GuestError: as for :meth:`sample`.
        """
        wanted = types.ClientCapabilities(elicitation=types.ElicitationCapability())
        if not self._session.check_client_capability(wanted):
            raise GuestError("unavailable", "the MCP client does not support elicitation")
        body = without_key(params)
        try:
            elicit_params: types.ElicitRequestFormParams | types.ElicitRequestURLParams
            if body.get("mode") == "url":
                elicit_params = types.ElicitRequestURLParams.model_validate(body)
            else:
                elicit_params = types.ElicitRequestFormParams.model_validate(body)
        except ValidationError as exc:
            raise GuestError("invalid-argument", f"bad elicitation request: {exc}") from exc
        return self._request(types.ElicitRequest(params=elicit_params), types.ElicitResult)

    def roots(self) -> Mapping[str, Any]:
        """Send ``roots/list`` and return the client's result.

        Raises:
            GuestError: as for :meth:`sample`.
        """
        wanted = types.ClientCapabilities(roots=types.RootsCapability())
        if not self._session.check_client_capability(wanted):
            raise GuestError("unavailable", "the MCP client does not support roots")
        return self._request(types.ListRootsRequest(), types.ListRootsResult)

    def ask(self, requests: Mapping[str, tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
        """Several questions, one after the other (a handshake-era client has no rounds).

        Raises:
            GuestError: as for :meth:`sample`, at the first that fails.
        """
        answers: dict[str, Any] = {}
        for key, (method, params) in requests.items():
            if method == "roots/list":
                answers[key] = dict(self.roots())
            elif method == "sampling/createMessage":
                answers[key] = dict(self.sample(params))
            else:
                answers[key] = dict(self.elicit(params))
        return answers

    # -- crossing to the loop -----------------------------------------------

    def _notify(self, send: Callable[[], Awaitable[None]]) -> None:
        async def run() -> None:
            await send()

        try:
            anyio.from_thread.run(run, token=self._loop)
        # A notification the client can no longer receive (closed stream, server
        # shutting down) must not fail the guest's call: drop it.
        except Exception:  # noqa: BLE001
            return

    def _request(self, request: types.ServerRequest, result_type: type[R]) -> dict[str, Any]:
        if self._cancelled.is_set():
            raise GuestError("cancelled", "the client cancelled this call")
        metadata = ServerMessageMetadata(related_request_id=self._request_id)

        async def run() -> R | None:
            with anyio.CancelScope() as scope:
                self._scopes.add(scope)
                try:
                    if self._cancelled.is_set():
                        scope.cancel()
                    with anyio.fail_after(self._timeout):
                        return await self._session.send_request(
                            request, result_type, metadata=metadata
                        )
                finally:
                    self._scopes.discard(scope)
            return None

        try:
            result = anyio.from_thread.run(run, token=self._loop)
        except TimeoutError as exc:
            raise GuestError(
                "timeout", f"the client did not answer within {self._timeout:g} s"
            ) from exc
        except MCPError as exc:
            raise GuestError(
                "unavailable", f"the client answered with an error: {exc.message}"
            ) from exc
        except ValidationError as exc:
            raise GuestError("internal", f"the client's answer is malformed: {exc}") from exc
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, RuntimeError) as exc:
            raise GuestError("unavailable", "the MCP client is gone") from exc
        if result is None:
            raise GuestError("cancelled", "the client cancelled this call")
        return result.model_dump(by_alias=True, mode="json", exclude_none=True)
