"""An input-required round whose retry reaches the other entry node: the call stays in its
first request's trace, the retry is relayed in the retry's trace, and the retry leads back
to the call it resumed (a span link)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from skilld.sandbox import Sandbox
from support.cluster import Keys, NatsServer, NodeProc, entry_nodes, make_bundle, make_keys
from support.env import ROOT
from support.otlp import Receiver, Span, otlp_receiver

pytestmark = pytest.mark.anyio

MODERN = "2026-07-28"
STATE = "test_input_required_result_request_state"
META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}, "sampling": {}},
}
FIRST = ("a" * 32, "1" * 16)  # (trace, the client's span) of the first request
RETRY = ("b" * 32, "2" * 16)  # and of the retry


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return make_keys(tmp_path_factory.mktemp("keys"))


@pytest.fixture
def entries(
    sandbox: Sandbox, keys: Keys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Receiver, NodeProc, NodeProc]]:
    """node-b holds the conformance skill; node-a and node-c are entry-only, sharing a
    round-sealing key; all three export their spans to one receiver."""
    policy = (ROOT / "tests" / "policies" / "conformance.yaml").read_text()
    worker_bundle = make_bundle(
        sandbox, tmp_path / "worker", ["conformance"], keys, {"conformance.yaml": policy}
    )
    gateway = make_bundle(sandbox, tmp_path / "gateway", ["echo-wat"], keys, {})
    key_file = tmp_path / "request-state.key"
    key_file.write_text(secrets.token_hex(32))
    key_file.chmod(0o600)
    with otlp_receiver() as receiver:
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        nats = NatsServer(tmp_path / "jetstream")
        nats.start()
        try:
            with entry_nodes(nats.url, keys.member, worker_bundle, gateway, tmp_path, key_file) as (
                _,
                a,
                c,
            ):
                yield receiver, a, c
        finally:
            nats.stop()


async def _modern(
    http: httpx2.AsyncClient, url: str, params: dict[str, Any], traceparent: str
) -> dict[str, Any]:
    meta = {**META, "traceparent": traceparent}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {**params, "_meta": meta}}
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "tools/call",
        "Mcp-Name": str(params["name"]),
    }
    response = await http.post(url, json=body, headers=headers)
    if response.headers.get("content-type", "").startswith("application/json"):
        message: dict[str, Any] = response.json()
        return message
    data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
    last: dict[str, Any] = json.loads(data[-1])
    return last


def _server(spans: list[Span], trace: str, node: str) -> Span | None:
    return next(
        (
            s
            for s in spans
            if s.trace_id == trace and s.node == node and s.name == f"tools/call {STATE}"
        ),
        None,
    )


async def test_a_retry_at_the_other_entry_node_keeps_the_call_in_its_first_trace(
    entries: tuple[Receiver, NodeProc, NodeProc],
) -> None:
    """Round one through node-a (trace F), its retry through node-c (trace R): the guest's
    call on node-b is in F under node-a's route; node-a runs the relayed retry in R, under
    node-c's request span; node-a's relayed span links to F's request span."""
    receiver, a, c = entries
    assert a.url is not None and c.url is not None
    answer = {"confirm": {"action": "accept", "content": {"ok": True}}}
    with anyio.fail_after(120):
        async with httpx2.AsyncClient(timeout=60) as http:
            first = await _modern(http, a.url, {"name": STATE}, f"00-{FIRST[0]}-{FIRST[1]}-01")
            assert first["result"]["resultType"] == "input_required", first
            params = {
                "name": STATE,
                "inputResponses": answer,
                "requestState": first["result"]["requestState"],
            }
            done = await _modern(http, c.url, params, f"00-{RETRY[0]}-{RETRY[1]}-01")
    assert "state-ok: confirmed=True" in done["result"]["content"][0]["text"], done

    def complete(spans: list[Span]) -> bool:
        names = {(s.trace_id, s.node, s.name) for s in spans}
        return (
            _server(spans, FIRST[0], "node-a") is not None
            and _server(spans, RETRY[0], "node-c") is not None
            and (RETRY[0], "node-a", "skilld.round.relayed") in names
            and any(n == "node-b" and m.startswith("execute_tool") for _, n, m in names)
            and any(n == "node-a" and m.startswith("execute_tool") for _, n, m in names)
        )

    spans = receiver.wait(complete)
    by_id = {s.span_id: s for s in spans}
    first_server = _server(spans, FIRST[0], "node-a")
    retry_server = _server(spans, RETRY[0], "node-c")
    assert first_server is not None and retry_server is not None
    assert first_server.parent_id == FIRST[1] and retry_server.parent_id == RETRY[1]
    # The guest ran once, on node-b, in the first request's trace.
    worker_calls = [s for s in spans if s.node == "node-b" and s.name.startswith("execute_tool")]
    assert len(worker_calls) == 1 and worker_calls[0].trace_id == FIRST[0], worker_calls
    # node-a's call outlived its first request (its guest asked the client): the request
    # span has the call's facts but not its outcome, and the call's own execute_tool span
    # was made when it ended, beneath that request span, in its trace, with the outcome.
    assert first_server.attributes["skilld.skill"] == "conformance", first_server.attributes
    assert "skilld.outcome" not in first_server.attributes
    late = [s for s in spans if s.node == "node-a" and s.name.startswith("execute_tool")]
    assert len(late) == 1, late
    assert (late[0].trace_id, late[0].parent_id) == (FIRST[0], first_server.span_id)
    assert late[0].attributes["skilld.outcome"] == "ok"
    assert late[0].start_ns < first_server.end_ns < late[0].end_ns
    # The retry crossed to node-a in the retry's trace, beneath node-c's request span.
    relayed = next(s for s in spans if s.name == "skilld.round.relayed")
    assert (relayed.trace_id, relayed.node, relayed.kind) == (RETRY[0], "node-a", "server")
    parent = relayed
    while parent.parent_id in by_id:
        parent = by_id[parent.parent_id]
    assert parent.span_id == retry_server.span_id
    # ... and leads back to the call it resumed.
    assert (FIRST[0], first_server.span_id) in relayed.links, relayed.links
