"""One Starlette app on one port: Streamable HTTP, legacy SSE, health and metrics.

::

    /mcp                 Streamable HTTP (POST, GET stream, DELETE)
    /sse, /messages/     the legacy HTTP+SSE transport
    /healthz             200 while the process serves
    /readyz              200 when every skill is loaded and the server is not draining
    /metrics             Prometheus text format

Every request except the two probes passes the front door first: the Host header
against the allowlist (421), the Origin header against the allowlist (403) — on
any bind address, 0.0.0.0 included, and ignoring case as DNS does — then the
bearer token when tokens are configured (401 with ``WWW-Authenticate: Bearer``),
and only then the body size (413): nothing is buffered for an unauthenticated client.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager

from mcp.server.auth.middleware.auth_context import AuthContextMiddleware
from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend, RequireAuthMiddleware
from mcp.server.auth.provider import AccessToken
from mcp.server.sse import SseServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import RequestBodyLimitMiddleware, TransportSecuritySettings
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from skilld.mcp._config import ServeConfig
from skilld.mcp._metrics import Metrics, render_gauges
from skilld.mcp._server import McpService

PROBES = frozenset({"/healthz", "/readyz"})


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


class TokenVerifier:
    """Bearer tokens from the configuration, compared in constant time.

    Each token maps to its own principal (a digest prefix), so the SDK binds every
    session to the token that opened it and another token cannot use it.
    """

    def __init__(self, tokens: Sequence[str]):
        digests = [_sha256(t) for t in tokens]
        self._tokens = [(d, "token-" + d.hex()[:12]) for d in digests]

    async def verify_token(self, token: str) -> AccessToken | None:
        """The access grant for ``token``, or None when it is not one of ours."""
        # Digests, not the tokens: compare_digest takes time by the length of its
        # inputs, which would tell a client how long the configured tokens are.
        presented = _sha256(token)
        found: str | None = None
        for known, principal in self._tokens:
            # No early exit: every configured token is compared, whatever matches.
            if hmac.compare_digest(presented, known):
                found = principal
        return None if found is None else AccessToken(token=token, client_id=found, scopes=[])


def _sha256(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


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


class _SseEndpoint:
    """The legacy SSE stream: one MCP session per GET, for as long as it stays open."""

    def __init__(self, service: McpService, transport: SseServerTransport):
        self._service = service
        self._transport = transport

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = self._service.server
        async with self._transport.connect_sse(scope, receive, send) as (read, write):
            await server.run(read, write, server.create_initialization_options())


def build_app(service: McpService, tokens: Sequence[str]) -> Starlette:
    """The ASGI app serving ``service`` over HTTP; its lifespan runs the session manager."""
    config = service.config
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        # The front door lowercases Host and Origin; the SDK compares as written.
        allowed_hosts=[h.lower() for h in config.host_allowlist()],
        allowed_origins=[o.lower() for o in config.origin_allowlist()],
    )
    manager = StreamableHTTPSessionManager(
        app=service.server, security_settings=security, max_request_body_size=config.max_body_bytes
    )
    sse = SseServerTransport(
        "/messages/", security_settings=security, max_request_body_size=config.max_body_bytes
    )

    def guarded(app: ASGIApp) -> ASGIApp:
        # The token first, then the body: an unauthenticated client gets its 401
        # before the server reads (and buffers up to max_body_bytes of) what it sent.
        limited = RequestBodyLimitMiddleware(app, config.max_body_bytes)
        return RequireAuthMiddleware(limited, []) if tokens else limited

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        ready = service.dispatcher.ready() and not service.draining
        status = "ready" if ready else ("draining" if service.draining else "loading")
        body = {"status": status}
        if config.confinement is not None:
            body["confinement"] = config.confinement
        return JSONResponse(body, status_code=200 if ready else 503)

    async def metrics(request: Request) -> Response:
        return PlainTextResponse(
            service.metrics.render() + render_gauges(service.dispatcher),
            media_type="text/plain; version=0.0.4; charset=utf-8",
        )

    routes: list[BaseRoute] = [
        Route("/mcp", endpoint=guarded(StreamableHTTPASGIApp(manager))),
        Route("/sse", endpoint=guarded(_SseEndpoint(service, sse)), methods=["GET"]),
        Mount("/messages/", app=guarded(sse.handle_post_message)),
        Route("/healthz", endpoint=healthz, methods=["GET"]),
        Route("/readyz", endpoint=readyz, methods=["GET"]),
        Route("/metrics", endpoint=guarded(_EndpointApp(metrics)), methods=["GET"]),
    ]
    middleware = [Middleware(FrontDoor, config=config, metrics=service.metrics)]
    if tokens:
        middleware += [
            Middleware(AuthenticationMiddleware, backend=BearerAuthBackend(TokenVerifier(tokens))),
            Middleware(AuthContextMiddleware),
        ]

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with manager.run():
            yield

    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan)


class _EndpointApp:
    """A request/response function as an ASGI app object (Starlette routes a bare
    function as request/response, so wrapping needs an object)."""

    def __init__(self, endpoint: Callable[[Request], Awaitable[Response]]):
        self._endpoint = endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self._endpoint(Request(scope, receive))
        await response(scope, receive, send)
