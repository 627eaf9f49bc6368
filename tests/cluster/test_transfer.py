"""File transfer between two nodes: round trips, refusals on either side, corruption."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats as nats_client
import pytest
from mcp import types

from skilld.package import canonical_json
from skilld.sandbox import Sandbox
from support.cluster import (
    Keys,
    NatsServer,
    NodeProc,
    SignedClient,
    make_bundle,
    mcp_client,
    start_node,
)

pytestmark = pytest.mark.anyio

MIB = 1024 * 1024


def _policy(peer: str, rw: Path, ro: Path) -> str:
    return (
        "skill: mover\ntransfer:\n"
        f"  - nodes: [{peer}]\n    paths: [{rw}]\n    mode: rw\n"
        f"  - nodes: [{peer}]\n    paths: [{ro}]\n    mode: ro\n"
    )


@pytest.fixture(scope="module")
def nats_m(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """One nats-server for this module's two nodes."""
    server = NatsServer(tmp_path_factory.mktemp("jetstream"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def two(
    sandbox: Sandbox, nats_m: NatsServer, keys: Keys, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, object]]:
    """node-a and node-b, each holding mover with its own grants: rw in/, ro out/, and ungranted."""
    nats, tmp_path = nats_m, tmp_path_factory.mktemp("transfer")
    dirs: dict[str, Path] = {}
    nodes: dict[str, NodeProc] = {}
    # node-t: the signing test client of test_a_corrupted_transfer_leaves_no_file.
    for name, peer in (("a", "node-b"), ("b", "node-a, node-t")):
        for sub in ("in", "out", "other"):
            dirs[f"{name}-{sub}"] = tmp_path / name / sub
            dirs[f"{name}-{sub}"].mkdir(parents=True)
        policy = _policy(peer, dirs[f"{name}-in"], dirs[f"{name}-out"])
        bundle = make_bundle(
            sandbox, tmp_path / f"bundle-{name}", ["mover"], keys, {"mover.yaml": policy}
        )
        dirs[f"bundle-{name}"] = bundle
    try:
        nodes["b"] = start_node(
            "node-b", dirs["bundle-b"], nats.url, keys.member, tmp_path / "state-b", http=False
        )
        nodes["a"] = start_node(
            "node-a", dirs["bundle-a"], nats.url, keys.member, tmp_path / "state-a"
        )
        nodes["a"].seen("node node-b joined")
        nodes["b"].seen("node node-a joined")
        yield {"nodes": nodes, "dirs": dirs}
    finally:
        for node in nodes.values():
            node.stop()


def _value(result: types.CallToolResult) -> dict[str, object]:
    assert result.structured_content is not None, result
    value = result.structured_content.get("result", result.structured_content)
    assert isinstance(value, dict)
    return value


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def test_files_round_trip_both_ways(two: dict[str, object]) -> None:
    """1 MiB and 128 KiB + 1 byte files are sent and fetched with equal digests; both audit."""
    nodes, dirs = two["nodes"], two["dirs"]
    assert isinstance(nodes, dict) and isinstance(dirs, dict)
    big, odd = dirs["a-out"] / "big.bin", dirs["a-out"] / "odd.bin"
    big.write_bytes(os.urandom(MIB))
    odd.write_bytes(os.urandom(128 * 1024 + 1))
    remote = dirs["b-out"] / "served.bin"
    remote.write_bytes(os.urandom(MIB))
    async with mcp_client(nodes["a"].url) as client:
        assert _value(await client.session.call_tool("mover/nodes", {})) == {"ok": ["node-b"]}
        for src in (big, odd):
            out = _value(
                await client.session.call_tool(
                    "mover/send",
                    {
                        "node": "node-b",
                        "local_path": str(src),
                        "remote_path": str(dirs["b-in"] / src.name),
                    },
                )
            )
            assert out == {"ok": src.stat().st_size}, out
            assert _sha(dirs["b-in"] / src.name) == _sha(src)
        out = _value(
            await client.session.call_tool(
                "mover/fetch",
                {
                    "node": "node-b",
                    "remote_path": str(remote),
                    "local_path": str(dirs["a-in"] / "got.bin"),
                },
            )
        )
        assert out == {"ok": MIB}, out
        assert _sha(dirs["a-in"] / "got.bin") == _sha(remote)

    def transfers(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in records if r["event"] == "transfer"]

    received = transfers(nodes["b"].audit_until(lambda rs: len(transfers(rs)) >= 3))
    assert [(r["direction"], r["outcome"], r["size"]) for r in received] == [
        ("in", "ok", MIB),
        ("in", "ok", 128 * 1024 + 1),
        ("out", "ok", MIB),
    ]
    sent = transfers(nodes["a"].audit_until(lambda rs: len(transfers(rs)) >= 3))
    assert [(r["direction"], r["peer"]) for r in sent] == [("out", "node-b")] * 2 + [
        ("in", "node-b")
    ]


async def test_a_grant_missing_on_either_side_refuses(two: dict[str, object]) -> None:
    """No grant on the sender, or none to receive on the receiver: refused, nothing written."""
    nodes, dirs = two["nodes"], two["dirs"]
    assert isinstance(nodes, dict) and isinstance(dirs, dict)
    src = dirs["a-out"] / "f.bin"
    src.write_bytes(b"x" * 100)
    (dirs["a-other"] / "secret.bin").write_bytes(b"s")
    async with mcp_client(nodes["a"].url) as client:
        # the sender's grant: a-other is not granted on node-a
        out = _value(
            await client.session.call_tool(
                "mover/send",
                {
                    "node": "node-b",
                    "local_path": str(dirs["a-other"] / "secret.bin"),
                    "remote_path": str(dirs["b-in"] / "secret.bin"),
                },
            )
        )
        assert out["error"] == "not-permitted" and out["rule"] == "default-deny", out
        # the receiver's grant: node-b grants b-out read-only, b-other not at all
        for dest in (dirs["b-out"] / "f.bin", dirs["b-other"] / "f.bin"):
            out = _value(
                await client.session.call_tool(
                    "mover/send",
                    {"node": "node-b", "local_path": str(src), "remote_path": str(dest)},
                )
            )
            assert out["error"] == "not-permitted", out
            assert "node-b" in str(out["message"]), out
        # fetching into a read-only directory of node-a is refused before anything moves
        out = _value(
            await client.session.call_tool(
                "mover/fetch",
                {
                    "node": "node-b",
                    "remote_path": str(dirs["b-out"] / "x"),
                    "local_path": str(dirs["a-out"] / "x"),
                },
            )
        )
        assert out["error"] == "not-permitted", out
        # remote-to-remote is refused with a clear error
        out = _value(
            await client.session.call_tool(
                "mover/send",
                {
                    "node": "node-b",
                    "local_path": "node-c:/etc/passwd",
                    "remote_path": str(dirs["b-in"] / "p"),
                },
            )
        )
        assert out["error"] == "not-permitted" and "remote-to-remote" in str(out["message"]), out
    assert not (dirs["b-out"] / "f.bin").exists() and not any(dirs["b-other"].iterdir())
    assert not (dirs["b-in"] / "secret.bin").exists()

    def refusals(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in records if r["event"] == "transfer" and r["outcome"] != "ok"]

    refused = refusals(nodes["b"].audit_until(lambda rs: len(refusals(rs)) >= 2))
    assert [r["outcome"] for r in refused] == ["denied", "denied"]


async def test_a_corrupted_transfer_leaves_no_file(
    two: dict[str, Any], nats_m: NatsServer, keys: Keys
) -> None:
    """Bytes that do not match the signed sha256 are refused and leave nothing behind."""
    dirs, nodes = two["dirs"], two["nodes"]
    # A member with its own key (trusted for node-t only), so node-a keeps its window.
    fake = SignedClient("node-t", keys.member)
    dest = dirs["b-in"] / "corrupt.bin"
    good = os.urandom(200_000)
    tid = "t" * 24
    doc = {
        "v": 1,
        "op": "put",
        "node": "node-t",
        "to": "node-b",
        "skill": "mover",
        "path": str(dest),
        "size": len(good),
        "sha256": hashlib.sha256(good).hexdigest(),
        "id": tid,
    }
    body = canonical_json(doc)

    def step(op: str, data: bytes, seq: int = 0, to: str = "node-b") -> dict[str, str]:
        return fake.seal({"ev": "transfer", "op": op, "id": tid, "seq": seq, "to": to}, data)

    begin_headers = step("put", body)
    before = set(dirs["b-in"].iterdir())
    nc = await nats_client.connect(nats_m.url)
    try:
        data, headers = fake.announcement()
        await nc.publish("skilld.announce", data, headers=headers)
        await nc.flush()
        nodes["b"].seen(r"node node-t joined")
        subject = "skilld.transfer.node-b"
        begin = await nc.request(subject, body, timeout=5, headers=begin_headers)
        assert json.loads(begin.data) == {"ok": True}
        bad = bytearray(good)
        bad[1000] ^= 0xFF  # one flipped byte in flight
        await nc.request(subject, bytes(bad), timeout=5, headers=step("chunk", bytes(bad)))
        end = await nc.request(subject, b"", timeout=5, headers=step("end", b""))
        error = json.loads(end.data)["error"]
        assert error["code"] == "io" and "do not match" in error["message"], error
        # The same signed request again (a recording replayed) is refused.
        again = await nc.request(subject, body, timeout=5, headers=begin_headers)
        error = json.loads(again.data)["error"]
        assert error["code"] == "not-permitted" and "replayed" in error["message"], error
        # A request node-t signed for another node, sent to node-b, is refused there.
        elsewhere = canonical_json({**doc, "to": "node-z", "id": "u" * 24})
        misaddressed = await nc.request(
            subject, elsewhere, timeout=5, headers=step("put", elsewhere, to="node-z")
        )
        error = json.loads(misaddressed.data)["error"]
        assert error["code"] == "not-permitted" and "not to this node" in error["message"], error
    finally:
        await nc.close()
    assert set(dirs["b-in"].iterdir()) == before  # neither the file nor a temporary one
