"""A 2026-07-28 (stateless) MCP request over plain HTTP, as a named token's client sends it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import httpx2 as httpx

MODERN = "2026-07-28"
META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPS = "io.modelcontextprotocol/clientCapabilities"


async def call_as(
    http: httpx.AsyncClient,
    url: str,
    who: str,
    name: str,
    arguments: Mapping[str, Any] | None = None,
    *,
    caps: Mapping[str, Any] | None = None,
    state: str | None = None,
    responses: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A ``tools/call`` of ``name`` as the bearer token ``who``, from a client of ``caps``
    (none by default: its call can park no round); a retry of the round ``state`` names
    when given, bringing ``responses``. Its JSON-RPC message (the last one of a stream)."""
    params: dict[str, Any] = {"name": name, "arguments": dict(arguments or {})}
    if state is not None:
        params.update(inputResponses=dict(responses or {}), requestState=state)
    meta = {META_VERSION: MODERN, META_CAPS: dict(caps or {})}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {**params, "_meta": meta}}
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "tools/call",
        "Mcp-Name": name,
        "Authorization": f"Bearer {who}",
    }
    response = await http.post(url, json=body, headers=headers)
    if response.headers.get("content-type", "").startswith("application/json"):
        message: dict[str, Any] = response.json()
        return message
    data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
    last: dict[str, Any] = json.loads(data[-1])
    return last
