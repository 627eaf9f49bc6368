"""The response bytes one caller has waiting to be written are shared out per caller
(``max_response_bytes_per_caller``), over real HTTP with two named tokens.

A request may ask for something large that exists once (a kept output, a task's result,
a long greeting), and requests in progress alone did not bound how many times the server
held it: mallory's requests in progress, each answered with a large response she never
reads, each kept its whole response in the server until the write timeout. Past her
share a response is now dropped unwritten; alice's responses do not count against it.
"""

from __future__ import annotations

import socket

import anyio
import httpx2 as httpx
import pytest
from test_mcp_rounds import tool

from skilld.audit import MemorySink
from skilld.mcp import HttpServer
from skilld.registry import Registry
from support.mcp_fakes import callers_server, token_of
from support.modern_http import META_CAPS, META_VERSION, MODERN, stalled

pytestmark = pytest.mark.anyio

NAME = 7_000_000  # bytes of the name greeted: each answer holds it, more than a socket buffers
SHARE = 10_000_000  # max_response_bytes_per_caller here: one answer fits, two do not
CALLS = 6


server = callers_server(
    max_body_bytes=NAME + 4096,
    max_request_bytes_per_caller=CALLS * (NAME + 4096),
    max_response_bytes_per_caller=SHARE,
)


def _read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    sock.settimeout(60)
    chunks = []
    while chunk := sock.recv(1 << 20):
        chunks.append(chunk)
    sock.close()
    return b"".join(chunks)


async def test_mallorys_unread_answers_are_her_share_of_bytes(
    server: HttpServer, conformance_exposed: tuple[Registry, MemorySink]
) -> None:
    """mallory asks for six 7 MB greetings and reads none: past her 10 MB share of
    unwritten response bytes her answers are dropped, so when she reads at last some of
    her requests have no answer (all six had one, and the server held all six). Half of
    them spell her credential's scheme 'bearer': the same caller, one share. alice is
    answered meanwhile."""
    registry = conformance_exposed[0]
    greet, simple = tool(registry, "greet"), tool(registry, "simple_text")
    # Half spelled "bearer": another spelling of her credential is still her, one share.
    sockets = [
        await anyio.to_thread.run_sync(
            stalled,
            server.url,
            "tools/call",
            {"name": greet, "arguments": {"name": "x" * NAME}},
            token_of("mallory"),
            ("Bearer", "bearer")[n % 2],
        )
        for n in range(CALLS)
    ]
    audit = conformance_exposed[1]
    with anyio.fail_after(60):
        # Every call ran (its audit record is written before its answer is sent).
        while sum(r.get("method") == "greet" for r in audit.records) < CALLS:
            await anyio.sleep(0.05)
    async with httpx.AsyncClient(timeout=60) as http:
        meta = {META_VERSION: MODERN, META_CAPS: {}}
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
        body["params"] = {"name": simple, "arguments": {}, "_meta": meta}
        headers = {
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": MODERN,
            "Mcp-Method": "tools/call",
            "Mcp-Name": simple,
            "Authorization": f"Bearer {token_of('alice')}",
        }
        answer = await http.post(server.url, json=body, headers=headers)
    assert answer.status_code == 200 and '"result"' in answer.text, answer.text[:300]
    replies = [await anyio.to_thread.run_sync(_read_all, s) for s in sockets]
    answered = sum(b'"result"' in reply for reply in replies)
    assert all(reply.startswith(b"HTTP/1.1 200") for reply in replies)
    # The first holds the share until she reads (7 MB: more than the socket buffers take);
    # every other, either spelling, is dropped.
    assert answered == 1, f"{answered} of {CALLS} answered"
