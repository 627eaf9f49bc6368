"""The official conformance suite through two entry nodes behind a round-robin balancer."""

from __future__ import annotations

import itertools
import re
import socket
import subprocess
from collections.abc import Iterator
from functools import partial
from typing import Any

import anyio
import httpx2
import pytest
import uvicorn
from test_conformance_cluster import SUITE

from support.cluster import EntryNodes, NodeProc

pytestmark = pytest.mark.anyio

# Hop-by-hop headers, and those the proxy's own HTTP layers set again.
_DROP = {"host", "connection", "keep-alive", "transfer-encoding", "content-length"}


class Balancer:
    """An HTTP reverse proxy with no affinity: each request goes to the next backend."""

    def __init__(self, backends: list[str]) -> None:
        self._backends = [httpx2.URL(b) for b in backends]
        self._turn = itertools.count()
        self.sent: list[int] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The ASGI app: stream the request to a backend and its answer back."""
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        target = self._backends[next(self._turn) % len(self._backends)]
        self.sent.append(int(target.port or 0))
        url = target.copy_with(path=scope["path"], query=scope.get("query_string") or None)
        headers = [(k.decode(), v.decode()) for k, v in scope["headers"] if k.decode() not in _DROP]
        async with (
            httpx2.AsyncClient(timeout=300) as client,
            client.stream(scope["method"], url, headers=headers, content=body) as answer,
        ):
            await send(
                {
                    "type": "http.response.start",
                    "status": answer.status_code,
                    "headers": [
                        (k.encode(), v.encode())
                        for k, v in answer.headers.multi_items()
                        if k.lower() not in _DROP
                    ],
                }
            )
            async for chunk in answer.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


@pytest.fixture
def entry_pair(bus_entry_nodes: EntryNodes) -> Iterator[tuple[NodeProc, NodeProc]]:
    """node-b (worker, conformance skill), node-a and node-c (entry-only, one shared key)."""
    # Task records in JetStream KV: any entry node answers.
    with bus_entry_nodes(extra=["--cluster-kv"]) as (_, a, c):
        yield a, c


@pytest.mark.slow
async def test_every_2026_07_28_scenario_passes_through_a_round_robin_pair(
    entry_pair: tuple[NodeProc, NodeProc],
) -> None:
    """Every scored 2026-07-28 scenario and the tasks extension pass when each HTTP request
    of the suite goes to the next of two entry nodes (skills on a worker): rounds whose
    retries land on the other node are forwarded to the one holding the call, and task
    records live in JetStream KV."""
    assert SUITE.exists(), f"the conformance runner is not at {SUITE}"
    a, c = entry_pair
    assert a.url is not None
    assert c.url is not None
    balancer = Balancer([a.url, c.url])
    config = uvicorn.Config(
        balancer,
        log_level="warning",
        lifespan="off",
        # The suite leaves listen streams open: shutdown ends them instead of waiting.
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    # Listening before the server starts: the suite's first connection waits in the backlog.
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(server.serve, sockets=[sock]))
        done = await anyio.to_thread.run_sync(
            lambda: subprocess.run(
                [str(SUITE), f"http://127.0.0.1:{port}/mcp", "--requirements", "2026-07-28"],
                capture_output=True,
                text=True,
                timeout=900,
                check=False,
            )
        )
        server.should_exit = True
    summary = done.stdout.strip().splitlines()[-1]
    assert summary == "scenarios: 37 passed, 0 failed", done.stdout[-4000:]
    # The tasks extension (not scored) whole, too: a task made on one entry node is read,
    # updated and cancelled through the other, and a required task tool's input rounds
    # reach the node that owns the call whichever node the retry lands on.
    passed = set(re.findall(r"^\s*✓ (tasks-[\w-]+)", done.stdout, re.MULTILINE))
    failed = set(re.findall(r"^\s*✗ (tasks-[\w-]+)", done.stdout, re.MULTILINE))
    assert (len(passed), failed) == (10, set()), done.stdout[-4000:]
    assert len(set(balancer.sent)) == 2
    assert "forwarded retry from" in a.log() + c.log()
