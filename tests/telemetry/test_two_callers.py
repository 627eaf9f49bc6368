"""Two token callers of one served node with tracing on, as two clients of one server
would try it: mallory holds answers unread and bursts calls; alice is served throughout.

mallory opens 16 ``tools/call`` requests on raw sockets whose 60 KB answers she never
reads (a 4 KB receive buffer), then sends 200 calls at once. Her caps answer what is
past her share with 429; alice, calling every 20 ms meanwhile and after, gets every
answer, her calls are traced in her own trace, and the node logs no error.
"""

from __future__ import annotations

import asyncio
import collections
import json
import shutil
import socket
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp.client.session import ClientSession

from skilld.bundle import build_bundle
from skilld.sandbox import Sandbox
from support.env import SKILLS, cache_dir
from support.mcp_fakes import as_caller, client_tokens, token_of
from support.otlp import otlp_receiver
from support.serve_process import ServeProcess

pytestmark = pytest.mark.anyio

MALLORY = token_of("mallory")
ALICE_TRACE = "00-" + "a1" * 16 + "-" + "b2" * 8 + "-01"
ACCEPT = "application/json, text/event-stream"
VERSION = "2025-11-25"


@pytest.fixture(scope="module")
def shared(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A bundle of echo that the callers alice and mallory may both call, and their
    token file."""
    root = tmp_path_factory.mktemp("two-callers")
    shutil.copytree(SKILLS["echo"], root / "skills" / "echo")
    (root / "policies" / "callers").mkdir(parents=True)
    (root / "policies" / "echo.yaml").write_text("skill: echo\n")
    (root / "policies" / "callers" / "team.yaml").write_text(
        "rules:\n  - id: both\n    who: [{token: alice}, {token: mallory}]\n    skills: [echo]\n"
    )
    build_bundle(
        root / "skills",
        root / "policies",
        root / "bundle",
        sandbox=sandbox,
        cache_dir=cache_dir(),
        strict=False,
    )
    return root / "bundle", client_tokens(root, "alice", "mallory")


async def _alice(url: str, calls: int, errors: list[str], traced: bool = False) -> int:
    """alice's calls of echo, one every 20 ms; how many were answered."""

    async def calling(session: ClientSession) -> int:
        answered = 0
        for n in range(calls):
            meta = {"traceparent": ALICE_TRACE} if traced else None
            try:
                result = await asyncio.wait_for(
                    session.call_tool("echo/echo", {"text": f"a{n}"}, meta=meta), 60
                )
            except Exception as exc:
                errors.append(repr(exc)[:200])
            else:
                if result.is_error:
                    errors.append(str(result.content)[:200])
                else:
                    answered += 1
            await asyncio.sleep(0.02)
        return answered

    return await as_caller(url, "alice", calling)


async def _session(http: httpx2.AsyncClient, url: str) -> str:
    hello = {
        "protocolVersion": VERSION,
        "capabilities": {},
        "clientInfo": {"name": "m", "version": "1"},
    }
    first = await http.post(
        url,
        json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello},
        headers={"Accept": ACCEPT},
    )
    session = first.headers["mcp-session-id"]
    await http.post(
        url,
        json={"jsonrpc": "2.0", "method": "notifications/initialized"},
        headers={"Accept": ACCEPT, "mcp-session-id": session, "mcp-protocol-version": VERSION},
    )
    return session


def _stall(url: str, session: str, count: int) -> list[socket.socket]:
    """``count`` tools/call POSTs of mallory whose 60 KB answers are never read."""
    host, port = url.split("//")[1].split("/")[0].rsplit(":", 1)
    held = []
    for n in range(count):
        sock = socket.create_connection((host, int(port)))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        call = {"name": "echo/echo", "arguments": {"text": "x" * 60_000}}
        body = json.dumps({"jsonrpc": "2.0", "id": 100 + n, "method": "tools/call", "params": call})
        head = (
            f"POST /mcp HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {MALLORY}\r\n"
            f"Accept: {ACCEPT}\r\nContent-Type: application/json\r\nmcp-session-id: {session}\r\n"
            f"mcp-protocol-version: {VERSION}\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        sock.sendall(head.encode() + body.encode())
        held.append(sock)
    return held


async def _burst(http: httpx2.AsyncClient, url: str, session: str, count: int) -> list[Any]:
    """``count`` tools/call POSTs of mallory at once: each one's status (or error)."""
    headers = {"Accept": ACCEPT, "mcp-session-id": session, "mcp-protocol-version": VERSION}

    async def one(n: int) -> Any:
        call = {"name": "echo/echo", "arguments": {"text": f"m{n}"}}
        message = {"jsonrpc": "2.0", "id": 1000 + n, "method": "tools/call", "params": call}
        try:
            return (await http.post(url, json=message, headers=headers)).status_code
        except Exception as exc:
            return type(exc).__name__

    return list(await asyncio.gather(*(one(n) for n in range(count))))


async def test_mallorys_stalls_and_burst_cost_alice_nothing_with_tracing_on(
    shared: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle, tokens = shared
    with otlp_receiver() as receiver:
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        node = ServeProcess(bundle, tmp_path / "state", extra=("--token-file", str(tokens)))
        held: list[socket.socket] = []
        try:
            url = node.url
            errors: list[str] = []
            limits = httpx2.Limits(max_connections=200)
            headers = {"Authorization": f"Bearer {MALLORY}"}
            async with httpx2.AsyncClient(headers=headers, timeout=60, limits=limits) as http:
                session = await _session(http, url)
                held = _stall(url, session, 16)
                alice = asyncio.create_task(_alice(url, 40, errors))
                await asyncio.sleep(0.3)
                outcomes = await _burst(http, url, session, 200)
                during = await alice
            for sock in held:
                sock.close()
            after = await _alice(url, 5, errors, traced=True)
            spans = receiver.wait(
                lambda seen: (
                    sum(
                        s.trace_id == ALICE_TRACE[3:35] and s.name == "tools/call echo/echo"
                        for s in seen
                    )
                    >= 5
                )
            )
        finally:
            for sock in held:
                sock.close()
            node.stop()
    assert errors == [], errors
    assert (during, after) == (40, 5)
    statuses = collections.Counter(outcomes)
    # Only answers or her own share's refusals: nothing failed, nothing was cut off.
    assert set(statuses) <= {200, 429}, statuses
    # Her share of requests in progress (64, 16 of them held) answered the rest 429
    # (65 answered and 135 refused in each of three runs here).
    assert statuses[200] >= 1 and statuses[429] >= 1, statuses
    alices = [s for s in spans if s.trace_id == ALICE_TRACE[3:35]]
    requests = [s for s in alices if s.name == "tools/call echo/echo"]
    assert len(requests) == 5, [s.name for s in alices]
    assert all(s.parent_id == ALICE_TRACE[36:52] for s in requests), requests
    # Anything else in her trace (a run that took long enough to be a span) hangs
    # beneath her own requests' spans.
    ids = {s.span_id for s in alices}
    assert all(s.parent_id in ids for s in alices if s not in requests), alices
    failures = [e for e in node.events() if e.get("level") in ("error", "critical")]
    assert failures == [], failures
