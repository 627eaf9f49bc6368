"""Entry points: serve a dispatcher over stdio or HTTP until told to stop."""

from __future__ import annotations

import functools
import gc
import socket
import time

import anyio
from mcp.server.stdio import stdio_server

from skilld.mcp._config import ServeConfig
from skilld.mcp._logging import make_logger
from skilld.mcp._metrics import Metrics
from skilld.mcp._server import Logger, McpService
from skilld.registry import Dispatcher


async def serve_stdio_async(
    dispatcher: Dispatcher, config: ServeConfig, *, log: Logger | None = None
) -> None:
    """Serve ``dispatcher`` to one client over stdin/stdout until stdin closes.

    While serving, file descriptor 1 points at stderr (the SDK's stdio transport
    does this), so nothing but protocol messages can reach stdout.
    """
    started = time.perf_counter()
    log = log or make_logger(config)
    service = McpService(dispatcher, config, log, Metrics())
    server = service.server
    log.info(
        "serving", transport="stdio", expose_ms=round((time.perf_counter() - started) * 1000, 2)
    )
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())
    await service.drain(config.shutdown_grace_s)
    log.info("stopped", transport="stdio")


async def serve_async(
    dispatcher: Dispatcher, config: ServeConfig, *, sock: socket.socket | None = None
) -> None:
    """Serve ``dispatcher`` on the transport ``config`` names (http: on ``sock`` if given).

    Raises:
        UsageError: as for :func:`serve_http_async`.
    """
    if config.transport == "stdio":
        await serve_stdio_async(dispatcher, config)
    else:
        from skilld.mcp._serve_http import serve_http_async

        await serve_http_async(dispatcher, config, sock=sock)


def serve(
    dispatcher: Dispatcher, config: ServeConfig, *, sock: socket.socket | None = None
) -> None:
    """Serve ``dispatcher`` until stdin closes (stdio) or SIGTERM/SIGINT (http).

    ``sock``: for http, a socket already bound (``skilld.mcp.bind``).

    Raises:
        UsageError: as for :func:`serve_http_async`.
    """
    # What is loaded by now (skills, tables, the SDK's modules) lives as long as the
    # server: frozen, the garbage collector stops walking it on every full collection.
    gc.collect()
    gc.freeze()
    anyio.run(functools.partial(serve_async, dispatcher, config, sock=sock))
