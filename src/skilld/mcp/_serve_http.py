"""Serving over HTTP: Streamable HTTP at /mcp and SSE at /sse on one uvicorn server.

Kept apart from the stdio entry points so that ``skilld serve --transport stdio``
never imports uvicorn and starlette (about 80 ms of its start-up).
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field

import anyio
import uvicorn
from anyio.abc import TaskStatus

from skilld.errors import UsageError
from skilld.mcp._config import ServeConfig
from skilld.mcp._http import build_app
from skilld.mcp._logging import make_logger
from skilld.mcp._metrics import Metrics
from skilld.mcp._server import Logger, McpService
from skilld.registry import Dispatcher

# Once calls in flight have finished, idle streams (an SSE GET) get this long to close.
_STREAM_CLOSE_S = 1
# A wildcard bind is reached through loopback: a client sending Host 0.0.0.0 gets 421.
_LOOPBACK_FOR = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}  # noqa: S104 - binds nothing


def advertised_url(host: str, port: int) -> str:
    """The Streamable HTTP endpoint a local client should use for a server bound to ``host``."""
    host = _LOOPBACK_FOR.get(host, host)
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/mcp"


class _DrainingServer(uvicorn.Server):
    """uvicorn, but shutdown first lets the calls in flight finish (bounded by the grace)."""

    def __init__(self, config: uvicorn.Config, service: McpService):
        super().__init__(config)
        self._service = service

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Drain the calls in flight, then stop accepting and close connections."""
        await self._service.drain(self._service.config.shutdown_grace_s)
        await super().shutdown(sockets)


@dataclass
class HttpServer:
    """A running HTTP server, as handed to ``task_status.started``."""

    host: str
    port: int
    service: McpService
    _server: _DrainingServer = field(repr=False)

    @property
    def url(self) -> str:
        """The Streamable HTTP endpoint (on loopback when bound to every address)."""
        return advertised_url(self.host, self.port)

    def stop(self) -> None:
        """Ask the server to shut down gracefully (as SIGTERM does)."""
        self._server.should_exit = True


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (``port`` 0: any free one), for :func:`serve_http_async`.

    Bind before saying ready: a busy port is then the first thing a user hears about.

    Raises:
        UsageError: the address cannot be bound (in use, not local, not permitted).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=1024)
    except OSError as exc:
        raise UsageError(
            f"cannot listen on {host}:{port}: {exc.strerror}", hint="pick another --port or --host"
        ) from exc


async def serve_http_async(
    dispatcher: Dispatcher,
    config: ServeConfig,
    *,
    log: Logger | None = None,
    sock: socket.socket | None = None,
    task_status: TaskStatus[HttpServer] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``dispatcher`` over HTTP on ``config.host:config.port`` until stopped.

    The socket is bound before ``task_status.started`` reports the server, so a
    client may connect at once (``config.port == 0`` picks a free port). ``sock`` is
    one already bound with :func:`bind` (the server closes it).

    Raises:
        UsageError: the tokens cannot be loaded or the address cannot be bound.
    """
    started = time.perf_counter()
    tokens = config.load_tokens()
    log = log or make_logger(config)
    service = McpService(dispatcher, config, log, Metrics())
    app = build_app(service, tokens)
    sock = sock if sock is not None else bind(config.host, config.port)
    port = sock.getsockname()[1]
    uv_config = uvicorn.Config(
        app,
        log_config=None,
        log_level="warning",
        access_log=False,
        lifespan="on",
        server_header=False,
        timeout_graceful_shutdown=_STREAM_CLOSE_S,
    )
    server = _DrainingServer(uv_config, service)
    handle = HttpServer(config.host, port, service, server)
    log.info(
        "serving",
        transport="http",
        url=handle.url,
        auth=bool(tokens),
        expose_ms=round((time.perf_counter() - started) * 1000, 2),
    )
    task_status.started(handle)
    with sock:
        await server.serve(sockets=[sock])
    log.info("stopped", transport="http")
