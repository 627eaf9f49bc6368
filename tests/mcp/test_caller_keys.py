"""Who calls, as the MCP entry learns it: a bearer token's caller whatever the header's
spelling, named in the audit record; tasks belong to that caller; a routed call's caller
carried in its sealed message is read strictly."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx2 as httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_mcp_rounds import MODERN, tool
from test_tasks_notify import META

from skilld.audit import MemorySink
from skilld.cluster._worker import _routed_caller
from skilld.errors import UsageError
from skilld.mcp import HttpServer
from skilld.registry import Registry
from skilld.types import Caller
from support.mcp_fakes import callers_server, token_of

pytestmark = pytest.mark.anyio

ALICE, BOB = f"Bearer {token_of('alice')}", f"Bearer {token_of('bob')}"


# The conformance skill over HTTP with two bearer tokens.
server = callers_server("alice", "bob")


async def _rpc(
    http: httpx.AsyncClient, url: str, method: str, params: dict[str, Any], auth: str
) -> dict[str, Any]:
    """One 2026-07-28 request with ``Authorization: auth``; its JSON-RPC message."""
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": method,
        "Authorization": auth,
    }
    named = params.get("name") or params.get("taskId")
    if named:
        headers["Mcp-Name"] = named
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": META}}
    response = await http.post(url, json=body, headers=headers)
    if response.headers.get("content-type", "").startswith("application/json"):
        message: dict[str, Any] = response.json()
        return message
    data = [line[5:] for line in response.text.splitlines() if line.startswith("data:")]
    last: dict[str, Any] = json.loads(data[-1])
    return last


async def test_the_audit_names_the_tokens_caller_never_the_token(
    server: HttpServer, conformance_exposed: tuple[Registry, MemorySink]
) -> None:
    """A tools/call with alice's token is audited as her caller (label and principal)."""
    registry, sink = conformance_exposed
    async with httpx.AsyncClient(timeout=30) as http:
        answer = await _rpc(
            http, server.url, "tools/call", {"name": tool(registry, "simple_text")}, ALICE
        )
    assert "result" in answer, answer
    record = next(r for r in sink.records if r.get("event") == "call")
    assert record["caller"] == record["principal"] == "token:alice"
    assert token_of("alice") not in json.dumps(record)


async def test_a_tokens_spellings_are_one_caller_for_tasks(
    server: HttpServer, conformance_exposed: tuple[Registry, MemorySink]
) -> None:
    """A task made with 'Bearer alice' answers 'bearer alice' and 'BEARER alice' (one
    caller), and reads as unknown to bob."""
    registry = conformance_exposed[0]
    name = tool(registry, "slow_compute")
    async with httpx.AsyncClient(timeout=30) as http:
        made = await _rpc(
            http,
            server.url,
            "tools/call",
            {"name": name, "arguments": {"seconds": 60}},
            ALICE,
        )
        task_id = made["result"]["taskId"]
        for spelling in (f"bearer {token_of('alice')}", f"BEARER {token_of('alice')}"):
            got = await _rpc(http, server.url, "tasks/get", {"taskId": task_id}, spelling)
            assert got["result"]["taskId"] == task_id, (spelling, got)
        theirs = await _rpc(http, server.url, "tasks/get", {"taskId": task_id}, BOB)
        assert theirs["error"]["code"] == -32602, theirs
        done = await _rpc(http, server.url, "tasks/cancel", {"taskId": task_id}, ALICE.lower())
        assert "result" in done, done
        with anyio.fail_after(15):
            while (await _rpc(http, server.url, "tasks/get", {"taskId": task_id}, ALICE))["result"][
                "status"
            ] != "cancelled":
                await anyio.sleep(0.05)


def test_a_routed_caller_is_the_entry_nodes_caller_arriving_from_it() -> None:
    """The worker names the carried caller as arriving from the verified sender."""
    carried = Caller.token("abc").as_skill("notes").as_dict()
    caller = _routed_caller(carried, "node-a")
    assert caller.label() == "node:node-a<skill:notes<token:abc"
    assert caller.key == "token:abc"
    assert _routed_caller(None, "node-a") == Caller("node", "node-a")


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(
    st.dictionaries(
        st.sampled_from(["kind", "name", "issuer", "scopes", "groups", "via", "x"]),
        _JSON | st.sampled_from(["oauth", "token", "local", "anonymous", "skill", "node"]),
        max_size=6,
    )
    | _JSON
)
def test_a_malformed_routed_caller_is_refused_as_usage(carried: Any) -> None:
    """Whatever a (verified) message carries as its caller: a Caller or a UsageError."""
    try:
        caller = _routed_caller(carried, "node-a")
    except UsageError:
        return
    assert caller.kind == "node" and caller.name == "node-a"
