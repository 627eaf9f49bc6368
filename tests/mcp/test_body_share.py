"""The bodies of one caller's requests in progress are shared out per caller (DESIGN.md:
"every shared resource ... is shared out per caller"), over real HTTP with two named tokens.

A parsed JSON body takes many times its size while its request is served (4 MiB of empty
objects: about 75 MiB), and a request to a slow tool is served for as long as the tool
runs: mallory's 64 requests in progress (her cap) of the largest body each could make the
server hold about 5 GiB. Her request bodies now count against a share of bytes
(``max_request_bytes_per_caller``); alice's do not count against hers.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx2 as httpx
import pytest
from test_mcp_rounds import tool

from skilld.audit import MemorySink
from skilld.mcp import HttpServer
from skilld.registry import Registry
from support.mcp_fakes import callers_server, token_of
from support.modern_http import META_CAPS, META_VERSION, MODERN

pytestmark = pytest.mark.anyio

BODY = 64 << 10  # max_body_bytes here
HELD = 4  # bodies of nearly BODY bytes one caller may have in progress


server = callers_server(max_body_bytes=BODY, max_request_bytes_per_caller=HELD * BODY)


async def _call(
    http: httpx.AsyncClient, url: str, who: str, name: str, arguments: dict[str, Any]
) -> httpx.Response:
    """A 2026-07-28 ``tools/call`` padded (in ``_meta``) to nearly ``BODY`` bytes."""
    meta: dict[str, Any] = {META_VERSION: MODERN, META_CAPS: {}, "pad": ""}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
    body["params"] = {"name": name, "arguments": arguments, "_meta": meta}
    meta["pad"] = "x" * (BODY - len(json.dumps(body)) - 64)
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "tools/call",
        "Mcp-Name": name,
        "Authorization": f"Bearer {token_of(who)}",
    }
    return await http.post(url, json=body, headers=headers)


async def test_mallorys_large_requests_in_progress_are_her_share_of_bytes(
    server: HttpServer, conformance_exposed: tuple[Registry, MemorySink]
) -> None:
    """With four of mallory's large requests in progress (slow calls), her fifth is refused
    429 naming the share; alice's large request is answered. Control: mallory's four are
    still running when she is refused."""
    registry = conformance_exposed[0]
    slow, simple = tool(registry, "slow_compute"), tool(registry, "simple_text")
    gate = registry.gate("conformance")
    async with httpx.AsyncClient(timeout=120) as http, anyio.create_task_group() as tg:
        for _ in range(HELD):
            tg.start_soon(_call, http, server.url, "mallory", slow, {"seconds": 60})
        with anyio.fail_after(60):
            while gate.running < HELD:
                await anyio.sleep(0.02)
        fifth = await _call(http, server.url, "mallory", slow, {"seconds": 60})
        assert gate.running == HELD  # the control: her four still hold their bodies
        alice = await _call(http, server.url, "alice", simple, {})
        tg.cancel_scope.cancel()
    assert fifth.status_code == 429, fifth.text
    assert "request body bytes in progress" in fifth.text, fifth.text
    assert alice.status_code == 200, alice.text
    assert "error" not in alice.text[:400], alice.text[:400]
