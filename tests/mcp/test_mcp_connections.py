"""HTTP connections are bounded: header timeout, a cap that evicts idle ones or answers 503."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import anyio
import httpx2
import pytest

from skilld.mcp import ServeConfig
from skilld.mcp._connections import ConnectionGuard
from skilld.mcp._metrics import Metrics
from support.mcp_fakes import fake_dispatcher, running_http

pytestmark = pytest.mark.anyio


async def _connect(port: int, first: bytes = b"") -> anyio.abc.SocketStream:
    stream = await anyio.connect_tcp("127.0.0.1", port)
    if first:
        await stream.send(first)
    return stream


async def _closed_by_server(stream: anyio.abc.SocketStream) -> bool:
    """Read until the server closes the connection (True) or sends something (False)."""
    try:
        data = await stream.receive()
    except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
        return True
    return not data


async def test_a_connection_that_never_finishes_its_headers_is_closed() -> None:
    """Silent and slow-header connections are closed after the header timeout, not kept."""
    config = ServeConfig(transport="http", port=0, header_timeout_s=0.3)
    with anyio.fail_after(10):
        async with running_http(fake_dispatcher(), config) as server:
            silent = await _connect(server.port)
            slow = await _connect(server.port, b"GET /healthz HTTP/1.1\r\nHost: 127.0")
            assert await _closed_by_server(silent)
            assert await _closed_by_server(slow)


async def test_the_cap_closes_the_longest_idle_connection_for_a_newcomer() -> None:
    """With the cap full of idle connections, /healthz still answers; the oldest idle one goes."""
    config = ServeConfig(transport="http", port=0, max_connections=3)
    with anyio.fail_after(10):
        async with running_http(fake_dispatcher(), config) as server:
            idle = [await _connect(server.port) for _ in range(3)]
            async with httpx2.AsyncClient(timeout=5) as http:
                health = await http.get(f"http://127.0.0.1:{server.port}/healthz")
            assert health.status_code == 200
            assert await _closed_by_server(idle[0])


async def test_the_cap_full_of_requests_answers_503_but_probes() -> None:
    """With every connection inside a request, a new request gets 503 + close; probes get 200."""
    config = ServeConfig(transport="http", port=0, max_connections=2)
    sse = b"GET /sse HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n"
    with anyio.fail_after(10):
        async with running_http(fake_dispatcher(), config) as server:
            streams = [await _connect(server.port, sse) for _ in range(2)]
            for stream in streams:  # each stream has begun: the request is in progress
                assert b"200 OK" in await stream.receive()
            async with httpx2.AsyncClient(timeout=5) as http:
                base = f"http://127.0.0.1:{server.port}"
                refused = await http.post(f"{base}/mcp", json={}, headers={"Host": "127.0.0.1"})
                health = await http.get(f"{base}/healthz")
            assert refused.status_code == 503
            assert refused.headers["connection"] == "close"
            assert refused.text == "server at its connection limit; retry later\n"
            assert health.status_code == 200
            assert 'skilld_http_rejections_total{status="503"} 1' in server.service.metrics.render()
            for stream in streams:
                await stream.aclose()


def test_accept_errors_are_logged_once_per_interval() -> None:
    """A storm of "out of descriptors" accept errors makes one log line, counting the rest."""
    lines: list[tuple[str, dict[str, Any]]] = []

    class Log:
        def error(self, event: str, **fields: Any) -> None:
            lines.append((event, fields))

    passed: list[dict[str, Any]] = []
    guard = ConnectionGuard(10, 1.0, Metrics(), Log())
    handler = guard.exception_handler(lambda _loop, context: passed.append(context))
    loop = asyncio.new_event_loop()
    try:
        error = OSError(24, "Too many open files")
        with socket.socket() as sock:
            for _ in range(1000):
                handler(
                    loop,
                    {
                        "message": "socket.accept() out of system resource",
                        "exception": error,
                        "socket": sock,
                    },
                )
        handler(loop, {"message": "something else"})
    finally:
        loop.close()
    assert [event for event, _ in lines] == ["accept_failed"]
    assert lines[0][1]["failures"] == 1
    assert passed == [{"message": "something else"}]
