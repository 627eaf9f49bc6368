"""A session's resource subscriptions are bounded (DESIGN.md: "every shared resource ... is
shared out per caller"), over real HTTP with the SDK client and two named tokens.

A 2025-11-25 session keeps the URIs it subscribed to in the server's memory for as long as
it lives. Any URI a resource template matches could be subscribed to, as long as the
request body allows (4 MiB), as many as the client liked: mallory's 64 sessions could make
the server hold gigabytes, and every client lose it.
"""

from __future__ import annotations

import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from skilld.mcp import HttpServer
from skilld.mcp._surfaces import MAX_SUBSCRIBED_URI, MAX_SUBSCRIPTIONS
from support.mcp_fakes import callers_server, token_of

pytestmark = pytest.mark.anyio


# The conformance skill (a resource template ``test://template/{id}/data``); alice and
# mallory.
server = callers_server(registry="conformance")


def _uri(n: int, pad: int = 0) -> str:
    return f"test://template/{n}{'x' * pad}/data"


async def test_a_sessions_subscriptions_are_bounded(server: HttpServer) -> None:
    """mallory's session subscribes up to the cap; the next URI is refused naming it (one
    already held is still accepted), and so is a URI longer than the bound; alice's
    session subscribes as before."""
    headers = {"Authorization": f"Bearer {token_of('mallory')}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        streamable_http_client(server.url, http_client=http) as (read, write),
        ClientSession(read, write) as mallory,
    ):
        await mallory.initialize()
        for n in range(MAX_SUBSCRIPTIONS):
            await mallory.subscribe_resource(_uri(n))
        with pytest.raises(MCPError, match=f"at most {MAX_SUBSCRIPTIONS}"):
            await mallory.subscribe_resource(_uri(MAX_SUBSCRIPTIONS))
        await mallory.subscribe_resource(_uri(0))  # held already: no new room taken
        await mallory.unsubscribe_resource(_uri(1))
        await mallory.subscribe_resource(_uri(MAX_SUBSCRIPTIONS))  # the freed room
        with pytest.raises(MCPError, match=f"longer than {MAX_SUBSCRIBED_URI}"):
            await mallory.subscribe_resource(_uri(-1, pad=MAX_SUBSCRIBED_URI))
    headers = {"Authorization": f"Bearer {token_of('alice')}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        streamable_http_client(server.url, http_client=http) as (read, write),
        ClientSession(read, write) as alice,
    ):
        await alice.initialize()
        await alice.subscribe_resource(_uri(7))
