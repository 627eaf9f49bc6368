"""Input-required rounds through a cluster: a stateless client spread over two entry nodes.

Real processes throughout: nats-server on the bus `skilld cluster nats-config` writes,
a worker (node-b) holding the conformance skill (wasm), and two entry-only nodes
(node-a, node-c) sharing that directory's ``request-state.key``. A round's retry that
reaches the entry node that does not hold the call is forwarded to the one that does.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client, types
from mcp.client.streamable_http import streamable_http_client
from mcp.server.request_state import AESGCMRequestStateCodec, compact_json

from support.cluster import EntryNodes, Keys, NatsServer, NodeProc, entry_nodes
from support.mcp_fakes import text_of

pytestmark = pytest.mark.anyio

MODERN = "2026-07-28"
# The conformance skill's methods as its policy exposes them.
ELICIT = "test_input_required_result_elicitation"
SAMPLE = "test_input_required_result_sampling"
STATE = "test_input_required_result_request_state"
MULTI = "test_input_required_result_multi_round"
META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}, "sampling": {}},
}


@dataclass
class Entries:
    """The two entry nodes, the worker, and the entry nodes' shared sealing key."""

    a: NodeProc
    c: NodeProc
    worker: NodeProc
    key: bytes

    @property
    def urls(self) -> list[str]:
        """The entry nodes' MCP endpoints."""
        assert self.a.url is not None
        assert self.c.url is not None
        return [self.a.url, self.c.url]

    def conformance_calls(self) -> list[dict[str, Any]]:
        """The worker's audit records of the conformance skill's calls."""
        return [r for r in self.worker.audit() if r.get("skill") == "conformance"]


@pytest.fixture
def entries(bus_entry_nodes: EntryNodes, bus_nats: tuple[NatsServer, Path]) -> Iterator[Entries]:
    """node-b (worker, whole demo bundle and the conformance skill), node-a and node-c
    (entry-only, sharing the bus directory's request-state.key)."""
    with bus_entry_nodes() as (worker, a, c):
        key = (bus_nats[1] / "request-state.key").read_bytes().strip()
        yield Entries(a, c, worker, key)


class RoundRobin(httpx2.AsyncBaseTransport):
    """A balancer without affinity: each HTTP request goes to the next entry node in turn."""

    def __init__(self, urls: list[str]) -> None:
        self._targets = [httpx2.URL(u) for u in urls]
        self._turn = itertools.count()
        self._inner = httpx2.AsyncHTTPTransport()
        self.sent: list[int] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        """Send ``request`` to the next entry node."""
        target = self._targets[next(self._turn) % len(self._targets)]
        request.url = request.url.copy_with(host=target.host, port=target.port)
        self.sent.append(int(target.port or 0))
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        """Close the connections."""
        await self._inner.aclose()


async def answer_elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    """A user who answers every form with a name and a colour."""
    return types.ElicitResult(action="accept", content={"name": "Ada", "color": "teal"})


async def answer_sample(
    context: Any, params: types.CreateMessageRequestParams
) -> types.CreateMessageResult:
    """A model that always says Paris."""
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(type="text", text="Paris"), model="fake"
    )


async def test_a_stateless_client_spread_over_two_entry_nodes_completes_its_rounds(
    entries: Entries,
) -> None:
    """The official Python SDK in 2026-07-28 mode, each HTTP request to the next of two entry
    nodes, completes a guest that elicits twice and one that samples: the retries that reach
    the node not holding the call are forwarded to the one that does, and each call runs (and
    is audited) once on the worker."""
    balancer = RoundRobin(entries.urls)
    with anyio.fail_after(120):
        async with (
            httpx2.AsyncClient(transport=balancer, timeout=60) as http,
            Client(
                streamable_http_client(entries.urls[0], http_client=http),
                mode=MODERN,
                elicitation_callback=answer_elicit,
                sampling_callback=answer_sample,
            ) as client,
        ):
            names = {t.name for t in (await client.list_tools()).tools}
            assert {MULTI, SAMPLE, ELICIT} <= names, names
            hello = await client.call_tool(ELICIT, {})
            two = await client.call_tool(MULTI, {})
            sampled = await client.call_tool(SAMPLE, {})
    assert text_of(hello) == "Hello, Ada!"
    assert text_of(two) == "Ada likes teal"
    assert text_of(sampled) == "LLM response: Paris"
    assert len(set(balancer.sent)) == 2, balancer.sent  # both entry nodes were used
    forwarded = [n for n in (entries.a, entries.c) if "forwarded retry from" in n.log()]
    assert forwarded, "no retry was forwarded between the entry nodes"
    calls = entries.worker.audit_until(
        lambda rs: len([r for r in rs if r.get("skill") == "conformance"]) >= 3
    )
    conformance = [r for r in calls if r.get("skill") == "conformance"]
    assert [r.get("outcome") for r in conformance] == ["ok", "ok", "ok"], conformance


async def modern(
    http: httpx2.AsyncClient, url: str, method: str, params: dict[str, Any]
) -> dict[str, Any]:
    """One raw 2026-07-28 request; its JSON-RPC answer (plain JSON or the last SSE event)."""
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": META}}
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": method,
        "Mcp-Name": str(params.get("name", "")),
    }
    response = await http.post(url, json=body, headers=headers)
    if response.headers.get("content-type", "").startswith("application/json"):
        message: dict[str, Any] = response.json()
        return message
    data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
    last: dict[str, Any] = json.loads(data[-1])
    return last


def minted(key: bytes, name: str, state: str, *, expires_in: float) -> str:
    """A requestState sealed as an entry node seals one (SDK envelope, audience skilld), for
    ``tools/call`` of ``name`` with no arguments, around the plaintext ``state``."""
    import base64
    import hashlib

    digest = hashlib.sha256(compact_json({}, sort_keys=True).encode()).digest()[:16]
    now = time.time()
    claims = {
        "v": 1,
        "iat": now - 1,
        "exp": now + expires_in,
        "m": "tools/call",
        "t": name,
        "a": base64.urlsafe_b64encode(digest).decode().rstrip("="),
        "s": state,
        "aud": "skilld",
    }
    return AESGCMRequestStateCodec([key]).seal(compact_json(claims).encode())


async def test_hostile_or_repeated_retries_at_the_other_entry_node(entries: Entries) -> None:
    """At the entry node that does not hold the call: a tampered, an expired and a foreign
    (another cluster's key) requestState are refused with -32602 before any forwarding; a
    well-sealed state naming a call that does not exist is forwarded and refused by its
    node; the real retry completes the call; the same retry again (forwarded twice) is
    refused as over, and a copy of an answered round answers nothing. The guests ran once."""
    a_url, c_url = entries.urls
    answer = {"confirm": {"action": "accept", "content": {"ok": True}}}
    with anyio.fail_after(120):
        async with httpx2.AsyncClient(timeout=60) as http:
            first = await modern(http, a_url, "tools/call", {"name": STATE})
            assert first["result"]["resultType"] == "input_required", first
            state = first["result"]["requestState"]

            async def retry(url: str, sealed: str, name: str = STATE) -> Any:
                params = {"name": name, "inputResponses": answer, "requestState": sealed}
                return await modern(http, url, "tools/call", params)

            middle = len(state) // 2
            flipped = state[:middle] + ("A" if state[middle] != "A" else "B") + state[middle + 1 :]
            fake = json.dumps({"c": "no-such-call", "n": "node-a", "d": "0" * 32, "r": 1})
            refusals = {
                "tampered": await retry(c_url, flipped),
                "expired": await retry(c_url, minted(entries.key, STATE, fake, expires_in=-5)),
                "foreign": await retry(
                    c_url, minted(b"another-cluster-" * 4, STATE, fake, expires_in=300)
                ),
            }
            unknown = await retry(c_url, minted(entries.key, STATE, fake, expires_in=300))
            done = await retry(c_url, state)
            again = await retry(c_url, state)

            # Two rounds: a copy of round one's retry, sent after it was answered, answers
            # nothing and is told what the call asks now (round two), as the first was.
            one = await modern(http, c_url, "tools/call", {"name": MULTI})
            step1 = {"step1": {"action": "accept", "content": {"name": "Ada"}}}
            params = {
                "name": MULTI,
                "inputResponses": step1,
                "requestState": one["result"]["requestState"],
            }
            two = await modern(http, a_url, "tools/call", params)
            copy = await modern(http, a_url, "tools/call", params)
            step2 = {"step2": {"action": "accept", "content": {"color": "teal"}}}
            last = await modern(
                http,
                c_url,
                "tools/call",
                {
                    "name": MULTI,
                    "inputResponses": step2,
                    "requestState": two["result"]["requestState"],
                },
            )
    for why, refused in refusals.items():
        assert refused["error"]["code"] == types.INVALID_PARAMS, (why, refused)
        assert refused["error"]["message"] == "Invalid or expired requestState", (why, refused)
    assert unknown["error"]["code"] == types.INVALID_PARAMS, unknown
    assert "over" in unknown["error"]["message"], unknown  # node-a's own refusal, forwarded
    assert "state-ok: confirmed=True" in done["result"]["content"][0]["text"], done
    assert again["error"]["code"] == types.INVALID_PARAMS, again
    assert two["result"]["resultType"] == "input_required", two
    assert list(two["result"]["inputRequests"]) == ["step2"], two
    assert copy["result"]["resultType"] == "input_required", copy
    assert list(copy["result"]["inputRequests"]) == ["step2"], copy
    assert last["result"]["content"][0]["text"] == "Ada likes teal", last
    records = entries.worker.audit_until(
        lambda rs: len([r for r in rs if r.get("skill") == "conformance"]) >= 2
    )
    conformance = [r for r in records if r.get("skill") == "conformance"]
    assert [r.get("outcome") for r in conformance] == ["ok", "ok"], conformance


def test_nats_config_writes_the_entry_nodes_shared_sealing_key(tmp_path: Path) -> None:
    """`skilld cluster nats-config` writes request-state.key: 32 fresh random bytes in hex,
    readable by its owner only, another one for each bus."""
    from skilld.cluster import write_nats_config

    one = write_nats_config(tmp_path / "one", ["node-a", "node-c"])
    two = write_nats_config(tmp_path / "two", ["node-a", "node-c"])
    assert one.request_state_key is not None
    assert two.request_state_key is not None
    text = one.request_state_key.read_text().strip()
    assert len(bytes.fromhex(text)) == 32
    assert one.request_state_key.stat().st_mode & 0o777 == 0o600
    assert two.request_state_key.read_text().strip() != text


async def test_an_answer_larger_than_one_bus_message_comes_back_in_parts(
    keys: Keys, demo_cluster_bundle: Path, gateway_bundle: Path, tmp_path: Path
) -> None:
    """On a bus whose messages hold 64 KiB, a forwarded retry whose result is larger than one
    message (less the room kept for headers) comes back from the holding entry node in
    parts, whole."""
    nats = NatsServer(tmp_path / "jetstream", max_payload=65536)
    nats.start()
    key = tmp_path / "request-state.key"
    key.write_text("ab" * 32)
    key.chmod(0o600)  # a key others may read is refused
    pair = entry_nodes(
        nats.url, keys.member, demo_cluster_bundle, gateway_bundle, tmp_path, key, worker_skills=7
    )
    try:
        with pair as (_, a, c):
            assert a.url is not None
            assert c.url is not None
            # 62 000 bytes: the retry fits in one message, its result is more than one part.
            name = "Ada " * 15500
            with anyio.fail_after(60):
                async with httpx2.AsyncClient(timeout=60) as http:
                    first = await modern(http, a.url, "tools/call", {"name": ELICIT})
                    retry = {
                        "name": ELICIT,
                        "inputResponses": {
                            "user_name": {"action": "accept", "content": {"name": name}}
                        },
                        "requestState": first["result"]["requestState"],
                    }
                    done = await modern(http, c.url, "tools/call", retry)
            assert done["result"]["content"][0]["text"] == f"Hello, {name}!", done
            assert "forwarded retry from node-c" in a.log()
    finally:
        nats.stop()
