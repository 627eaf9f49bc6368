"""2026-07-28 (stateless) MCP requests over plain HTTP, as a client sends them."""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping
from typing import Any

import httpx2 as httpx

MODERN = "2026-07-28"
META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPS = "io.modelcontextprotocol/clientCapabilities"


async def modern(
    http: httpx.AsyncClient,
    url: str,
    method: str,
    params: Mapping[str, Any],
    caps: Mapping[str, Any] | None = None,
    *,
    token: str | None = None,
    scheme: str = "Bearer",
) -> httpx.Response:
    """One 2026-07-28 request, with the headers and ``_meta`` the revision asks for: from a
    client of ``caps`` (elicitation by default), as the bearer ``token`` when given (its
    scheme spelled ``scheme``)."""
    body, headers = _request(method, params, {"elicitation": {}} if caps is None else caps)
    if token is not None:
        headers["Authorization"] = f"{scheme} {token}"
    return await http.post(url, json=body, headers=headers)


def _request(
    method: str, params: Mapping[str, Any], caps: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The JSON-RPC message of a 2026-07-28 request from a client of ``caps`` and its
    headers (``Mcp-Name`` from a tool's or prompt's ``name``, a resource's ``uri``)."""
    meta = {META_VERSION: MODERN, META_CAPS: dict(caps)}
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": method,
    }
    name = params.get("name", params.get("uri"))
    if name is not None:
        headers["Mcp-Name"] = str(name)
    return body, headers


def payload(response: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC message of a response (plain JSON or the last SSE data line)."""
    if response.headers.get("content-type", "").startswith("application/json"):
        message: dict[str, Any] = response.json()
        return message
    data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
    last: dict[str, Any] = json.loads(data[-1])
    return last


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
    return payload(await modern(http, url, "tools/call", params, caps or {}, token=who))


def stalled(
    url: str, method: str, params: Mapping[str, Any], token: str, scheme: str = "Bearer"
) -> socket.socket:
    """A 2026-07-28 request (``params`` of ``method``, with ``Mcp-Name`` from its ``name``
    or ``uri``) as the bearer ``token`` (its scheme spelled ``scheme``), sent on a socket
    that reads as little as it can (a tiny receive buffer, set before connecting) and is
    not read: its answer waits in the server. The caller closes the socket."""
    parts = httpx.URL(url)
    message, headers = _request(method, params, {})
    headers.update({"Content-Type": "application/json", "Authorization": f"{scheme} {token}"})
    body = json.dumps(message).encode()
    head = f"POST {parts.path} HTTP/1.1\r\nHost: {parts.host}:{parts.port}\r\n" + "".join(
        f"{key}: {value}\r\n" for key, value in headers.items()
    )
    head += f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((parts.host, parts.port or 80))
    sock.sendall(head.encode() + body)
    return sock
