"""One trace, from an MCP client through an entry node to a worker, its guest's host calls,
a nested skill call and the native script it runs, exported over OTLP/HTTP."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp import types

from skilld.bundle import build_bundle
from skilld.sandbox import Sandbox
from support.cluster import (
    Keys,
    NatsServer,
    NodeProc,
    make_bundle,
    make_keys,
    mcp_client,
    start_node,
)
from support.env import SKILLS, cache_dir
from support.otlp import Receiver, Span, otlp_receiver

pytestmark = pytest.mark.anyio

# The client's own span: the server span's parent.
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
# An argument value no span may carry (no skill here is opted in to recording them).
SECRET = "do-not-trace-7f3a9c"

# An Agent Skill named echo: hostile's manifest may call a skill of that name only.
TRACER_SKILL = """\
---
name: echo
description: Prints the trace context its native script was started with. Test use only.
---

# Echo

`scripts/show.py WORD` prints the TRACEPARENT of its environment and WORD.
"""
SHOW = """\
import os
import sys

print(os.environ.get("TRACEPARENT", "none"), sys.argv[1])
"""
TRACER_POLICY = """\
skill: echo
scripts:
  executor: native
  interpreters: [python]
invoke:
  called_by: [hostile]
"""
HOSTILE_POLICY = (
    "skill: hostile\nkv: {}\nfs:\n  - path: {data}\n    mode: ro\n"
    "invoke:\n  id: to-echo\n  calls: [echo]\n"
)
# What the MCP semantic conventions name on the server span (the SDK's middleware and
# skilld's beside it).
CONVENTIONS = {
    "mcp.method.name",
    "mcp.protocol.version",
    "mcp.session.id",
    "jsonrpc.request.id",
    "gen_ai.operation.name",
    "gen_ai.tool.name",
    "network.transport",
}


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return make_keys(tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="module")
def worker_bundle(sandbox: Sandbox, keys: Keys, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """hostile (wasm; its relay invokes echo) and echo (an Agent Skill, a native script)."""
    root = tmp_path_factory.mktemp("traced")
    src = root / "src"
    shutil.copytree(SKILLS["hostile"], src / "skills" / "hostile")
    tracer = src / "skills" / "echo"
    (tracer / "scripts").mkdir(parents=True)
    (tracer / "SKILL.md").write_text(TRACER_SKILL)
    (tracer / "scripts" / "show.py").write_text(SHOW)
    policies = src / "policies"
    (policies / "trust").mkdir(parents=True)
    (policies / "echo.yaml").write_text(TRACER_POLICY)
    (policies / "hostile.yaml").write_text(HOSTILE_POLICY.replace("{data}", str(root)))
    for trust_file in sorted(keys.trust.glob("*.pub.json")):
        shutil.copy(trust_file, policies / "trust" / trust_file.name)
    out = root / "bundle"
    build_bundle(
        src / "skills", policies, out, sandbox=sandbox, cache_dir=cache_dir(), strict=False
    )
    return out


@pytest.fixture
def traced_cluster(
    sandbox: Sandbox,
    keys: Keys,
    worker_bundle: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[Receiver, NodeProc, NodeProc]]:
    """An OTLP receiver; node-a (entry only) and node-w1 (holds hostile and echo), both
    exporting to it (short batch and metric intervals: the test waits for less)."""
    with otlp_receiver() as receiver:
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
        monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "300")
        monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
        gateway = make_bundle(sandbox, tmp_path / "gateway", ["echo-wat"], keys, {})
        nats = NatsServer(tmp_path / "jetstream")
        nats.start()
        nodes: list[NodeProc] = []
        try:
            nodes.append(
                start_node(
                    "node-w1", worker_bundle, nats.url, keys.member, tmp_path / "w1", http=False
                )
            )
            entry = start_node(
                "node-a", gateway, nats.url, keys.member, tmp_path / "a", extra=["--entry-only"]
            )
            nodes.append(entry)
            entry.seen(r"node node-w1 joined")
            yield receiver, entry, nodes[0]
        finally:
            for node in nodes:
                node.stop()
            nats.stop()


def _one(spans: list[Span], name: str, node: str | None = None) -> Span:
    found = [s for s in spans if s.name == name and (node is None or s.node == node)]
    assert len(found) == 1, (name, node, [(s.node, s.name) for s in spans])
    return found[0]


def _complete(spans: list[Span]) -> bool:
    # Every span the test reads: a node's spans may reach the receiver in several batches.
    names = {(s.node, s.name) for s in spans if s.trace_id == TRACE_ID}
    return {
        ("node-a", "tools/call hostile/relay"),
        ("node-a", "skilld.route hostile"),
        ("node-w1", "skilld.guest.run"),
        ("node-w1", "skilld.host invoke.call"),
        ("node-w1", "skilld.process.launch"),
        ("node-w1", "skilld.process.run"),
        ("node-w1", "execute_tool echo.run_script"),
        ("node-w1", "skilld.process"),
        ("node-w1", "execute_tool hostile.relay"),
    } <= names


async def test_one_tools_call_is_one_trace_from_the_client_to_the_native_script(
    traced_cluster: tuple[Receiver, NodeProc, NodeProc],
) -> None:
    """The client's traceparent (in _meta) parents the entry node's server span; the call
    crosses to the worker in the sealed envelope; the guest's invoke, the nested call and
    the script's process hang beneath, all in one trace; the script gets TRACEPARENT naming
    its process span; the conventions' attributes are there and no argument value is."""
    receiver, entry, _worker = traced_cluster
    assert entry.url is not None
    async with mcp_client(entry.url) as client:
        await client.wait_tools(lambda names: "hostile/relay" in names)
        arguments = {
            "skill_id": "echo",
            "method": "run_script",
            "args": {"script": "scripts/show.py", "args": [SECRET]},
        }
        # A first call (a trace of its own): the one looked at is not the nodes' first.
        warm = await client.session.call_tool("hostile/relay", arguments)
        assert not warm.is_error, warm.content
        result = await client.session.call_tool(
            "hostile/relay", arguments, meta={"traceparent": TRACEPARENT}
        )
    assert not result.is_error, result.content
    text = "".join(b.text for b in result.content if isinstance(b, types.TextContent))

    spans = receiver.wait(_complete)
    ours = [s for s in spans if s.trace_id == TRACE_ID]
    by_id = {s.span_id: s for s in ours}
    # One trace: the request's spans on both nodes, every parent among them (but the client's).
    assert {s.node for s in ours} == {"node-a", "node-w1"}
    assert all(s.resource.get("service.name") == "skilld" for s in ours)
    for s in ours:
        assert s.parent_id in by_id or s.parent_id == CLIENT_SPAN, (s.node, s.name)

    server = _one(ours, "tools/call hostile/relay", "node-a")
    assert (server.kind, server.parent_id) == ("server", CLIENT_SPAN)
    assert server.attributes.keys() >= CONVENTIONS, server.attributes
    assert server.attributes["gen_ai.operation.name"] == "execute_tool"
    assert server.attributes["mcp.method.name"] == "tools/call"

    def chain(span: Span) -> list[str]:
        names = []
        while span.parent_id in by_id:
            span = by_id[span.parent_id]
            names.append(f"{span.node}:{span.name}")
        return names

    process = _one(ours, "skilld.process", "node-w1")
    assert chain(process) == [
        "node-w1:execute_tool echo.run_script",
        "node-w1:skilld.host invoke.call",
        "node-w1:skilld.guest.run",
        "node-w1:execute_tool hostile.relay",
        "node-a:skilld.route hostile",
        "node-a:tools/call hostile/relay",
    ]
    # The entry node's call has its facts on the request span (no span of its own).
    assert server.attributes["skilld.skill"] == "hostile", server.attributes
    assert server.attributes["skilld.outcome"] == "ok"
    assert not any(s.name.startswith("execute_tool") for s in ours if s.node == "node-a")
    route = _one(ours, "skilld.route hostile", "node-a")
    assert route.kind == "client" and route.attributes["skilld.node.target"] == "node-w1"
    invoke = _one(ours, "skilld.host invoke.call", "node-w1")
    assert invoke.attributes["skilld.permission.allowed"] is True
    assert invoke.attributes["skilld.permission.rule"] == "hostile.to-echo"
    assert ("skilld.permission", {
        "skilld.permission.capability": "invoke",
        "skilld.permission.action": "call",
        "skilld.permission.allowed": True,
        "skilld.permission.rule": "hostile.to-echo",
    }) in invoke.events  # fmt: skip
    nested = _one(ours, "execute_tool echo.run_script", "node-w1")
    assert nested.attributes["skilld.depth"] == 1
    assert nested.attributes["skilld.outcome"] == "ok"
    assert {s.name for s in ours if s.parent_id == process.span_id} >= {
        "skilld.process.launch",
        "skilld.process.run",
    }
    # The script saw the W3C variable naming its process span, in this trace.
    assert f"00-{TRACE_ID}-{process.span_id}-01" in text, text

    # No argument value, nor the result, on any span of any trace.
    for s in spans:
        shown = json.dumps([s.attributes, s.events, s.name], default=str)
        assert SECRET not in shown, (s.node, s.name)
        assert "gen_ai.tool.call.arguments" not in s.attributes
    # The call metrics beside the spans.
    receiver_metrics = _wait_metrics(receiver)
    assert {"mcp.server.operation.duration", "skilld.call.duration"} <= receiver_metrics
    if os.environ.get("SKILLD_TRACE_DUMP"):
        Path(os.environ["SKILLD_TRACE_DUMP"]).write_text(
            json.dumps([s.as_dict() for s in ours], indent=1)
        )


def _wait_metrics(receiver: Receiver) -> set[str]:
    wanted = {"mcp.server.operation.duration", "skilld.call.duration"}
    receiver.wait(lambda _spans: wanted <= receiver.metrics, timeout=15)
    return set(receiver.metrics)
