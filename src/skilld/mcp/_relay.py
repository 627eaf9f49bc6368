"""Retries of input-required rounds between a cluster's entry nodes.

A 2026-07-28 client behind a round-robin balancer may send a round's retry to another
entry node than the one whose guest asked. That node's ``RequestStateBoundary`` opens the
state (a cluster's entry nodes share its key), finds the call parked on another node,
and the hook :func:`forwarder` makes sends the retry there through the cluster
(:class:`~skilld.mcp._rounds.RoundPeers`: the signed envelope, the payload sealed to
the receiving node). The node that holds the call runs the retry through the handler a
client's own retry takes (:func:`run_relayed`), in a request context of its own: the
client's capabilities are the ones the retry's ``_meta`` declares; progress and logs
of a forwarded round are not relayed back. A forwarded retry is never forwarded again,
and only a retry (a request carrying a ``requestState``) is taken: the relay cannot
start a call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

from mcp import types
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import CLIENT_CAPABILITIES_META_KEY, CLIENT_INFO_META_KEY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ValidationError

from skilld.mcp._rounds import Forward, RoundPeers
from skilld.types import Caller

_PARAMS: dict[str, type[BaseModel]] = {
    "tools/call": types.CallToolRequestParams,
    "prompts/get": types.GetPromptRequestParams,
    "resources/read": types.ReadResourceRequestParams,
}
_RESULTS: dict[str, type[BaseModel]] = {
    "tools/call": types.CallToolResult,
    "prompts/get": types.GetPromptResult,
    "resources/read": types.ReadResourceResult,
}

Handler = Callable[[Any, Any], Any]  # async (ctx, params model) -> result


class ForwardedSession:
    """The client of a retry another entry node forwarded: what a round channel asks of a
    session. Capabilities from the retry's ``_meta``; progress and logs go nowhere."""

    forwarded = True

    def __init__(self, version: str, meta: Mapping[str, Any], caller: Caller) -> None:
        self.caller = caller  # the entry node's verified caller (mcp._caller reads it)
        self._connection = Connection.from_envelope(
            version, meta.get(CLIENT_INFO_META_KEY), meta.get(CLIENT_CAPABILITIES_META_KEY)
        )

    def check_client_capability(self, capability: types.ClientCapabilities) -> bool:
        """Whether the retry declared ``capability``."""
        return self._connection.check_capability(capability)

    async def report_progress(self, *args: Any, **kwargs: Any) -> None:
        """Dropped: the client's stream is on the entry node that forwarded the retry."""

    async def send_notification(self, *args: Any, **kwargs: Any) -> None:
        """Dropped, as progress."""


def is_forwarded(ctx: Any) -> bool:
    """Whether ``ctx`` is a retry another entry node forwarded here."""
    return bool(getattr(ctx.session, "forwarded", False))


def _error(code: int, message: str, data: Any = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "data": data}}


async def run_relayed(
    request: Mapping[str, Any], handlers: Mapping[str, Handler]
) -> dict[str, Any]:
    """Run a forwarded retry (``{"method", "params", "version"}``) with ``handlers[method]``;
    ``{"result": ...}`` or ``{"error": {"code", "message", "data"}}``, JSON-ready."""
    method, params, version = request.get("method"), request.get("params"), request.get("version")
    if (
        not isinstance(method, str)
        or method not in handlers
        or method not in _PARAMS
        or not isinstance(params, Mapping)
        or not isinstance(params.get("requestState"), str)
        or version not in MODERN_PROTOCOL_VERSIONS
    ):
        return _error(types.INVALID_PARAMS, "only a 2026-07-28 round's retry can be forwarded")
    try:
        caller = Caller.from_dict(request["caller"])
    except (KeyError, TypeError, ValueError):
        # An entry node always sends its caller: a retry without one continues no call.
        return _error(types.INVALID_PARAMS, "a forwarded retry must carry its caller")
    meta = params.get("_meta")
    session = ForwardedSession(str(version), meta if isinstance(meta, Mapping) else {}, caller)
    ctx: ServerRequestContext[Any, Any] = ServerRequestContext(
        session=cast(Any, session),
        lifespan_context={},
        protocol_version=str(version),
        method=method,
        params=dict(params),
    )
    try:
        model = _PARAMS[method].model_validate(dict(params))
        result = await handlers[method](ctx, model)
    except ValidationError as exc:
        return _error(types.INVALID_PARAMS, f"a malformed forwarded retry: {exc}")
    except MCPError as exc:
        return _error(exc.error.code, exc.error.message, exc.error.data)
    if isinstance(result, BaseModel):
        return {"result": result.model_dump(by_alias=True, mode="json", exclude_none=True)}
    return {"result": result}


def forwarder(peers: RoundPeers) -> Forward:
    """The :class:`~skilld.mcp._rounds.ParkedCalls` hook that sends a retry to ``node``
    through ``peers`` and turns its answer back into the result (or error) it was there.

    The hook raises what the holding node raised (``MCPError``), or the cluster's
    ``SkilldError`` when that node could not be reached.
    """

    async def forward(
        node: str, method: str, params: Mapping[str, Any], version: str, caller: Mapping[str, Any]
    ) -> Any:
        request = {"method": method, "params": dict(params), "version": version}
        doc = await peers.forward(node, {**request, "caller": dict(caller)})
        error = doc.get("error")
        if isinstance(error, Mapping):
            raise MCPError(
                int(error.get("code", types.INTERNAL_ERROR)),
                str(error.get("message", "")),
                data=error.get("data"),
            )
        result = doc.get("result")
        if not isinstance(result, Mapping):
            raise MCPError(types.INTERNAL_ERROR, f"node {node} answered the retry without a result")
        if result.get("resultType") == "input_required":
            return types.InputRequiredResult.model_validate(result)
        if result.get("resultType") == "task":
            return dict(result)  # a CreateTaskResult passes through as the holder made it
        return _RESULTS[method].model_validate(result)

    return forward
