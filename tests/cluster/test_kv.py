"""Clustered key-value state in JetStream KV: keys round-trip, quotas hold, acked writes survive."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import types

from skilld.cluster import ClusterConfig
from skilld.cluster._claim import HOLD_S, StartTurn
from skilld.cluster._kv import JetStreamKV, bucket_name, decode_key, encode_key
from skilld.cluster._link import NatsLink
from skilld.errors import QuotaExceeded
from support.cluster import Keys, NatsServer, mcp_client, replicas_behind_entry, start_node

# What the SDK accepts as a key: 1 to 1024 bytes of UTF-8.
SDK_KEYS = st.text(min_size=1, max_size=300).filter(lambda k: 0 < len(k.encode()) <= 1024)


@pytest.fixture
def link(nats: NatsServer, tmp_path: Path) -> Iterator[NatsLink]:
    """A started NATS link (as a node has one)."""
    config = ClusterConfig(url=nats.url, node="node-t", key_file=tmp_path / "unused.pem")
    link = NatsLink(config)
    link.start()
    try:
        yield link
    finally:
        link.close()


def _store(link: NatsLink, skill: str, value_limit: int = 1024, total: int = 4096) -> JetStreamKV:
    return link.run(JetStreamKV.open(link, skill, value_limit, total), timeout=10)


@given(key=SDK_KEYS)
def test_any_sdk_key_encodes_to_a_nats_key_and_back(key: str) -> None:
    """Every key the SDK accepts becomes a valid NATS KV key that decodes to itself."""
    stored = encode_key(key)
    assert all(c.isascii() and (c.isalnum() or c in "-_") for c in stored)
    assert decode_key(stored) == key


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(key=SDK_KEYS, value=st.binary(max_size=64))
def test_keys_round_trip_through_jetstream(link: NatsLink, key: str, value: bytes) -> None:
    """Hostile keys and values are stored, listed, read back and deleted unchanged."""
    kv = _store(link, "roundtrip", total=1 << 20)
    kv.set(key, value)
    assert kv.get(key) == value
    assert key in kv.keys(key[:1], 10_000)
    assert kv.delete(key) is True
    assert kv.get(key) is None
    assert kv.delete(key) is False


def test_quotas_and_listing(link: NatsLink) -> None:
    """The value limit and the total quota are the SQLite backend's; keys list in order."""
    kv = _store(link, "quota", value_limit=100, total=300)
    with pytest.raises(QuotaExceeded, match="limit per value"):
        kv.set("big", b"x" * 101)
    kv.set("b", b"x" * 99)  # 100 bytes
    kv.set("a", b"x" * 99)  # 200 bytes
    kv.set("a", b"y" * 99)  # overwriting frees the old value first
    with pytest.raises(QuotaExceeded, match="over the 300-byte quota"):
        kv.set("c", b"x" * 100)
    assert kv.delete("b")
    kv.set("c", b"x" * 99)
    assert kv.keys("", 10) == ["a", "c"]
    assert kv.keys("c", 10) == ["c"]
    assert kv.keys("", 1) == ["a"]
    # another skill's bucket sees none of it
    assert _store(link, "other").keys("", 10) == []
    assert bucket_name("quota") != bucket_name("other")


@pytest.mark.anyio
async def test_a_replica_killed_mid_run_loses_no_acknowledged_write(
    nats: NatsServer, keys: Keys, hostile_bundle: Path, gateway_bundle: Path, tmp_path: Path
) -> None:
    """Replicas share one bucket; kill -9 of one costs no write whose call returned."""
    acknowledged: list[str] = []
    cluster = replicas_behind_entry(nats.url, keys.member, hostile_bundle, gateway_bundle, tmp_path)
    with cluster as (replicas, entry):
        assert entry.url is not None
        async with mcp_client(entry.url) as client:
            await client.wait_tools(lambda n: "hostile/write_keys" in n)
            for i in range(60):
                if i == 20:
                    replicas[0].kill()
                    killed = time.monotonic()
                result = await client.session.call_tool(
                    "hostile/write_keys", {"count": 1, "prefix": f"w{i:03d}-"}
                )
                if not result.is_error:
                    acknowledged.append(f"w{i:03d}-000000")
                else:
                    text = "".join(
                        b.text for b in result.content if isinstance(b, types.TextContent)
                    )
                    assert text.startswith("[unavailable]"), text
            assert time.monotonic() - killed < 30
    served = [len([r for r in n.audit() if r.get("method") == "write_keys"]) for n in replicas]
    assert min(served) > 0, served  # both replicas took writes before the kill
    assert len(acknowledged) >= 40
    config = ClusterConfig(url=nats.url, node="node-check", key_file=tmp_path / "unused.pem")
    link = NatsLink(config)
    link.start()
    try:
        stored = set(_store(link, "hostile", total=64 << 20).keys("w", 10_000))
    finally:
        link.close()
    assert set(acknowledged) <= stored
    await anyio.lowlevel.checkpoint()


@pytest.mark.anyio
async def test_a_second_replica_without_clustered_kv_refuses_to_split_state(
    nats: NatsServer, keys: Keys, demo_cluster_bundle: Path, gateway_bundle: Path, tmp_path: Path
) -> None:
    """Without --cluster-kv the second holder of notes (a kv skill) withdraws it and says
    why; every read after a write then sees the write (the issue saw 5 of 10 miss it)."""
    first = start_node(
        "node-r1", demo_cluster_bundle, nats.url, keys.member, tmp_path / "r1", http=False
    )
    second = start_node(
        "node-r2", demo_cluster_bundle, nats.url, keys.member, tmp_path / "r2", http=False
    )
    entry = start_node(
        "node-a", gateway_bundle, nats.url, keys.member, tmp_path / "a", extra=["--entry-only"]
    )
    try:
        second.seen(r"skill notes NOT served by this node.*node-r1.*--cluster-kv")
        assert "NOT served" not in first.log()
        assert entry.url is not None
        async with mcp_client(entry.url) as client:
            await client.wait_tools(lambda n: {"notes_add", "echo/echo"} <= n)
            added = await client.session.call_tool("notes_add", {"title": "t", "body": "kept"})
            assert not added.is_error, added.content
            for i in range(10):
                result = await client.session.call_tool("notes/get", {"title": "t"})
                text = "".join(b.text for b in result.content if isinstance(b, types.TextContent))
                assert "kept" in text, text
                # echo keeps no state: both nodes still serve it, by turns.
                echoed = await client.session.call_tool("echo/echo", {"text": f"e{i}"})
                assert not echoed.is_error
    finally:
        entry.stop()
        second.stop()
        first.stop()
    assert not any(r.get("skill") == "notes" for r in second.audit())
    assert any(r.get("skill") == "echo" for r in second.audit())


def test_nodes_take_turns_at_the_replica_check(
    link: NatsLink, nats: NatsServer, tmp_path: Path
) -> None:
    """A second node's turn starts only when the first gives it back, or its hold runs out
    (a node killed during its check blocks nobody for long)."""
    config = ClusterConfig(url=nats.url, node="node-u", key_file=tmp_path / "unused.pem")
    other = NatsLink(config)
    other.start()
    try:
        first, second = StartTurn(link, "node-t"), StartTurn(other, "node-u")
        link.run(first.__aenter__(), timeout=10)
        waiting = other.spawn(second.__aenter__())
        with pytest.raises(concurrent.futures.TimeoutError):
            waiting.result(timeout=0.5)  # node-t holds the turn
        link.run(first.__aexit__(None, None, None), timeout=10)
        waiting.result(timeout=5)
        other.run(second.__aexit__(None, None, None), timeout=10)
        # node-t takes the turn and dies with it: node-u's turn comes after HOLD_S.
        link.run(StartTurn(link, "node-t").__aenter__(), timeout=10)
        began = time.monotonic()
        other.run(StartTurn(other, "node-u").__aenter__(), timeout=HOLD_S + 10)
        assert time.monotonic() - began <= HOLD_S + 5
    finally:
        other.close()


@pytest.mark.anyio
async def test_two_replicas_starting_together_do_not_both_serve_a_kv_skill(
    nats: NatsServer, keys: Keys, demo_cluster_bundle: Path, tmp_path: Path
) -> None:
    """Two holders of notes (kv, no --cluster-kv) started at the same moment: exactly one
    serves it (the discovery window alone let both serve)."""
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        starting = [
            pool.submit(
                start_node,
                name,
                demo_cluster_bundle,
                nats.url,
                keys.member,
                tmp_path / name,
                http=False,
            )
            for name in ("node-r1", "node-r2")
        ]
        nodes = [f.result() for f in starting]
    try:
        withdrew = [n for n in nodes if "skill notes NOT served" in n.log()]
        assert len(withdrew) == 1, [n.log()[-2000:] for n in nodes]
    finally:
        for node in nodes:
            node.stop()
