"""A worker's threads are no caller's to hold (DESIGN.md: "one caller at its caps never makes
another wait or fail"), through an entry node with two named tokens and a real nats-server.

mallory sends 40 long calls of the conformance skill (16 slots on the worker: her share is
12) through entry node-a, each inside her caps there (64 requests, three quarters of the
entry's 64 slots of a remote skill). The worker used to take one of its 32 threads for
each routed call before the call waited for its slot, so mallory's 28 waiting calls held
every thread left, and alice's call of another skill (echo, 2 s wall time) sat in the
thread queue until its deadline.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2 as httpx
import pytest
from test_tasks_cluster import rpc

from skilld.mcp._auth import METRICS_SCOPE
from support.cluster import Keys, NatsServer, NodeProc, entry_in_flight, start_node
from support.mcp_fakes import token_of

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

MALLORYS = 40


@pytest.fixture
def entry(
    bus_nats: tuple[NatsServer, Path],
    keys: Keys,
    demo_cluster_bundle: Path,
    gateway_bundle: Path,
    tmp_path: Path,
) -> Iterator[NodeProc]:
    """node-a, entry-only, authenticating alice, mallory and ops (who may read /metrics);
    node-b, the worker holding the conformance and echo skills."""
    nats, bus = bus_nats
    tokens = tmp_path / "tokens"
    tokens.write_text(
        f"alice {token_of('alice')}\nmallory {token_of('mallory')}\n"
        f"ops {token_of('ops')} {METRICS_SCOPE}\n"
    )
    tokens.chmod(0o600)
    worker = start_node(
        "node-b", demo_cluster_bundle, nats.url, keys.member, tmp_path / "b", http=False, bus=bus
    )
    started = [worker]
    try:
        a = start_node(
            "node-a",
            gateway_bundle,
            nats.url,
            keys.member,
            tmp_path / "a",
            extra=["--entry-only", "--token-file", str(tokens)],
            bus=bus,
        )
        started.append(a)
        a.seen(r"node node-b joined \(7 skills\)")
        yield a
    finally:
        for node in reversed(started):
            node.stop()


async def test_mallorys_waiting_calls_leave_alice_a_worker_thread(entry: NodeProc) -> None:
    """With mallory's 40 long calls in flight (12 running on the worker, the rest waiting for
    her share of the skill's slots), alice's echo is answered. Control: none of mallory's
    calls has ended when alice's answer comes."""
    assert entry.url is not None
    url = entry.url
    answered: list[dict[str, object]] = []
    slow = {"name": "slow_compute", "arguments": {"seconds": 90, "label": "m"}}
    async with httpx.AsyncClient(timeout=180) as http, anyio.create_task_group() as tg:

        async def mallory() -> None:
            answered.append(
                await rpc(http, url, "tools/call", slow, extensions=False, who="mallory")
            )

        for _ in range(MALLORYS):
            tg.start_soon(mallory)
        with anyio.fail_after(60):
            while await entry_in_flight(http, url) < MALLORYS:
                await anyio.sleep(0.1)
        with anyio.fail_after(60):
            echo = {"name": "echo/echo", "arguments": {"text": "alice's"}}
            alice = await rpc(http, url, "tools/call", echo, extensions=False, who="alice")
        assert answered == []  # the control: mallory's calls still hold what they hold
        tg.cancel_scope.cancel()  # mallory's calls end with the nodes
    assert "error" not in alice, alice
    assert not alice["result"].get("isError"), alice
    assert "alice's" in str(alice["result"]["content"]), alice
