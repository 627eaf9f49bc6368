"""Forwarded retries of input-required rounds against a plain NATS client on an open bus.

Entry nodes node-a and node-c share a request-state key; node-b, a worker, holds the
conformance skill. A genuine retry at node-c for a call parked on node-a is forwarded
on ``skilld.call.node-a._round``; whoever records it, forges one or signs one without
being an entry node gets no answer, runs nothing, and the refusal is audited on node-a.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import nats as nats_client
import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from support.cluster import Keys, NatsServer, NodeProc, SignedClient, entry_nodes

pytestmark = pytest.mark.anyio

MODERN = "2026-07-28"
STATE = "test_input_required_result_request_state"
META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
}


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """One event loop for the module's async fixtures."""
    return "asyncio"


@pytest.fixture(scope="module")
def open_bus(
    keys: Keys,
    demo_cluster_bundle: Path,
    gateway_bundle: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    """An open nats-server; node-b holds the conformance skill; node-a and node-c are entry
    nodes sharing a request-state key."""
    root = tmp_path_factory.mktemp("round-attacks")
    key = root / "request-state.key"
    key.write_text(secrets.token_hex(32))
    key.chmod(0o600)  # a key others may read is refused
    server = NatsServer(root / "jetstream")
    server.start()
    try:
        with entry_nodes(
            server.url,
            keys.member,
            demo_cluster_bundle,
            gateway_bundle,
            root,
            key,
            worker_skills=7,
        ) as (b, a, c):
            yield {"server": server, "nodes": {"a": a, "b": b, "c": c}, "keys": keys}
    finally:
        server.stop()


@pytest.fixture
async def plain(open_bus: dict[str, Any]) -> AsyncIterator[NatsClient]:
    """A NATS client with no credentials and no node key."""
    nc = await nats_client.connect(open_bus["server"].url)
    try:
        yield nc
    finally:
        await nc.close()


async def modern(url: str, params: dict[str, Any]) -> dict[str, Any]:
    """One raw 2026-07-28 tools/call; its JSON-RPC answer."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {**params, "_meta": META}}
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "tools/call",
        "Mcp-Name": str(params["name"]),
    }
    async with httpx2.AsyncClient(timeout=60) as http:
        response = await http.post(url, json=body, headers=headers)
    if response.headers.get("content-type", "").startswith("application/json"):
        message: dict[str, Any] = response.json()
        return message
    data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
    last: dict[str, Any] = json.loads(data[-1])
    return last


def _refused(node: NodeProc, *needles: str, sender: str | None = None) -> dict[str, Any]:
    """``node``'s audit record of a refused cluster message mentioning every needle (and
    claiming to come from ``sender``, when given)."""

    def match(r: dict[str, Any]) -> bool:
        return (
            r["event"] == "cluster-refused"
            and all(n in r["reason"] for n in needles)
            and sender in (None, r.get("node"))
        )

    records = node.audit_until(lambda rs: any(match(r) for r in rs))
    return next(r for r in records if match(r))


async def _no_answer(plain: NatsClient, subject: str, data: bytes, headers: dict[str, str]) -> None:
    """Publish a request; no answer may come back (the node stays silent)."""
    with pytest.raises(Exception, match=r"(?i)timeout"):
        await plain.request(subject, data, headers=headers, timeout=1.5)


def _calls(node: NodeProc) -> int:
    return len(
        [r for r in node.audit() if r["event"] == "call" and r.get("skill") == "conformance"]
    )


async def _forwarded_round(open_bus: dict[str, Any], plain: NatsClient) -> tuple[Msg, int]:
    """A genuine round: started at node-a, its retry sent to node-c and forwarded to node-a
    (recorded off the bus); the worker's call count once the call ran."""
    node_a, node_c, node_b = (open_bus["nodes"][n] for n in "acb")
    before = _calls(node_b)
    seen: asyncio.Queue[Msg] = asyncio.Queue()
    sub = await plain.subscribe("skilld.call.node-a._round", cb=seen.put)
    await plain.flush()
    first = await modern(node_a.url, {"name": STATE})
    retry = {
        "name": STATE,
        "inputResponses": {"confirm": {"action": "accept", "content": {"ok": True}}},
        "requestState": first["result"]["requestState"],
    }
    done = await modern(node_c.url, retry)
    assert "state-ok: confirmed=True" in done["result"]["content"][0]["text"], done
    msg = await asyncio.wait_for(seen.get(), timeout=10)
    await sub.unsubscribe()
    node_b.audit_until(lambda rs: _calls(node_b) > before)
    return msg, _calls(node_b)


async def test_a_forwarded_retry_is_sealed_and_a_replay_of_it_is_refused(
    open_bus: dict[str, Any], plain: NatsClient
) -> None:
    """On an open bus the forwarded retry is ciphertext (the client's answers are not in it);
    the same message sent again gets no answer, runs nothing, and node-a audits the replay."""
    genuine, calls = await _forwarded_round(open_bus, plain)
    meta = json.loads((genuine.headers or {})["Skilld-Meta"])
    assert meta["pair"] == 1, meta  # sealed under the pair key of node-c and node-a
    assert meta["from"] == "node-c", meta
    assert b"confirm" not in genuine.data
    await _no_answer(plain, genuine.subject, genuine.data, dict(genuine.headers or {}))
    _refused(open_bus["nodes"]["a"], "forwarded retry refused", "replayed")
    assert _calls(open_bus["nodes"]["b"]) == calls


async def test_forged_forwarded_retries_are_refused(
    open_bus: dict[str, Any], plain: NatsClient
) -> None:
    """Unsigned, signed by a key the cluster does not trust, or signed by a member key for a
    node that is no entry node (a worker's name, a name nobody announced): no answer, and
    each is audited on node-a before its content is read."""
    node_a = open_bus["nodes"]["a"]
    body = json.dumps(
        {
            "method": "tools/call",
            "version": MODERN,
            "params": {"name": STATE, "requestState": '{"c":"x","n":"node-a","d":"0","r":1}'},
        }
    ).encode()
    subject = "skilld.call.node-a._round"
    meta = {"ev": "round", "call": "f" * 24, "to": "node-a", "from": "node-c"}
    await _no_answer(plain, subject, body, {"Skilld-Meta": json.dumps(meta)})
    _refused(node_a, "forwarded retry refused", "unsigned")
    meta.pop("from")
    stranger = SignedClient("node-c", open_bus["keys"].stranger)
    await _no_answer(plain, subject, body, stranger.seal({**meta, "call": "g" * 24}, body))
    _refused(node_a, "forwarded retry refused", "trust set does not hold")
    for name in ("node-b", "node-t"):
        member = SignedClient(name, open_bus["keys"].member)
        await _no_answer(plain, subject, body, member.seal({**meta, "call": "h" * 24}, body))
        _refused(node_a, "forwarded retry refused", "not an entry node", sender=name)
    assert not any("forwarded retry from node-t" in line for line in node_a.lines)
