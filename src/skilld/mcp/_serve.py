"""Entry points: serve a dispatcher over stdio or HTTP until told to stop."""

from __future__ import annotations

import ctypes
import functools
import gc
import signal
import socket
import threading
import time

import anyio
from mcp.server.stdio import stdio_server

from skilld.mcp._config import ServeConfig
from skilld.mcp._logging import Logger, make_logger
from skilld.mcp._metrics import Metrics
from skilld.mcp._server import McpService
from skilld.mcp._stdin import claimed_stdin
from skilld.mcp._wiring import Wiring
from skilld.registry import Dispatcher


async def serve_stdio_async(
    dispatcher: Dispatcher,
    config: ServeConfig,
    *,
    log: Logger | None = None,
    wiring: Wiring | None = None,
) -> None:
    """Serve ``dispatcher`` to one client over stdin/stdout until stdin closes, or until
    SIGTERM/SIGINT.

    A signal drains as over HTTP: new calls are refused (``[unavailable] the server is
    shutting down``), calls in flight run to their end within the grace and their
    responses are written, then the server stops; a second signal ends the drain at once.
    While serving, file descriptor 1 points at stderr (the SDK's stdio transport does
    this) and fd 0 at ``/dev/null``, so nothing but protocol messages pass either way.
    """
    started = time.perf_counter()
    log = log or make_logger(config)
    service = McpService(dispatcher, config, log, Metrics(), wiring)
    server = service.server
    log.info(
        "serving", transport="stdio", expose_ms=round((time.perf_counter() - started) * 1000, 2)
    )
    drained: bool | None = None
    with claimed_stdin() as lines:
        async with (
            stdio_server(stdin=lines) as (read, write),  # type: ignore[arg-type]
            anyio.create_task_group() as tg,
        ):
            first, second = anyio.Event(), anyio.Event()
            if threading.current_thread() is threading.main_thread():
                tg.start_soon(_watch_signals, first, second)

            async def drain_on_signal() -> None:
                nonlocal drained
                await first.wait()
                with anyio.CancelScope() as draining:
                    tg.start_soon(_cancel_on, second, draining)
                    drained = await service.drain(config.shutdown_grace_s)
                if drained is None:
                    drained = False  # the second signal ended the drain
                if lines is not None:
                    # As if the client closed stdin: the server stops reading, and what
                    # it still had to write (the last responses) is written first.
                    lines.close()
                else:
                    tg.cancel_scope.cancel()

            tg.start_soon(drain_on_signal)
            await server.run(read, write, server.create_initialization_options())
            tg.cancel_scope.cancel()  # stdin closed
    if drained is None:
        drained = await service.drain(config.shutdown_grace_s)
    log.info("stopped", transport="stdio", drained=drained)


_SIGNALS = (signal.SIGTERM, signal.SIGINT)


async def _watch_signals(first: anyio.Event, second: anyio.Event) -> None:
    """Set ``first`` on the first SIGTERM or SIGINT, ``second`` on the next."""
    with anyio.open_signal_receiver(*_SIGNALS) as signals:
        async for _sig in signals:
            (second if first.is_set() else first).set()


async def _cancel_on(event: anyio.Event, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def serve_async(
    dispatcher: Dispatcher,
    config: ServeConfig,
    *,
    sock: socket.socket | None = None,
    wiring: Wiring | None = None,
) -> None:
    """Serve ``dispatcher`` on the transport ``config`` names (http: on ``sock`` if given),
    wired to ``wiring`` (a node's: ``Node.serving``).

    Raises:
        UsageError: as for :func:`serve_http_async`.
    """
    if config.transport == "stdio":
        await serve_stdio_async(dispatcher, config, wiring=wiring)
    else:
        from skilld.mcp._serve_http import serve_http_async

        await serve_http_async(dispatcher, config, sock=sock, wiring=wiring)


# A request leaves cycles behind (the SDK's SSE response cancels its helper tasks, whose
# exceptions hold their frames), and at 700 the collector also walks every call still in
# flight, promoting it to older generations that are walked again. Measured with
# gc.callbacks in the served process (bench_mcp's echo, 3,000 calls): the collector's time
# per call went from 200 to 100 µs at concurrency 16 and from 85 to 60 µs at 1; a
# young collection then takes about 3 ms, every 30-40 calls.
_GC_YOUNG = 5000

# glibc's malloc serves a block this large or larger from a mapping of its own, given
# back to the system when it is freed. By default the threshold starts at 128 KiB and
# rises to the largest block freed so far (up to 32 MiB): after one large answer (a tool's
# 8 MiB result, a kept output's base64) the next ones come from the heap, whose freed
# space glibc keeps. Measured with a skill answering 8,000 KiB of text, 64 such calls of
# one caller at once left the server holding 745-998 MiB after they ended; with the
# threshold fixed here, 282 MiB, and the peak fell from 1,179 to 971 MiB
# (docs/mcp.md, Shares). Python's own small objects live in 256 KiB-1 MiB arenas below it.
_MMAP_THRESHOLD = 1 << 20
_M_MMAP_THRESHOLD = -3  # <malloc.h>


def give_back_large_frees() -> None:
    """Make freed large blocks go back to the system at once (glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return  # not glibc (musl, another libc): its own policy stands
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)


def serve(
    dispatcher: Dispatcher,
    config: ServeConfig,
    *,
    sock: socket.socket | None = None,
    wiring: Wiring | None = None,
) -> None:
    """Serve ``dispatcher`` until stdin closes (stdio) or SIGTERM/SIGINT (both, drained).

    ``sock``: for http, a socket already bound (``skilld.mcp.bind``). ``wiring``: the
    live objects a node wires serving to (``Node.serving``); None: a server on its own.

    Raises:
        UsageError: as for :func:`serve_http_async`.
    """
    # What is loaded by now (skills, tables, the SDK's modules) lives as long as the
    # server: frozen, the garbage collector stops walking it on every full collection.
    gc.collect()
    gc.freeze()
    # Collect the young generation after _GC_YOUNG net allocations, not CPython's 700.
    gc.set_threshold(_GC_YOUNG, *gc.get_threshold()[1:])
    give_back_large_frees()
    anyio.run(functools.partial(serve_async, dispatcher, config, sock=sock, wiring=wiring))
