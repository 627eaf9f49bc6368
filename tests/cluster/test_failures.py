"""Failures of a cluster with real processes: kill -9, NATS down, forged announcements, replicas."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import nats as nats_client
import pytest
from mcp import types

from skilld.package import canonical_json, load_private_key
from support.cluster import (
    Keys,
    NatsServer,
    NodeProc,
    mcp_client,
    replicas_behind_entry,
    start_node,
)
from support.mcp_fakes import text_of as _text

pytestmark = pytest.mark.anyio

HOSTILE_TOOLS = {"hostile/ok", "hostile/loop"}
HEARTBEAT_S = 0.5
EXPIRY_S = 2.5 * HEARTBEAT_S


@pytest.fixture
def pair(
    nats: NatsServer, keys: Keys, hostile_bundle: Path, gateway_bundle: Path, tmp_path: Path
) -> Iterator[dict[str, NodeProc]]:
    """node-a: an entry-only node; node-c: a worker holding the hostile skill (2 s wall time)."""
    nodes: dict[str, NodeProc] = {}
    try:
        nodes["c"] = start_node(
            "node-c", hostile_bundle, nats.url, keys.member, tmp_path / "c", http=False
        )
        nodes["a"] = start_node(
            "node-a", gateway_bundle, nats.url, keys.member, tmp_path / "a", extra=["--entry-only"]
        )
        yield nodes
    finally:
        for node in nodes.values():
            node.stop()


async def test_kill_9_removes_tools_and_fails_the_call_in_flight(pair: dict[str, NodeProc]) -> None:
    """kill -9 of a node: its tools vanish within 3 s; a call in flight ends [unavailable]."""
    url = pair["a"].url
    assert url is not None
    async with mcp_client(url) as client, anyio.create_task_group() as tg:
        await client.wait_tools(lambda n: n >= HOSTILE_TOOLS)
        outcome: list[tuple[types.CallToolResult, float]] = []

        async def call() -> None:
            started = time.monotonic()
            result = await client.session.call_tool("hostile/loop", {})
            outcome.append((result, time.monotonic() - started))

        tg.start_soon(call)
        # Not synchronisation: had the call not reached node-c yet, the outcome must be the
        # same; the pause makes "running on node-c" the case this test exercises.
        await anyio.sleep(0.3)
        pair["c"].kill()
        killed = time.monotonic()
        names = await client.wait_tools(lambda n: not n & HOSTILE_TOOLS, timeout=10)
        gone_after = time.monotonic() - killed
        assert not names & HOSTILE_TOOLS
        assert gone_after < 3.0, f"tools vanished {gone_after:.2f}s after kill -9"
    result, took = outcome[0]
    assert result.is_error
    assert _text(result).startswith("[unavailable]"), _text(result)
    assert "node-c" in _text(result)
    assert took < 2.0 + 1.0, f"the call took {took:.2f}s against a 2 s deadline"


async def test_nats_down_for_three_expiry_windows_drops_nobody(
    nats: NatsServer, pair: dict[str, NodeProc]
) -> None:
    """NATS stopped for 3x the expiry window and back: no node dropped, tools back at once."""
    url = pair["a"].url
    assert url is not None
    async with mcp_client(url) as client:
        await client.wait_tools(lambda n: n >= HOSTILE_TOOLS)
        nats.stop()
        await anyio.to_thread.run_sync(lambda: pair["a"].wait_line("lost the NATS connection"))
        await anyio.sleep(3 * EXPIRY_S)  # the outage under test, not synchronisation
        assert await client.tool_names() >= HOSTILE_TOOLS  # nobody dropped while cut off
        nats.start()
        for node in pair.values():
            await anyio.to_thread.run_sync(lambda n=node: n.wait_line("NATS connection back"))
        # A full expiry window after the reconnect, when expiry resumes: still everyone.
        await anyio.sleep(EXPIRY_S + HEARTBEAT_S)
        result = await client.session.call_tool("hostile/ok", {"text": "back"})
        assert _text(result) == "back"
        assert await client.tool_names() >= HOSTILE_TOOLS
    for node in pair.values():
        assert "expired" not in node.log(), node.log()[-3000:]


def _announcement(node: str) -> bytes:
    return canonical_json(
        {
            "v": 1,
            "node": node,
            "roles": ["worker"],
            "bundle": "0" * 64,
            "skills": [
                {
                    "spec": {
                        "id": "evil",
                        "version": "1.0.0",
                        "description": "injected",
                        "methods": [{"name": "run", "description": "", "params": {}, "result": {}}],
                        "resources": [],
                        "prompts": [],
                    },
                    "digest": "f" * 64,
                    "exposure": {
                        "tools": "per-method",
                        "hidden": [],
                        "names": {},
                        "titles": {},
                        "descriptions": {},
                        "client": [],
                    },
                    "annotations": {
                        "read_only": True,
                        "destructive": False,
                        "idempotent": True,
                        "open_world": False,
                    },
                    "description": "injected",
                    "limits": {"timeout_ms": 1000, "max_concurrency": 1},
                }
            ],
        }
    )


async def test_forged_announcements_are_refused_and_logged(
    nats: NatsServer, keys: Keys, gateway_bundle: Path, tmp_path: Path
) -> None:
    """Unsigned, untrusted, out-of-scope (another node's key), tampered announcements: refused."""
    import base64

    entry = start_node(
        "node-a", gateway_bundle, nats.url, keys.member, tmp_path / "a", extra=["--entry-only"]
    )
    stranger = None
    try:
        member = load_private_key(keys.of("node-x"))
        other = load_private_key(keys.of("node-b"))
        outsider = load_private_key(keys.stranger)
        context = b"skilld-cluster-announcement-v1\0"

        def signed(key: object, data: bytes) -> dict[str, str]:
            stamp = f"{time.time_ns()}.1"
            signature = key.sign(context + stamp.encode() + b"\0" + data)  # type: ignore[attr-defined]
            return {
                "Skilld-Key": key.key_id,  # type: ignore[attr-defined]
                "Skilld-Sig": base64.b64encode(signature).decode(),
                "Skilld-Stamp": stamp,
            }

        good = _announcement("node-x")
        forged = {
            "unsigned": (good, {}),
            "untrusted key": (good, signed(outsider, good)),
            "out of scope": (_announcement("rogue"), signed(member, _announcement("rogue"))),
            "another node's key": (good, signed(other, good)),
            "tampered": (good.replace(b"injected", b"INJECTED"), signed(member, good)),
        }
        nc = await nats_client.connect(nats.url)
        try:
            for data, headers in forged.values():
                await nc.publish("skilld.announce", data, headers=headers or None)
            await nc.flush()
        finally:
            await nc.close()
        reasons = [
            await anyio.to_thread.run_sync(lambda: entry.wait_audit(event="cluster-refused"))
            for _ in forged
        ]
        expected = [
            "unsigned cluster message refused",
            f"signed by key {outsider.key_id}, which this node's trust set does not hold",
            f"key node-x ({member.key_id}) may not speak for node 'rogue': its trust "
            "file's 'cluster' patterns are ['node-x']",
            f"key node-b ({other.key_id}) may not speak for node 'node-x': its trust "
            "file's 'cluster' patterns are ['node-b']",
            f"the signature by key node-x ({member.key_id}) does not verify",
        ]
        for record, reason in zip(reasons, expected, strict=True):
            assert record["reason"].endswith(reason), record  # (after the trust file's path)
        assert "announcement refused" in entry.log()
        # A whole node with a key the entry does not trust joins nothing either.
        stranger = start_node(
            "node-s", gateway_bundle, nats.url, keys.stranger, tmp_path / "s", http=False
        )
        refused = await anyio.to_thread.run_sync(
            lambda: entry.wait_audit(event="cluster-refused", node="node-s")
        )
        assert "trust set does not hold" in refused["reason"]
        assert entry.url is not None
        async with mcp_client(entry.url) as client:
            assert not await client.tool_names()
    finally:
        entry.stop()
        if stranger is not None:
            stranger.stop()


async def test_replicas_share_the_load(
    nats: NatsServer, keys: Keys, hostile_bundle: Path, gateway_bundle: Path, tmp_path: Path
) -> None:
    """Two nodes holding the same skill package both serve calls routed through an entry node
    (hostile keeps kv state: both keep it in JetStream KV, or the second would withdraw it)."""
    cluster = replicas_behind_entry(nats.url, keys.member, hostile_bundle, gateway_bundle, tmp_path)
    with cluster as (nodes, entry):
        assert entry.url is not None
        async with mcp_client(entry.url) as client:
            await client.wait_tools(lambda n: n >= HOSTILE_TOOLS)
            for i in range(40):
                result = await client.session.call_tool("hostile/ok", {"text": str(i)})
                assert _text(result) == str(i)

        def oks(records: list[dict[str, object]]) -> int:
            return len([r for r in records if r.get("method") == "ok"])

        # Every node wrote its records before it answered; wait until this side read them.
        served = [oks(node.audit()) for node in nodes]
        if sum(served) < 40:
            nodes[0].audit_until(lambda rs: oks(rs) + oks(nodes[1].audit()) >= 40)
            served = [oks(node.audit()) for node in nodes]
        assert sum(served) == 40
        assert min(served) > 0, served
        assert json.dumps(served)


async def test_graceful_stop_leaves_at_once(pair: dict[str, NodeProc]) -> None:
    """SIGTERM: the node says a signed goodbye and its tools go well before the expiry window."""
    url = pair["a"].url
    assert url is not None
    async with mcp_client(url) as client:
        await client.wait_tools(lambda n: n >= HOSTILE_TOOLS)
        stopped = time.monotonic()
        await anyio.to_thread.run_sync(pair["c"].stop)
        await client.wait_tools(lambda n: not n & HOSTILE_TOOLS, timeout=10)
        assert time.monotonic() - stopped < 30  # bounded by node-c's own shutdown
    pair["a"].seen("node node-c left")
    assert "node-c expired" not in pair["a"].log()


async def test_replayed_heartbeats_and_leaves_change_nothing(
    nats: NatsServer, pair: dict[str, NodeProc]
) -> None:
    """Recorded heartbeats of node-c, published again, are refused while it lives and do not
    keep it listed once killed; an idle client hears that its tools went."""
    url = pair["a"].url
    assert url is not None
    recorded: list[tuple[str, bytes, dict[str, str]]] = []
    spy = await nats_client.connect(nats.url)
    try:

        async def record(msg: object) -> None:
            data, headers = msg.data, dict(msg.headers or {})  # type: ignore[attr-defined]
            if json.loads(data).get("node", json.loads(data).get("leave")) == "node-c":
                recorded.append((msg.subject, data, headers))  # type: ignore[attr-defined]

        await spy.subscribe("skilld.announce", cb=record)
        await spy.subscribe("skilld.leave", cb=record)
        async with mcp_client(url) as client:
            await client.wait_tools(lambda n: n >= HOSTILE_TOOLS)
            while len(recorded) < 3:
                await anyio.sleep(HEARTBEAT_S / 2)
            for subject, data, headers in list(recorded):
                await spy.publish(subject, data, headers=headers)
            await spy.flush()
            await anyio.to_thread.run_sync(
                lambda: pair["a"].wait_audit(event="cluster-refused", node="node-c")
            )
            assert await client.tool_names() >= HOSTILE_TOOLS
            pair["c"].kill()
            killed = time.monotonic()
            replays = list(recorded)

            async def replay() -> None:
                while True:
                    for subject, data, headers in replays:
                        await spy.publish(subject, data, headers=headers)
                    await anyio.sleep(HEARTBEAT_S / 4)

            async with anyio.create_task_group() as tg:
                tg.start_soon(replay)
                # This client is idle (no call in flight): it hears of the change through
                # list_changed on its standalone stream.
                await client.wait_tools(lambda n: not n & HOSTILE_TOOLS, timeout=10)
                tg.cancel_scope.cancel()
            assert time.monotonic() - killed < 3.0
    finally:
        await spy.close()
    assert "replayed or stale message from node 'node-c'" in pair["a"].log()


async def test_a_2026_client_hears_changes_on_its_listen_stream(pair: dict[str, NodeProc]) -> None:
    """A client of the 2026-07-28 protocol opens ``subscriptions/listen`` for tool list
    changes; a killed node's tools going is an event on that stream."""
    from mcp import Client

    url = pair["a"].url
    assert url is not None
    async with Client(url, mode="2026-07-28") as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert names >= HOSTILE_TOOLS
        async with client.listen(tools_list_changed=True) as events:
            assert events.honored.tools_list_changed
            pair["c"].kill()
            with anyio.fail_after(10):
                async for _event in events:
                    names = {t.name for t in (await client.list_tools()).tools}
                    if not names & HOSTILE_TOOLS:
                        break
