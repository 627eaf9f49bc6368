"""tools/call over Streamable HTTP: skilld's MCP layer against a bare SDK ``MCPServer``.

Both servers run in their own process on 127.0.0.1 and serve an ``echo`` tool that
returns ``{"text": ...}``; this process drives them with the SDK's client, one client
session per concurrent caller, and reports p50/p99 latency and throughput at
concurrency 1 and 16, then skilld/bare ratios.

skilld serves through the Dispatcher seam: by default the in-process
``skilld.mcp.testing:echo_dispatcher`` (plain Python, so the numbers are the MCP
layer's own cost: validation, worker thread, metrics, call log); pass
``--dispatcher module:factory`` (and ``--tool NAME`` if its echo tool has another
name) to serve anything else, e.g. the wasm echo skill through the registry.

Throughput counts from the moment every caller has opened its session, listed the
tools and warmed up, to the moment the last caller's last call returns.

Run from ``bench/`` (``_bundle`` lives there)::

    python bench_mcp.py                          # 2000 calls per cell
    python bench_mcp.py --requests 500 --dispatcher _bundle:echo_registry --tool echo/echo
"""

from __future__ import annotations

import argparse
import importlib
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

import anyio
import httpx2
from _util import pct
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# -- the two servers (each runs as ``bench_mcp.py --serve KIND``) ------------------


def serve_skilld(port: int, factory: str, log_level: str) -> None:
    """skilld's MCP layer over the dispatcher ``factory`` returns."""
    from skilld.mcp import ServeConfig, serve

    module, _, name = factory.partition(":")
    dispatcher = getattr(importlib.import_module(module), name)()
    serve(dispatcher, ServeConfig(transport="http", port=port, log_level=log_level))  # type: ignore[arg-type]


def serve_bare(port: int) -> None:
    """The SDK's high-level server with the same tool, no skilld in between."""
    import uvicorn
    from mcp.server.mcpserver import MCPServer

    app = MCPServer("bare")

    @app.tool()
    def echo(text: str) -> dict[str, str]:
        """Echo the text back."""
        return {"text": text}

    uvicorn.run(
        app.streamable_http_app(),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
    )


# -- the client side ----------------------------------------------------------------


async def _wait_up(port: int) -> None:
    with anyio.fail_after(30):
        async with httpx2.AsyncClient(timeout=1) as http:
            while True:
                try:
                    await http.get(f"http://127.0.0.1:{port}/mcp")
                except httpx2.TransportError:
                    await anyio.sleep(0.05)  # polling a child process that is starting up
                else:
                    return


class _Barrier:
    """Lets every one of ``parties`` tasks through once the last arrives; notes when."""

    def __init__(self, parties: int):
        self._waiting = parties
        self._all_here = anyio.Event()
        self.at = 0.0

    async def wait(self) -> None:
        self._waiting -= 1
        if self._waiting == 0:
            self.at = time.perf_counter()
            self._all_here.set()
        await self._all_here.wait()


async def _caller(
    url: str,
    tool: str,
    calls: int,
    latencies: list[float],
    warmup: int,
    warmed: _Barrier,
    finished: _Barrier,
) -> None:
    async with (
        streamable_http_client(url) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        await session.list_tools()
        for _ in range(warmup):
            await session.call_tool(tool, {"text": "warm"})
        await warmed.wait()
        for i in range(calls):
            started = time.perf_counter()
            result = await session.call_tool(tool, {"text": f"hello {i}"})
            latencies.append(time.perf_counter() - started)
            assert not result.is_error, result
        # Sessions close after the clock stops, not while other callers still call.
        await finished.wait()


async def measure(
    port: int, tool: str, concurrency: int, requests: int
) -> tuple[list[float], float]:
    """Latencies of ``requests`` calls spread over ``concurrency`` sessions, and the wall time.

    The clock starts once every session has warmed up and stops when the last call returns.
    """
    url = f"http://127.0.0.1:{port}/mcp"
    latencies: list[float] = []
    per_caller = max(1, requests // concurrency)
    warmed, finished = _Barrier(concurrency), _Barrier(concurrency)
    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(_caller, url, tool, per_caller, latencies, 10, warmed, finished)
    return latencies, finished.at - warmed.at


def _spawn(args: Sequence[str]) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.Popen(
        [sys.executable, __file__, *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def run(requests: int, dispatcher: str, tool: str, log_level: str) -> None:
    """Start both servers, measure each cell, print the table and ratios."""
    ports = {"skilld": _free_port(), "bare": _free_port()}
    procs = [
        _spawn(
            [
                "--serve",
                "skilld",
                "--port",
                str(ports["skilld"]),
                "--dispatcher",
                dispatcher,
                "--log-level",
                log_level,
            ]
        ),
        _spawn(["--serve", "bare", "--port", str(ports["bare"])]),
    ]
    try:
        for port in ports.values():
            await _wait_up(port)
        results: dict[tuple[str, int], tuple[float, float, float]] = {}
        for concurrency in (1, 16):
            for kind in ("bare", "skilld"):
                # Calls are wall-clock bound; throughput includes the client's own cost.
                name = tool if kind == "skilld" else "echo"
                lat, wall = await measure(ports[kind], name, concurrency, requests)
                results[(kind, concurrency)] = (
                    statistics.median(lat) * 1e3,
                    pct(lat, 0.99) * 1e3,
                    len(lat) / wall,
                )
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=60)

    print(
        f"tools/call echo over Streamable HTTP, {requests} calls per cell, dispatcher {dispatcher}"
    )
    print()
    print("| server | concurrency | p50 ms | p99 ms | calls/s |")
    print("|---|---|---|---|---|")
    for (kind, concurrency), (p50, p99, rate) in results.items():
        print(f"| {kind} | {concurrency} | {p50:.2f} | {p99:.2f} | {rate:.0f} |")
    print()
    print("| concurrency | p50 skilld/bare | p99 skilld/bare | throughput skilld/bare |")
    print("|---|---|---|---|")
    for concurrency in (1, 16):
        s, b = results[("skilld", concurrency)], results[("bare", concurrency)]
        print(f"| {concurrency} | {s[0] / b[0]:.2f} | {s[1] / b[1]:.2f} | {s[2] / b[2]:.2f} |")


def main() -> None:
    """Parse the options: run the benchmark, or serve one side of it."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="calls per cell")
    parser.add_argument(
        "--dispatcher",
        default="skilld.mcp.testing:echo_dispatcher",
        help="module:factory returning the Dispatcher skilld serves",
    )
    parser.add_argument(
        "--tool", default="echo", help="the dispatcher's echo tool, taking {'text': str}"
    )
    parser.add_argument(
        "--log-level", default="info", help="skilld's log level (info logs each call)"
    )
    parser.add_argument("--serve", choices=["skilld", "bare"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve == "skilld":
        serve_skilld(args.port, args.dispatcher, args.log_level)
    elif args.serve == "bare":
        serve_bare(args.port)
    else:
        anyio.run(run, args.requests, args.dispatcher, args.tool, args.log_level)


if __name__ == "__main__":
    main()
