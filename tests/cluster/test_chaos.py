"""Chaos as the NATS project tests itself: kill -9 nats-server and workers at random.

For CHAOS_S seconds a thread kills (SIGKILL) nats-server or one of two worker replicas at
random intervals of 0-2 s and starts it again, while an MCP client sends a stream of
sequenced calls through the entry node, each writing one key to clustered kv (JetStream
KV, synced before its ack). Afterwards every acknowledged write is in the bucket, no call
ran twice on the workers, every answer is the one its call asked for (the entry takes
only its routed node's signed answer, once), and the entry answered every call.
docs/cluster.md records a run's numbers.
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
import time
from collections import Counter
from pathlib import Path

import anyio
import pytest
from mcp import types

from skilld.cluster import ClusterConfig
from skilld.cluster._kv import JetStreamKV
from skilld.cluster._link import NatsLink
from support.cluster import Keys, NatsServer, NodeProc, mcp_client, start_node

CHAOS_S = 45.0
WORKERS = ("node-w1", "node-w2")


def _input_sha(args: dict[str, object]) -> str:
    return hashlib.sha256(
        json.dumps(args, separators=(",", ":"), sort_keys=True).encode()
    ).hexdigest()


@pytest.mark.slow
@pytest.mark.anyio
async def test_bouncing_nats_and_workers_loses_no_acknowledged_write(
    bus_nats: tuple[NatsServer, Path],
    keys: Keys,
    hostile_bundle: Path,
    gateway_bundle: Path,
    tmp_path: Path,
) -> None:
    """kill -9 of nats-server and replicas at 0-2 s intervals: lost 0, none answered twice."""
    began = time.monotonic()
    server, bus = bus_nats  # the documented bus (JetStream synced before each ack)
    lives: dict[str, list[NodeProc]] = {w: [] for w in WORKERS}

    def worker(name: str) -> NodeProc:
        node = start_node(
            name,
            hostile_bundle,
            server.url,
            keys.member,
            tmp_path / name,
            http=False,
            extra=["--cluster-kv"],
            bus=bus,
        )
        lives[name].append(node)
        return node

    for name in WORKERS:
        worker(name)
    entry = start_node(
        "node-a",
        gateway_bundle,
        server.url,
        keys.member,
        tmp_path / "a",
        extra=["--entry-only"],
        bus=bus,
    )
    stop = threading.Event()
    kills: Counter[str] = Counter()
    chaos_errors: list[str] = []

    def chaos() -> None:
        rng = random.Random(21)
        while not stop.wait(rng.uniform(0, 2)):
            victim = rng.choice(["nats", *WORKERS])
            try:
                if victim == "nats":
                    server.kill()
                    server.start()  # the same port and store
                else:
                    lives[victim][-1].kill()
                    # A worker that starts while nats-server is down exits: try again.
                    for _ in range(5):
                        try:
                            worker(victim)
                            break
                        except RuntimeError:
                            continue
                kills[victim] += 1
            except Exception as exc:
                chaos_errors.append(repr(exc))

    acknowledged: list[str] = []
    failed: list[str] = []
    wrong: list[str] = []
    slowest = 0.0
    calls = 0
    bouncer = threading.Thread(target=chaos, daemon=True)
    try:
        assert entry.url is not None
        async with mcp_client(entry.url) as client:
            await client.wait_tools(lambda n: "hostile/write_keys" in n)
            bouncer.start()
            end = time.monotonic() + CHAOS_S
            while time.monotonic() < end:
                prefix = f"s{calls:05d}-"
                calls += 1
                started = time.monotonic()
                with anyio.fail_after(30):  # the entry answers every call, one way or another
                    result = await client.session.call_tool(
                        "hostile/write_keys", {"count": 1, "prefix": prefix}
                    )
                slowest = max(slowest, time.monotonic() - started)
                text = "".join(b.text for b in result.content if isinstance(b, types.TextContent))
                if result.is_error:
                    failed.append(text)
                elif text.strip() != "1":
                    wrong.append(text)
                else:
                    acknowledged.append(f"{prefix}000000")
        stop.set()
        bouncer.join(timeout=60)
    finally:
        stop.set()
        entry.stop()
        for node in lives.values():
            node[-1].stop()
    # Every acknowledged write is in the bucket.
    if server.proc is None or server.proc.poll() is not None:
        server.start()
    config = ClusterConfig(
        url=server.url,
        node="node-check",
        key_file=tmp_path / "unused.pem",
        nkey_seed_file=bus / "node-check.nk",
        tls_ca=bus / "ca.pem",
    )
    link = NatsLink(config)
    link.start()
    try:
        kv = link.run(JetStreamKV.open(link, "hostile", 1 << 20, 64 << 20), timeout=30)
        stored = set(kv.keys("s", 100_000))
    finally:
        link.close()
    lost = sorted(set(acknowledged) - stored)
    # No call ran twice: each sequenced input appears at most once in all workers' audits.
    ran = Counter(
        r["input_sha256"]
        for node in (n for ls in lives.values() for n in ls)
        for r in node.audit()
        if r["event"] == "call" and r["method"] == "write_keys"
    )
    twice = [h for h, n in ran.items() if n > 1]
    refused = [r for r in entry.audit() if r["event"] == "cluster-refused"]
    summary = {
        "seconds": round(time.monotonic() - began, 1),
        "calls": calls,
        "kills": dict(kills),
        "acknowledged": len(acknowledged),
        "failed": len(failed),
        "lost": len(lost),
        "ran_twice": len(twice),
        "slowest_answer_s": round(slowest, 2),
    }
    print("chaos:", json.dumps(summary))
    assert not chaos_errors, chaos_errors
    assert sum(kills.values()) >= 10, summary
    assert kills["nats"] >= 2 and all(kills[w] >= 2 for w in WORKERS), summary
    assert lost == [], (lost, summary)
    assert twice == [], summary
    assert wrong == [], wrong
    assert not refused, refused  # nothing forged, nothing answered for another call
    assert len(acknowledged) >= calls // 4, summary
    assert all(t.startswith("[unavailable]") or "deadline" in t.lower() for t in failed), failed[:5]
    assert {_input_sha({"count": 1, "prefix": a[:-6]}) for a in acknowledged} <= set(ran)
