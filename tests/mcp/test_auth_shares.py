"""Each caller's fair share of the transport: mallory at each cap while alice is answered."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from skilld.mcp import HttpServer, ServeConfig
from skilld.types import ClientChannel
from support.callers import open_to_authenticated
from support.mcp_fakes import running_http
from support.static_dispatcher import ECHO_SCHEMA, StaticDispatcher, static_tool

pytestmark = pytest.mark.anyio

ALICE = "alice-0123456789abcdefghijklmnopqrstuvwxyz"
MALLORY = "mallory-0123456789abcdefghijklmnopqrstuvw"
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"},
    },
}
LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}


class Held:
    """A tool that holds its call until released, counting the calls it holds."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.running = 0

    def __call__(self, args: Mapping[str, Any], ch: ClientChannel) -> Any:
        with self.lock:
            self.running += 1
        self.release.wait(30)
        return {"released": True}


def _dispatcher(held: Held) -> StaticDispatcher:
    dispatcher = StaticDispatcher(
        tools_=[
            static_tool("work/hold", held, skill_id="work"),
            static_tool("notes/echo", lambda a, c: {"text": a["text"]}, input_schema=ECHO_SCHEMA),
        ],
        concurrency=64,
    )
    return open_to_authenticated(dispatcher)


def _headers(token: str, session: str | None = None, scheme: str = "Bearer") -> dict[str, str]:
    out = {**ACCEPT, "Authorization": f"{scheme} {token}"}
    if session is not None:
        out["mcp-session-id"] = session
    return out


@asynccontextmanager
async def _serving(tmp_path: Path, held: Held, **caps: Any) -> AsyncIterator[HttpServer]:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice {ALICE} skilld:metrics\nmallory {MALLORY}\n")
    tokens.chmod(0o600)
    config = ServeConfig(transport="http", port=0, token_file=tokens, **caps)
    async with running_http(_dispatcher(held), config) as server:
        yield server


async def _open(
    http: httpx2.AsyncClient, url: str, token: str, scheme: str = "Bearer"
) -> httpx2.Response:
    return await http.post(url, json=INIT, headers=_headers(token, scheme=scheme))


async def test_sessions_per_caller(tmp_path: Path) -> None:
    """mallory's sessions stop at her cap (however she spells Bearer); alice opens hers; a
    session mallory closes frees a place."""
    held = Held()
    with anyio.fail_after(60):
        async with (
            _serving(tmp_path, held, max_sessions_per_caller=3) as server,
            httpx2.AsyncClient(timeout=30) as http,
        ):
            sessions = []
            for scheme in ("Bearer", "bearer", "BEARER"):
                opened = await _open(http, server.url, MALLORY, scheme)
                assert opened.status_code == 200
                sessions.append(opened.headers["mcp-session-id"])
            refused = await _open(http, server.url, MALLORY, "bEaReR")
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["data"] == {"limit": 3, "scope": "caller"}
            assert (await _open(http, server.url, ALICE)).status_code == 200
            closed = await http.delete(server.url, headers=_headers(MALLORY, sessions[0]))
            assert closed.status_code in (200, 204)
            assert (await _open(http, server.url, MALLORY)).status_code == 200


async def test_streams_per_caller(tmp_path: Path) -> None:
    """mallory's open event streams stop at her cap; alice opens hers meanwhile."""
    held = Held()
    with anyio.fail_after(60):
        async with _serving(tmp_path, held, max_streams_per_caller=2) as server:
            sse = server.url.removesuffix("/mcp") + "/sse"
            async with AsyncExitStack() as stack:
                http = await stack.enter_async_context(httpx2.AsyncClient(timeout=30))
                for _ in range(2):
                    stream = await stack.enter_async_context(
                        http.stream("GET", sse, headers=_headers(MALLORY))
                    )
                    assert stream.status_code == 200
                assert (await http.get(sse, headers=_headers(MALLORY))).status_code == 429
                async with http.stream("GET", sse, headers=_headers(ALICE)) as mine:
                    assert mine.status_code == 200


async def test_requests_per_caller(tmp_path: Path) -> None:
    """With her requests in progress at the cap, mallory's next one is 429 at once while
    alice's calls are answered."""
    held = Held()
    call = {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "tools/call",
        "params": {"name": "work/hold", "arguments": {}},
    }
    with anyio.fail_after(60):
        async with (
            _serving(tmp_path, held, max_requests_per_caller=2) as server,
            httpx2.AsyncClient(timeout=30) as http,
            anyio.create_task_group() as tg,
        ):
            session = (await _open(http, server.url, MALLORY)).headers["mcp-session-id"]
            hold = _headers(MALLORY, session)
            for request_id in (3, 4):
                tg.start_soon(
                    lambda i=request_id: http.post(  # type: ignore[misc]
                        server.url, json={**call, "id": i}, headers=hold
                    )
                )
            deadline = time.monotonic() + 10
            while held.running < 2:
                assert time.monotonic() < deadline, "mallory's calls never started"
                await anyio.sleep(0.01)
            refused = await http.post(server.url, json=LIST, headers=_headers(MALLORY, session))
            assert refused.status_code == 429
            alices = (await _open(http, server.url, ALICE)).headers["mcp-session-id"]
            listed = await http.post(server.url, json=LIST, headers=_headers(ALICE, alices))
            assert listed.status_code == 200
            held.release.set()


async def test_a_client_that_never_reads_is_dropped(tmp_path: Path) -> None:
    """A response mallory never reads is dropped after the write timeout (and counted);
    alice is answered meanwhile."""
    held = Held()
    big = {
        "jsonrpc": "2.0",
        "id": 4,
        "method": "tools/call",
        "params": {"name": "notes/echo", "arguments": {"text": "x" * (3 << 20)}},
    }
    with anyio.fail_after(60):
        async with (
            _serving(tmp_path, held, write_timeout_s=0.5) as server,
            httpx2.AsyncClient(timeout=30) as http,
        ):
            session = (await _open(http, server.url, MALLORY)).headers["mcp-session-id"]
            body = httpx2.Request("POST", server.url, json=big, headers=_headers(MALLORY, session))
            raw = socket.socket()
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            raw.connect(("127.0.0.1", server.port))
            head = f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
            head += "".join(f"{k}: {v}\r\n" for k, v in body.headers.items() if k != "host")
            raw.sendall(head.encode() + b"\r\n" + body.read())
            metrics = server.url.removesuffix("/mcp") + "/metrics"
            deadline = time.monotonic() + 20
            while True:
                page = await http.get(metrics, headers={"Authorization": f"Bearer {ALICE}"})
                assert page.status_code == 200
                if "skilld_http_write_timeouts_total 1" in page.text:
                    break
                assert time.monotonic() < deadline, "mallory's stalled write was never cut"
                await anyio.sleep(0.05)
            raw.close()
