"""A 2025-11-25 session is its caller's (issue #28 item 4), over real HTTP with two named
tokens: mallory, holding alice's ``Mcp-Session-Id``, cannot set alice's logging level nor
subscribe in her session; she gets exactly what a session that does not exist gets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from skilld.audit import MemorySink
from skilld.mcp import HttpServer, ServeConfig
from skilld.registry import Registry
from support.callers import open_to_authenticated
from support.mcp_fakes import running_http

pytestmark = pytest.mark.anyio

ALICE = "alice-0123456789abcdefghijklmnopqrstuvwxyz"  # the bearer tokens: who calls
MALLORY = "mallory-0123456789abcdefghijklmnopqrstuvw"
LEGACY = "2025-11-25"


@pytest.fixture
async def server(
    conformance: tuple[Registry, MemorySink], tmp_path: Path
) -> AsyncIterator[HttpServer]:
    """The conformance skill; callers alice and mallory."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice {ALICE}\nmallory {MALLORY}\n")
    tokens.chmod(0o600)
    config = ServeConfig(transport="http", port=0, token_file=tokens)
    async with running_http(open_to_authenticated(conformance[0]), config) as srv:
        yield srv


async def post(
    http: httpx.AsyncClient,
    url: str,
    who: str,
    body: dict[str, Any],
    session: str | None = None,
) -> httpx.Response:
    """One JSON-RPC message as ``who``, in ``session`` when given."""
    headers = {
        "Accept": "application/json, text/event-stream",
        "Authorization": f"Bearer {who}",
        "MCP-Protocol-Version": LEGACY,
    }
    if session is not None:
        headers["Mcp-Session-Id"] = session
    return await http.post(url, json=body, headers=headers)


async def open_session(http: httpx.AsyncClient, url: str, who: str) -> str:
    """An initialized 2025-11-25 session of ``who``: its id."""
    hello = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": LEGACY,
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    opened = await post(http, url, who, hello)
    assert opened.status_code == 200, opened.text
    session = opened.headers["mcp-session-id"]
    done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert (await post(http, url, who, done, session)).status_code == 202
    return session


async def test_another_callers_session_is_one_that_does_not_exist(server: HttpServer) -> None:
    """mallory's logging/setLevel and resources/subscribe in alice's session get the same
    status and body as in a made-up session; alice's own requests there are answered."""
    level = {"jsonrpc": "2.0", "id": 1, "method": "logging/setLevel", "params": {"level": "debug"}}
    subscribe = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "resources/subscribe",
        "params": {"uri": "skill://conformance/anything"},
    }
    async with httpx.AsyncClient(timeout=30) as http:
        url = server.url
        alices = await open_session(http, url, ALICE)
        made_up = "0" * len(alices)
        for body in (level, subscribe):
            theirs = await post(http, url, MALLORY, body, alices)
            never = await post(http, url, MALLORY, body, made_up)
            assert theirs.status_code == never.status_code == 404, theirs.text
            assert theirs.text == never.text
        own = await post(http, url, ALICE, level, alices)
        assert own.status_code == 200 and '"result"' in own.text, own.text
        # mallory's own session is hers to set
        mine = await post(http, url, MALLORY, level, await open_session(http, url, MALLORY))
        assert mine.status_code == 200 and '"result"' in mine.text, mine.text
