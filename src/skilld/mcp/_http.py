"""One Starlette app on one port: Streamable HTTP, legacy SSE, health and metrics.

::

    /mcp                 Streamable HTTP (POST, GET stream, DELETE)
    /sse, /messages/     the legacy HTTP+SSE transport
    /healthz             200 while the process serves
    /readyz              200 when every skill is loaded and the server is not draining
    /metrics             Prometheus text format

    /.well-known/oauth-protected-resource[/mcp]   RFC 9728 metadata (OAuth on)

Every request except the two probes passes the front door first: the Host header
against the allowlist (421), the Origin header against the allowlist (403) — on
any bind address, 0.0.0.0 included, and ignoring case as DNS does — then the
credential when authentication is on (:mod:`skilld.mcp._auth`; 401 with
``WWW-Authenticate: Bearer ... resource_metadata=...``, 403 ``insufficient_scope``
naming the scope), the caller's share of requests and streams (429), and only then
the body size (413): nothing is buffered for an unauthenticated client.
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

from mcp.server.auth.handlers.metadata import ProtectedResourceMetadataHandler
from mcp.server.auth.middleware.auth_context import AuthContextMiddleware
from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend, RequireAuthMiddleware
from mcp.server.auth.routes import build_resource_metadata_url, cors_middleware
from mcp.server.sse import SseServerTransport
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import RequestBodyLimitMiddleware, TransportSecuritySettings
from mcp.shared.auth import ProtectedResourceMetadata
from pydantic import AnyHttpUrl
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from skilld.mcp._after import AfterResponse
from skilld.mcp._auth import METRICS_SCOPE, Credentials, caller_of
from skilld.mcp._config import ServeConfig
from skilld.mcp._connections import PROBES, CallerShares
from skilld.mcp._logging import Logger
from skilld.mcp._metrics import Metrics, render_gauges
from skilld.mcp._server import McpService
from skilld.mcp._sse import SseEndpoint


def matches(value: str, patterns: Sequence[str]) -> bool:
    """Whether ``value`` equals a pattern, or matches ``base:*`` with some port, ignoring case."""
    value = value.lower()
    for pattern in (p.lower() for p in patterns):
        if value == pattern:
            return True
        if pattern.endswith(":*"):
            base = pattern[:-2]
            rest = value[len(base) :]
            if value.startswith(base + ":") and rest[1:].isdigit():
                return True
    return False


_CASELESS_HEADERS = (b"host", b"origin")


class FrontDoor:
    """Host and Origin checks in front of everything but the probes; counts refusals."""

    def __init__(self, app: ASGIApp, *, config: ServeConfig, metrics: Metrics):
        self._app = app
        self._hosts = config.host_allowlist()
        self._origins = config.origin_allowlist()
        self._metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PROBES:
            await self._app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        origin = headers.get("origin")
        if not matches(host, self._hosts):
            await self._reject(421, f"Host {host!r} is not allowed", scope, receive, send)
            return
        if origin is not None and not matches(origin, self._origins):
            await self._reject(403, f"Origin {origin!r} is not allowed", scope, receive, send)
            return

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] in (401, 403, 413):
                self._metrics.http_rejected(message["status"])
            await send(message)

        # Host names ignore case; the SDK's transports check them again, case-sensitively.
        headers_out = [
            (name, value.lower() if name in _CASELESS_HEADERS else value)
            for name, value in scope["headers"]
        ]
        await self._app({**scope, "headers": headers_out}, receive, counting_send)

    async def _reject(
        self, status: int, text: str, scope: Scope, receive: Receive, send: Send
    ) -> None:
        self._metrics.http_rejected(status)
        await PlainTextResponse(text, status_code=status)(scope, receive, send)


class RequireCredential(RequireAuthMiddleware):
    """The SDK's gate, with the scopes it needs named in ``WWW-Authenticate`` as the MCP
    authorization specification and RFC 6750 ask (``scope="..."``)."""

    async def _send_auth_error(
        self, send: Send, status_code: int, error: str, description: str
    ) -> None:
        parts = [f'error="{error}"', f'error_description="{description}"']
        if self.required_scopes:
            parts.append(f'scope="{" ".join(self.required_scopes)}"')
        if self.resource_metadata_url:
            parts.append(f'resource_metadata="{self.resource_metadata_url}"')
        body = json.dumps({"error": error, "error_description": description}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status_code,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", f"Bearer {', '.join(parts)}".encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


async def too_many(what: str, cap: int, scope: Scope, receive: Receive, send: Send) -> None:
    """429: the caller holds its share of ``what`` already (a JSON-RPC error, no id)."""
    body = {
        "jsonrpc": "2.0",
        "id": None,
        "error": {
            "code": -32603,
            "message": f"too many {what} for this caller (at most {cap}); close one and retry",
            "data": {"limit": cap, "scope": "caller"},
        },
    }
    response = JSONResponse(body, status_code=429, headers={"Retry-After": "1"})
    await response(scope, receive, send)


class CallerShare:
    """Holds one of the caller's ``shares`` while the wrapped app serves a request."""

    def __init__(self, app: ASGIApp, shares: CallerShares, metrics: Metrics, *, get_only: bool):
        self._app = app
        self._shares = shares
        self._metrics = metrics
        self._get_only = get_only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._get_only and scope.get("method") != "GET":
            await self._app(scope, receive, send)
            return
        key = caller_of(HTTPConnection(scope)).key
        if not self._shares.take(key):
            self._metrics.http_rejected(429)
            await too_many(self._shares.what, self._shares.cap, scope, receive, send)
            return
        try:
            await self._app(scope, receive, send)
        finally:
            self._shares.give(key)


class CallerBodyBytes:
    """Holds the size of a request's body against its caller's ``shares`` while the
    wrapped app serves it (inside the SDK's body limit, which hands the whole body on
    in one message): past the caller's share, 429 before the body is parsed."""

    def __init__(self, app: ASGIApp, shares: CallerShares, metrics: Metrics):
        self._app = app
        self._shares = shares
        self._metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self._app(scope, receive, send)
            return
        first = await receive()
        size = len(first.get("body", b"")) if first["type"] == "http.request" else 0
        key = caller_of(HTTPConnection(scope)).key
        if not self._shares.take(key, size):
            self._metrics.http_rejected(429)
            await too_many(self._shares.what, self._shares.cap, scope, receive, send)
            return
        pending: list[Message] = [first]

        async def replay() -> Message:
            return pending.pop() if pending else await receive()

        try:
            await self._app(scope, replay, send)
        finally:
            self._shares.give(key, size)


# A body this small is not counted: the server writes the next message only once the
# connection's buffer is under its high-water mark (asyncio's default, 64 KiB), so small
# messages never pile up in it beyond that and the message being written.
_SMALL_BODY = 64 * 1024


class CallerResponseBytes:
    """Counts each response body a caller's request sends against the caller's ``shares``
    until the connection has taken it (handed it to the socket, or drained its buffer
    once the client read).

    A response that would pass the caller's share is dropped: its response is ended with
    nothing more and what the app sends after is discarded, so the server holds no more
    of it. One response of any size passes while the caller has nothing else waiting.
    Counted before the bytes are handed on: a client that asks many times for one large
    object and reads nothing makes the server hold at most its share, not the object as
    many times as it has requests in progress.
    """

    def __init__(self, app: ASGIApp, shares: CallerShares, metrics: Metrics, log: Logger):
        self._app = app
        self._shares = shares
        self._metrics = metrics
        self._log = log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        shares = self._shares
        dropped = False

        async def counted(message: Message) -> None:
            nonlocal dropped
            if dropped:
                return
            body = message.get("body", b"") if message["type"] == "http.response.body" else b""
            if len(body) <= _SMALL_BODY:
                await send(message)
                return
            size = len(body)
            key = caller_of(HTTPConnection(scope)).key
            if not shares.take(key, size, first=True):
                dropped = True
                self._metrics.response_dropped()
                self._log.warning(
                    "response_dropped",
                    caller=caller_of(HTTPConnection(scope)).label(),
                    bytes=size,
                    waiting=shares.held(key),
                    limit=shares.cap,
                )
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            try:
                await send({**message, "more_body": True})
                # The server writes a body message to the connection's buffer and returns;
                # it waits for a buffer its client has not read to drain before it writes
                # the next message (uvicorn's flow control). An empty one (nothing written)
                # therefore returns once the bytes above were taken.
                await send({"type": "http.response.body", "body": b"", "more_body": True})
            finally:
                shares.give(key, size)
            if not message.get("more_body", False):
                await send({"type": "http.response.body", "body": b"", "more_body": False})

        await self._app(scope, receive, counted)


# The caller whose new session is being admitted, and whether it was (see CallerSessions).
_opening: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar(
    "skilld_opening_session", default=None
)


class CallerSessions(StreamableHTTPSessionManager):
    """The SDK's session manager, with each caller's open sessions counted against
    ``shares``: one caller at its cap gets 429 for a new session while others open theirs
    (the SDK's own ``max_sessions`` stays the cap for everyone together).

    The SDK admits a session in ``_admit_session`` and forgets it in ``_discard_session``
    (a DELETE, the idle timeout, a crash, or an opening request that failed); the count
    follows those two.
    """

    def __init__(self, *args: Any, shares: CallerShares, metrics: Metrics, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._shares = shares
        self._metrics = metrics
        self._owners: dict[str, str] = {}

    async def _handle_stateful_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        if Headers(scope=scope).get(MCP_SESSION_ID_HEADER) is not None:
            await super()._handle_stateful_request(scope, receive, send)
            return
        key = caller_of(HTTPConnection(scope)).key
        if not self._shares.take(key):
            self._metrics.http_rejected(429)
            await too_many("open sessions", self._shares.cap, scope, receive, send)
            return
        cell: list[Any] = [key, False]
        reset = _opening.set(cell)
        try:
            await super()._handle_stateful_request(scope, receive, send)
        finally:
            _opening.reset(reset)
            if not cell[1]:
                self._shares.give(key)

    def _admit_session(self, requestor: Any) -> Any:
        transport = super()._admit_session(requestor)
        cell = _opening.get()
        if transport is not None and cell is not None:
            self._owners[str(transport.mcp_session_id)] = cell[0]
            cell[1] = True
        return transport

    async def _discard_session(self, session_id: str, transport: Any) -> None:
        key = self._owners.pop(session_id, None)
        if key is not None:
            self._shares.give(key)
        await super()._discard_session(session_id, transport)


def build_app(service: McpService, credentials: Credentials) -> Starlette:
    """The ASGI app serving ``service`` over HTTP; its lifespan runs the session manager.

    With ``credentials`` every route but the probes (and the public resource metadata)
    needs a credential they verify; ``/metrics`` also needs the ``skilld:metrics`` scope.
    """
    config = service.config
    metrics = service.metrics
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        # The front door lowercases Host and Origin; the SDK compares as written.
        allowed_hosts=[h.lower() for h in config.host_allowlist()],
        allowed_origins=[o.lower() for o in config.origin_allowlist()],
    )
    manager = CallerSessions(
        app=service.server,
        security_settings=security,
        max_request_body_size=config.max_body_bytes,
        max_sessions=config.max_sessions,
        shares=CallerShares("open sessions", config.max_sessions_per_caller),
        metrics=metrics,
    )
    sse = SseServerTransport(
        "/messages/", security_settings=security, max_request_body_size=config.max_body_bytes
    )
    requests = CallerShares("requests in progress", config.max_requests_per_caller)
    body_bytes = CallerShares(
        "request body bytes in progress",
        config.max_request_bytes_per_caller or 4 * config.max_body_bytes,
    )
    streams = CallerShares("open streams", config.max_streams_per_caller)
    response_bytes = CallerShares(
        "response bytes waiting to be written", config.max_response_bytes_per_caller
    )
    resource = (
        AnyHttpUrl(config.auth_audience)
        if config.auth_issuer is not None and config.auth_audience is not None
        else None
    )
    metadata_url = build_resource_metadata_url(resource) if resource is not None else None

    def guarded(app: ASGIApp, scopes: Sequence[str] = config.auth_scopes) -> ASGIApp:
        # The credential first, then the caller's share, then the body: an
        # unauthenticated client gets its 401 before the server reads (and buffers up
        # to max_body_bytes of) what it sent.
        limited = RequestBodyLimitMiddleware(
            CallerBodyBytes(app, body_bytes, metrics), config.max_body_bytes
        )
        shared = CallerShare(
            CallerResponseBytes(AfterResponse(limited), response_bytes, metrics, service.log),
            requests,
            metrics,
            get_only=False,
        )
        if not credentials:
            return shared
        return RequireCredential(shared, list(scopes), metadata_url)

    def stream(app: ASGIApp) -> ASGIApp:
        return CallerShare(app, streams, metrics, get_only=True)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        ready = service.dispatcher.ready() and not service.draining
        status = "ready" if ready else ("draining" if service.draining else "loading")
        body = {"status": status}
        if config.confinement is not None and not credentials:
            body["confinement"] = config.confinement
        return JSONResponse(body, status_code=200 if ready else 503)

    async def metrics_page(request: Request) -> Response:
        return PlainTextResponse(
            metrics.render() + render_gauges(service.dispatcher),
            media_type="text/plain; version=0.0.4; charset=utf-8",
        )

    routes: list[BaseRoute] = [
        Route("/mcp", endpoint=guarded(stream(StreamableHTTPASGIApp(manager)))),
        Route("/sse", endpoint=guarded(stream(SseEndpoint(service, sse))), methods=["GET"]),
        Mount("/messages/", app=guarded(SessionIdChecked(sse.handle_post_message))),
        Route("/healthz", endpoint=healthz, methods=["GET"]),
        Route("/readyz", endpoint=readyz, methods=["GET"]),
        Route(
            "/metrics",
            endpoint=guarded(_EndpointApp(metrics_page), (METRICS_SCOPE,)),
            methods=["GET"],
        ),
    ]
    if metadata_url is not None:
        # Validated from the configured strings, so an issuer keeps its exact spelling
        # (RFC 8414 compares issuers as strings: no trailing slash added).
        document = ProtectedResourceMetadata.model_validate(
            {
                "resource": config.auth_audience,
                "authorization_servers": [config.auth_issuer],
                "scopes_supported": [*config.auth_scopes, METRICS_SCOPE],
                "resource_name": config.server_name,
            }
        )
        endpoint = cors_middleware(
            ProtectedResourceMetadataHandler(document).handle, ["GET", "OPTIONS"]
        )
        # RFC 9728 puts the metadata of https://host/mcp at
        # /.well-known/oauth-protected-resource/mcp; clients that know only the host
        # look at the bare path: both answer.
        for path in {urlsplit(str(metadata_url)).path, "/.well-known/oauth-protected-resource"}:
            routes.append(Route(path, endpoint, methods=["GET", "OPTIONS"]))
    middleware = [Middleware(FrontDoor, config=config, metrics=metrics)]
    if credentials:
        middleware += [
            Middleware(AuthenticationMiddleware, backend=BearerAuthBackend(credentials)),
            Middleware(AuthContextMiddleware),
        ]

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with manager.run():
            yield

    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan)


class SessionIdChecked:
    """The legacy transport's ``POST /messages/?session_id=ID``, its id checked first.

    The MCP SDK's handler logs a ``session_id`` it cannot parse whole, in a warning of its
    own per request: a client could make every request write the longest query string
    the server accepts to the log. An id that is not a UUID is answered here, as the SDK
    answers it (400 ``Invalid session ID``), and nothing of it is logged."""

    def __init__(self, app: ASGIApp):
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = Request(scope).query_params.get("session_id")
        if found is not None:
            try:
                UUID(hex=found)
            except ValueError:
                response = Response("Invalid session ID", status_code=400)
                await response(scope, receive, send)
                return
        await self._app(scope, receive, send)


class _EndpointApp:
    """A request/response function as an ASGI app object (Starlette routes a bare
    function as request/response, so wrapping needs an object)."""

    def __init__(self, endpoint: Callable[[Request], Awaitable[Response]]):
        self._endpoint = endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self._endpoint(Request(scope, receive))
        await response(scope, receive, send)
