"""Over the legacy SSE transport a caller's calls in flight count against its requests in
progress (``max_requests_per_caller``), as over Streamable HTTP, with two named tokens.

``POST /messages/`` is answered 202 as soon as its message is handed to the session, which
runs the call in a task of its own: the POST's share of requests in progress was given back
while its call went on, so one SSE session of mallory had any number of calls in flight
(30 POSTs with a cap of 4: 12 calls running, 18 waiting for a slot, each holding its parsed
arguments).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2 as httpx
import pytest
from test_mcp_rounds import tool

from skilld.audit import MemorySink
from skilld.mcp import HttpServer
from skilld.registry import Registry
from support.mcp_fakes import callers_server, token_of

pytestmark = pytest.mark.anyio

CAP = 4  # max_requests_per_caller here
POSTS = 12


server = callers_server(max_requests_per_caller=CAP, queue_timeout_s=30)


class _SseClient:
    """One legacy SSE session of ``who``: POSTs messages, collects what the stream sends."""

    def __init__(self, http: httpx.AsyncClient, base: str) -> None:
        self.http = http
        self.base = base
        self.endpoint = ""
        self.messages: list[dict[str, Any]] = []
        self.opened = anyio.Event()

    async def listen(self) -> None:
        async with self.http.stream("GET", self.base + "/sse") as stream:
            event = ""
            async for line in stream.aiter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data = line[5:].strip()
                    if event == "endpoint":
                        self.endpoint = data
                        self.opened.set()
                    else:
                        self.messages.append(json.loads(data))

    async def post(self, message: dict[str, Any]) -> int:
        response = await self.http.post(self.base + self.endpoint, json=message)
        return response.status_code

    def answer(self, request_id: int) -> dict[str, Any] | None:
        return next((m for m in self.messages if m.get("id") == request_id), None)


@asynccontextmanager
async def _clients(*who: str) -> AsyncIterator[tuple[Any, ...]]:
    """An HTTP client per caller named in ``who`` (its bearer token), and a task group."""
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(
                httpx.AsyncClient(timeout=60, headers={"Authorization": f"Bearer {token_of(name)}"})
            )
            for name in who
        ]
        yield (*clients, await stack.enter_async_context(anyio.create_task_group()))


async def _session(http: httpx.AsyncClient, base: str, tg: Any) -> _SseClient:
    client = _SseClient(http, base)
    tg.start_soon(client.listen)
    await client.opened.wait()
    hello = {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    }
    await client.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello})
    while client.answer(0) is None:
        await anyio.sleep(0.01)
    await client.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
    return client


async def test_mallorys_sse_calls_in_flight_are_her_requests_in_progress(
    server: HttpServer, conformance_exposed: tuple[Registry, MemorySink]
) -> None:
    """mallory POSTs 12 long calls on one SSE session: 4 run (her requests in progress), the
    other 8 are answered at once with the cap's error; alice's call on her own SSE session is
    answered. Control: mallory's 4 are still running then."""
    registry = conformance_exposed[0]
    slow, simple = tool(registry, "slow_compute"), tool(registry, "simple_text")
    gate = registry.gate("conformance")
    base = server.url.removesuffix("/mcp")
    with anyio.fail_after(60):
        async with _clients("mallory", "alice") as (m_http, a_http, tg):
            mallory = await _session(m_http, base, tg)
            for n in range(1, POSTS + 1):
                call = {"name": slow, "arguments": {"seconds": 60}}
                status = await mallory.post(
                    {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": call}
                )
                assert status == 202
            while sum(mallory.answer(n) is not None for n in range(1, POSTS + 1)) < POSTS - CAP:
                await anyio.sleep(0.02)
            while gate.running < CAP:
                await anyio.sleep(0.02)
            refused = [mallory.answer(n) for n in range(1, POSTS + 1)]
            refused = [r for r in refused if r is not None]
            alice = await _session(a_http, base, tg)
            await alice.post(
                {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": simple}}
            )
            while alice.answer(1) is None:
                await anyio.sleep(0.02)
            assert gate.running == CAP  # the control: mallory's four still run
            tg.cancel_scope.cancel()
    assert len(refused) == POSTS - CAP, refused
    assert all("too many requests in progress" in r["error"]["message"] for r in refused), refused
    answer = alice.answer(1)
    assert answer is not None and "result" in answer, answer


NAME = "x" * 1_000_000  # a 1 MB name: the greeting holds it, so answers fill buffers fast
ATTEMPTS = 40


async def test_a_session_that_is_not_read_reads_no_more_requests(
    server: HttpServer, conformance_exposed: tuple[Registry, MemorySink]
) -> None:
    """mallory opens an SSE stream, stops reading it and POSTs 1 MB greetings: once the
    stream has taken what the buffers hold, her session reads nothing more, so her POSTs
    stay in progress and she gets 429 within a few (she had every one answered 202 and
    the server held each answer, about 3.1 MiB a call). alice is served meanwhile; when
    mallory reads her stream again, every call she was answered 202 for is answered."""
    greet = tool(conformance_exposed[0], "greet")
    base = server.url.removesuffix("/mcp")
    mine = {"Authorization": f"Bearer {token_of('mallory')}"}
    hers = {"Authorization": f"Bearer {token_of('alice')}"}
    accepted: list[int] = []
    with anyio.fail_after(120):
        async with (
            httpx.AsyncClient(timeout=60, headers=mine) as m_http,
            httpx.AsyncClient(timeout=60, headers=hers) as a_http,
            anyio.create_task_group() as tg,
            m_http.stream("GET", base + "/sse") as stream,
        ):
            lines = stream.aiter_lines()
            endpoint = await _endpoint(lines)
            hello = {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            }
            initialize = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello}
            await m_http.post(base + endpoint, json=initialize)
            while (await _next_data(lines)).get("id") != 0:
                pass
            initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            await m_http.post(base + endpoint, json=initialized)
            status = 202
            for n in range(1, ATTEMPTS + 1):
                call = {"name": greet, "arguments": {"name": NAME}}
                message = {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": call}
                status = (await m_http.post(base + endpoint, json=message)).status_code
                if status != 202:
                    break
                accepted.append(n)
            assert status == 429, f"all {ATTEMPTS} calls were taken on an unread stream"
            alice = await _session(a_http, base, tg)
            simple = tool(conformance_exposed[0], "simple_text")
            await alice.post(
                {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": simple}}
            )
            while alice.answer(1) is None:
                await anyio.sleep(0.02)
            answered: set[int] = set()
            while not set(accepted) <= answered:
                data = await _next_data(lines)
                if isinstance(data.get("id"), int):
                    answered.add(data["id"])
            tg.cancel_scope.cancel()
    assert len(accepted) < ATTEMPTS


async def _endpoint(lines: Any) -> str:
    """The endpoint event's URL path, read from a legacy SSE stream's lines."""
    event = ""
    async for line in lines:
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:") and event == "endpoint":
            return str(line[5:].strip())
    raise AssertionError("the stream ended before its endpoint event")


async def _next_data(lines: Any) -> dict[str, Any]:
    """The next message event's JSON, read from a legacy SSE stream's lines."""
    async for line in lines:
        if line.startswith("data:"):
            data: dict[str, Any] = json.loads(line[5:])
            return data
    raise AssertionError("the stream ended")


@pytest.mark.parametrize("bad", ["x" * 8000, "not-a-uuid", "0" * 31, "%00" * 100])
async def test_a_session_id_that_is_no_uuid_is_refused_and_not_logged(
    server: HttpServer, bad: str, caplog: pytest.LogCaptureFixture
) -> None:
    """POST /messages/ with a session_id that is no UUID: 400 "Invalid session ID", as the
    SDK answers, and no log line quotes it (the SDK's handler logged it whole)."""
    base = server.url.removesuffix("/mcp")
    mine = {"Authorization": f"Bearer {token_of('mallory')}"}
    message = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    with caplog.at_level(logging.DEBUG):
        async with httpx.AsyncClient(timeout=30, headers=mine) as http:
            response = await http.post(f"{base}/messages/?session_id={bad}", json=message)
    assert (response.status_code, response.text) == (400, "Invalid session ID")
    served = [r for r in caplog.records if not r.name.startswith(("httpx", "httpcore"))]
    assert not [r for r in served if bad[:20] in r.getMessage()]
    assert not [r for r in caplog.records if r.name.startswith("mcp.server.sse")]


async def test_mallory_cannot_post_into_alices_sse_session(
    server: HttpServer, conformance_exposed: tuple[Registry, MemorySink]
) -> None:
    """mallory knows alice's legacy SSE session id (it is in alice's endpoint URL) and
    POSTs a call and a cancellation to it: refused, and alice's stream carries nothing
    of them; alice's own next call is answered."""
    simple = tool(conformance_exposed[0], "simple_text")
    base = server.url.removesuffix("/mcp")
    with anyio.fail_after(60):
        async with _clients("mallory", "alice") as (m_http, a_http, tg):
            alice = await _session(a_http, base, tg)
            call = {"jsonrpc": "2.0", "id": 77, "method": "tools/call", "params": {"name": simple}}
            cancel = {
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": 1},
            }
            statuses = [
                (await m_http.post(base + alice.endpoint, json=message)).status_code
                for message in (call, cancel)
            ]
            await alice.post(
                {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": simple}}
            )
            while alice.answer(1) is None:
                await anyio.sleep(0.02)
            await anyio.sleep(0.3)  # what mallory's POSTs could have sent would be here now
            tg.cancel_scope.cancel()
    assert all(status in (403, 404) for status in statuses), statuses
    assert alice.answer(77) is None, alice.messages
    answer = alice.answer(1)
    assert answer is not None and "result" in answer, answer
