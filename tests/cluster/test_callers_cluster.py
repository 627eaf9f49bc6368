"""Caller rules across nodes: a worker checks the caller its entry node verified (sealed in
the routed call) against its own rules, whatever the entry node allowed, and audits it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2 as httpx
import pytest
from test_tasks_cluster import rpc

from skilld.mcp._auth import METRICS_SCOPE
from skilld.sandbox import Sandbox
from support.cluster import Keys, NatsServer, NodeProc, entry_in_flight, make_bundle, start_node
from support.mcp_fakes import client_tokens, token_of

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

# The worker's operator lets alice use echo, and refuses mallory by a rule of its own.
WORKER_RULES = """rules:
  - id: alice-echo
    who: [{token: alice}]
    skills: [echo]
  - id: no-mallory
    effect: deny
    who: [{token: mallory}]
    skills: ['*']
"""
LEGACY = "2025-11-25"


@contextmanager
def _entry_and_worker(
    worker_bundle: Path, tokens: Path, keys: Keys, tmp_path: Path, gateway_bundle: Path
) -> Iterator[tuple[NodeProc, NodeProc]]:
    """node-a, an entry node authenticating the callers of ``tokens`` and letting every
    authenticated caller use everything; node-b, a worker serving ``worker_bundle``."""
    server = NatsServer(tmp_path / "jetstream")
    server.start()
    started: list[NodeProc] = []
    try:
        worker = start_node(
            "node-b", worker_bundle, server.url, keys.member, tmp_path / "b", http=False
        )
        started.append(worker)
        entry = start_node(
            "node-a",
            gateway_bundle,
            server.url,
            keys.member,
            tmp_path / "a",
            extra=["--entry-only", "--token-file", str(tokens)],
        )
        started.append(entry)
        entry.seen(r"node node-b joined")
        yield entry, worker
    finally:
        for node in started:
            node.stop()
        server.stop()


@pytest.fixture
def entry_and_worker(
    sandbox: Sandbox, keys: Keys, tmp_path: Path, gateway_bundle: Path
) -> Iterator[tuple[NodeProc, NodeProc]]:
    """The two nodes for alice and mallory; the worker holds echo, and its own caller rules
    refuse mallory."""
    worker_bundle = make_bundle(
        sandbox, tmp_path / "worker", ["echo"], keys, {"callers/team.yaml": WORKER_RULES}
    )
    tokens = client_tokens(tmp_path, "alice", "mallory")
    with _entry_and_worker(worker_bundle, tokens, keys, tmp_path, gateway_bundle) as nodes:
        yield nodes


async def _call_echo(http: httpx.AsyncClient, url: str, who: str) -> dict[str, Any]:
    """``tools/call echo/echo`` as ``who`` (its bearer token), in a session of its own;
    the call's result."""
    headers = {
        "Accept": "application/json, text/event-stream",
        "Authorization": f"Bearer {token_of(who)}",
    }

    async def post(body: dict[str, Any], session: str | None = None) -> httpx.Response:
        extra = {"Mcp-Session-Id": session, "MCP-Protocol-Version": LEGACY} if session else {}
        return await http.post(url, json=body, headers={**headers, **extra})

    init = await post(
        {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": LEGACY,
                "capabilities": {},
                "clientInfo": {"name": who, "version": "1"},
            },
        }
    )
    assert init.status_code == 200, init.text
    session = init.headers["mcp-session-id"]
    await post({"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
    response = await post(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "echo/echo", "arguments": {"text": f"from {who}"}},
        },
        session,
    )
    assert response.status_code == 200, response.text
    if response.headers.get("content-type", "").startswith("application/json"):
        message = response.json()
    else:
        data = [ln[5:].strip() for ln in response.text.splitlines() if ln.startswith("data:")]
        message = json.loads(data[-1])
    result: dict[str, Any] = message["result"]
    return result


async def _until_listed(http: httpx.AsyncClient, entry: NodeProc) -> dict[str, Any]:
    """alice's call of echo/echo, once the entry node has learnt the worker's tools."""
    assert entry.url is not None
    with anyio.fail_after(60):
        while True:
            result = await _call_echo(http, entry.url, "alice")
            text = result["content"][0]["text"]
            if not (result.get("isError") and "Unknown tool" in text):
                return result
            await anyio.sleep(0.2)  # polling the entry's view of the cluster


async def test_the_worker_refuses_a_caller_its_own_rules_refuse_and_audits_it(
    entry_and_worker: tuple[NodeProc, NodeProc],
) -> None:
    """node-a lets mallory call echo/echo; node-b, which runs it, refuses mallory by its own
    rule (not-permitted, naming callers.no-mallory) and audits the refusal with the caller
    (node-a's verified mallory) and its principal; alice's call runs."""
    entry, worker = entry_and_worker
    assert entry.url is not None
    async with httpx.AsyncClient(timeout=60) as http:
        allowed = await _until_listed(http, entry)
        assert not allowed.get("isError"), allowed
        assert allowed["content"][0]["text"] == "from alice", allowed
        refused = await _call_echo(http, entry.url, "mallory")
    assert refused.get("isError") is True, refused
    text = refused["content"][0]["text"]
    assert "[not-permitted, rule callers.no-mallory]" in text, text
    assert "token:mallory may not call tool echo/echo" in text, text

    def refusal(records: list[dict[str, Any]]) -> dict[str, Any] | None:
        return next(
            (r for r in records if r.get("skill") == "echo" and r.get("refused") is True), None
        )

    record = refusal(worker.audit_until(lambda rs: refusal(rs) is not None))
    assert record is not None
    assert record["caller"] == "node:node-a<token:mallory", record
    assert record["principal"] == "token:mallory", record
    assert record["outcome"] == "not-permitted", record
    assert "callers.no-mallory" in record["error"], record
    # alice's call ran on the worker, for alice.
    ran = worker.audit_until(
        lambda rs: any(r.get("skill") == "echo" and r.get("outcome") == "ok" for r in rs)
    )
    ok = next(r for r in ran if r.get("skill") == "echo" and r.get("outcome") == "ok")
    assert ok["caller"] == "node:node-a<token:alice", ok


# The worker lets alice and bob use the conformance skill (4 slots: a caller's share is
# 3) and refuses mallory.
FULL_RULES = """rules:
  - id: team
    who: [{token: alice}, {token: bob}]
    skills: [conformance]
  - id: no-mallory
    effect: deny
    who: [{token: mallory}]
    skills: ['*']
"""
FOUR_SLOTS = (Path(__file__).parents[1] / "policies" / "conformance.yaml").read_text()
FOUR_SLOTS = FOUR_SLOTS.replace("concurrency: 16", "concurrency: 4")


@pytest.fixture
def full_worker(
    sandbox: Sandbox, keys: Keys, tmp_path: Path, gateway_bundle: Path
) -> Iterator[NodeProc]:
    """The two nodes for alice, bob and mallory (and ops, who reads the entry's /metrics);
    the worker holds the conformance skill at 4 slots, and its own rules refuse mallory."""
    worker_bundle = make_bundle(
        sandbox,
        tmp_path / "worker",
        ["conformance"],
        keys,
        {"callers/team.yaml": FULL_RULES, "conformance.yaml": FOUR_SLOTS},
    )
    tokens = tmp_path / "tokens"
    tokens.write_text(
        "".join(f"{who} {token_of(who)}\n" for who in ("alice", "bob", "mallory"))
        + f"ops {token_of('ops')} {METRICS_SCOPE}\n"
    )
    tokens.chmod(0o600)
    with _entry_and_worker(worker_bundle, tokens, keys, tmp_path, gateway_bundle) as nodes:
        yield nodes[0]


async def test_a_refused_caller_is_refused_at_once_when_the_skill_is_full(
    full_worker: NodeProc,
) -> None:
    """With every slot of the worker's skill taken by callers its rules let in (alice's
    share of 3, bob's 1), mallory, whom they refuse, is answered not-permitted at once: she
    neither waits for a slot (up to the skill's 120 s wall time) nor hears it is busy."""
    entry = full_worker
    assert entry.url is not None
    url = entry.url

    def greet(who: str) -> dict[str, Any]:
        return {"name": "greet", "arguments": {"name": who}}

    slow = {"name": "slow_compute", "arguments": {"seconds": 60, "label": "held"}}
    async with httpx.AsyncClient(timeout=120) as http, anyio.create_task_group() as tg:
        with anyio.fail_after(60):  # until the entry node knows the worker's tools
            while "Unknown tool" in json.dumps(
                await rpc(http, url, "tools/call", greet("a"), extensions=False, who="alice")
            ):
                await anyio.sleep(0.2)

        async def hold(who: str) -> None:
            await rpc(http, url, "tools/call", slow, extensions=False, who=who)

        for who in ("alice", "alice", "alice", "bob"):
            tg.start_soon(hold, who)
        with anyio.fail_after(60):
            while await entry_in_flight(http, url) < 4:
                await anyio.sleep(0.1)
        with anyio.fail_after(20):  # not the skill's 120 s wall time
            refused = await rpc(
                http, url, "tools/call", greet("m"), extensions=False, who="mallory"
            )
        tg.cancel_scope.cancel()
    text = json.dumps(refused)
    assert "not-permitted" in text and "callers.no-mallory" in text, refused
    assert "busy" not in text, refused
