"""Serving over HTTP: Streamable HTTP at /mcp and SSE at /sse on one uvicorn server.

Kept apart from the stdio entry points so that ``skilld serve --transport stdio``
never imports uvicorn and starlette (about 80 ms of its start-up).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import FrameType

import anyio
import uvicorn
from anyio.abc import TaskStatus

from skilld.errors import UsageError
from skilld.mcp._auth import Credentials, check_exposure, credentials_for
from skilld.mcp._config import ServeConfig
from skilld.mcp._connections import ACCEPT_BATCH, ConnectionGuard, connection_cap
from skilld.mcp._http import build_app
from skilld.mcp._logging import Logger, make_logger
from skilld.mcp._metrics import Metrics
from skilld.mcp._server import McpService
from skilld.mcp._wiring import Wiring
from skilld.registry import Dispatcher

# Once calls in flight have finished, idle streams (an SSE GET) get this long to close.
_STREAM_CLOSE_S = 1
# A wildcard bind is reached through loopback: a client sending Host 0.0.0.0 gets 421.
_LOOPBACK_FOR = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}  # noqa: S104 - binds nothing


def advertised_url(host: str, port: int) -> str:
    """The Streamable HTTP endpoint a local client should use for a server bound to ``host``."""
    host = _LOOPBACK_FOR.get(host, host)
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/mcp"


_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_LISTEN_BACKLOG = 1024


class _DrainingServer(uvicorn.Server):
    """uvicorn, but shutdown first lets the calls in flight finish (bounded by the grace).

    The server owns SIGTERM and SIGINT instead of uvicorn, for two reasons. uvicorn's
    handler is the one sse-starlette patches (and finds again by introspecting the
    SIGTERM handler): either way every open event stream, the responses of calls in
    flight included, is closed about half a second after the signal, long before the
    drain ends. And uvicorn raises the signal again once it has served, so the process
    dies of it and nothing after ``serve`` runs (the ``stopped`` line, closing the
    sandbox and the audit sink). Here the first signal starts the drain exactly as
    :meth:`HttpServer.stop` does; a second one ends the drain at once.
    """

    def __init__(
        self, config: uvicorn.Config, service: McpService, credentials: Credentials, log: Logger
    ):
        super().__init__(config)
        self._service = service
        self._credentials = credentials
        self._log = log
        self._drain_scope: anyio.CancelScope | None = None
        self.drained = True

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Handle SIGTERM and SIGINT on the event loop while serving; restore the old handlers.

        Handlers can only be installed from the main thread; a server run on another
        thread (a test's) is stopped through :meth:`HttpServer.stop`.
        """
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        loop = asyncio.get_running_loop()
        previous = {sig: signal.getsignal(sig) for sig in (*_SIGNALS, signal.SIGHUP)}
        for sig in _SIGNALS:
            loop.add_signal_handler(sig, self._on_signal, sig)
        # SIGHUP re-reads the named tokens (a removed one stops working); it never stops
        # the server, with or without tokens to read.
        loop.add_signal_handler(signal.SIGHUP, self._reload)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                loop.remove_signal_handler(sig)
                # None: a handler installed outside Python, which cannot be put back.
                if handler is not None:
                    signal.signal(sig, handler)

    def _on_signal(self, sig: int) -> None:
        self.handle_exit(sig, None)

    def _reload(self) -> None:
        named = self._credentials.named
        if named is None:
            self._log.info("sighup_ignored", reason="no token file to re-read")
        else:
            named.reload(self._log)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """The first signal starts a graceful shutdown; a second ends the drain at once."""
        if self.should_exit:
            self.force_exit = True
            if self._drain_scope is not None:
                self._drain_scope.cancel()
        self.should_exit = True

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """Start serving; then give the listen queue back its full length.

        uvicorn's ``backlog`` is both the listen queue and how many connections
        asyncio accepts per wake-up; it is set to ``ACCEPT_BATCH`` for the second,
        and the queue is lengthened again here.
        """
        await super().startup(sockets)
        for sock in sockets or []:
            sock.listen(_LISTEN_BACKLOG)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Drain the calls in flight, then stop accepting and close connections."""
        with anyio.CancelScope() as self._drain_scope:
            if not self.force_exit:
                self.drained = await self._service.drain(self._service.config.shutdown_grace_s)
        if self._drain_scope.cancel_called:
            self.drained = False
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
        return socket.create_server((host, port), family=family, backlog=_LISTEN_BACKLOG)
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
    wiring: Wiring | None = None,
    task_status: TaskStatus[HttpServer] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``dispatcher`` over HTTP on ``config.host:config.port`` until stopped.

    The socket is bound before ``task_status.started`` reports the server, so a
    client may connect at once (``config.port == 0`` picks a free port). ``sock`` is
    one already bound with :func:`bind` (the server closes it). ``wiring``: the live
    objects a node wires serving to (``Node.serving``); None: a server on its own.

    Raises:
        UsageError: the credentials cannot be loaded, none are configured for an address
            other than loopback (and ``allow_unauthenticated`` is not set), or the
            address cannot be bound.
    """
    started = time.perf_counter()
    log = log or make_logger(config)
    credentials = credentials_for(config, log)
    check_exposure(config, credentials)
    service = McpService(dispatcher, config, log, Metrics(), wiring)
    app = build_app(service, credentials)
    sock = sock if sock is not None else bind(config.host, config.port)
    port = sock.getsockname()[1]
    guard = ConnectionGuard(
        connection_cap(config.max_connections),
        config.header_timeout_s,
        service.metrics,
        log,
        write_timeout_s=config.write_timeout_s,
    )
    uv_config = uvicorn.Config(
        app,
        http=guard.protocol_class(),
        log_config=None,
        log_level="warning",
        access_log=False,
        lifespan="on",
        server_header=False,
        timeout_keep_alive=config.idle_timeout_s,  # type: ignore[arg-type]
        backlog=ACCEPT_BATCH,
        timeout_graceful_shutdown=_STREAM_CLOSE_S,
    )
    server = _DrainingServer(uv_config, service, credentials, log)
    handle = HttpServer(config.host, port, service, server)
    log.info(
        "serving",
        transport="http",
        url=handle.url,
        auth=credentials.describe(),
        max_connections=guard.cap,
        expose_ms=round((time.perf_counter() - started) * 1000, 2),
    )
    task_status.started(handle)
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    loop.set_exception_handler(guard.exception_handler(previous))
    try:
        with sock:
            await server.serve(sockets=[sock])
    finally:
        loop.set_exception_handler(previous)
    log.info("stopped", transport="http", drained=server.drained)
