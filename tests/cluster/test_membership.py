"""Three nodes as real processes over a real nats-server: membership and routed calls."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import types

from support.cluster import Keys, NatsServer, NodeProc, mcp_client, start_node
from support.mcp_fakes import text_of as _text

DEMO_TOOLS = {"echo/echo", "echo-wat/echo", "notes/get", "test_simple_text", "test_sampling"}
HOSTILE_TOOLS = {"hostile/chatty", "hostile/loop", "hostile/ok"}

pytestmark = pytest.mark.anyio



@pytest.fixture
def three(
    nats: NatsServer,
    keys: Keys,
    demo_cluster_bundle: Path,
    hostile_bundle: Path,
    gateway_bundle: Path,
    tmp_path: Path,
) -> Iterator[dict[str, NodeProc]]:
    """node-a: entry only, holding no skill; node-b: the demo skills; node-c: hostile, worker."""
    nodes: dict[str, NodeProc] = {}
    try:
        nodes["b"] = start_node(
            "node-b", demo_cluster_bundle, nats.url, keys.member, tmp_path / "b"
        )
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


async def test_every_entry_node_lists_every_tool_and_routes_calls(
    three: dict[str, NodeProc],
) -> None:
    """Both entry nodes list the tools of all three nodes; a call runs on the node holding it."""
    for entry in ("a", "b"):
        url = three[entry].url
        assert url is not None
        async with mcp_client(url) as client:
            names = await client.wait_tools(lambda n: n >= DEMO_TOOLS | HOSTILE_TOOLS)
            assert "echo-wat/echo" in names
            result = await client.session.call_tool("hostile/ok", {"text": f"via {entry}"})
            assert not result.is_error, _text(result)
            assert _text(result) == f"via {entry}"

    def calls(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in records if r.get("event") == "call" and r["method"] == "ok"]

    served = calls(three["c"].audit_until(lambda rs: len(calls(rs)) == 2))
    assert [r["caller"] for r in served] == ["node:node-a<anonymous", "node:node-b<anonymous"]
    # The entry node audits the call too, as a call of its (remote) skill.
    entry_side = calls(three["a"].audit_until(lambda rs: len(calls(rs)) == 1))
    assert [(r["skill"], r["outcome"]) for r in entry_side] == [("hostile", "ok")]


async def test_remote_guest_reaches_the_client(three: dict[str, NodeProc]) -> None:
    """Progress, logs, sampling and elicitation of a guest on node-b reach a client of node-a."""
    url = three["a"].url
    assert url is not None
    async with mcp_client(url) as client:
        await client.wait_tools(lambda n: n >= DEMO_TOOLS)
        progress: list[tuple[float, float | None, str | None]] = []

        async def on_progress(p: float, total: float | None, message: str | None) -> None:
            progress.append((p, total, message))

        result = await client.session.call_tool(
            "test_tool_with_progress", {}, progress_callback=on_progress
        )
        assert not result.is_error, _text(result)
        assert [p for p, _, _ in progress] == [0, 50, 100]
        result = await client.session.call_tool("test_tool_with_logging", {})
        assert not result.is_error, _text(result)
        assert len(client.logs) >= 3
        result = await client.session.call_tool("test_sampling", {"prompt": "hello"})
        assert "echo: hello" in _text(result), _text(result)
        result = await client.session.call_tool("test_elicitation", {"message": "who?"})
        assert "Ada" in _text(result), _text(result)
        # rich content and structured output come through as well
        result = await client.session.call_tool("test_image_content", {})
        assert isinstance(result.content[0], types.ImageContent)
        result = await client.session.call_tool(
            "echo/structured", {"name": "tri", "points": [{"x": 0, "y": 0}]}
        )
        assert result.structured_content is not None


async def test_deadline_and_cancellation_stop_the_remote_guest(three: dict[str, NodeProc]) -> None:
    """A spinning remote guest is stopped by its deadline, and by the client cancelling."""
    url = three["a"].url
    assert url is not None
    async with mcp_client(url) as client:
        await client.wait_tools(lambda n: n >= HOSTILE_TOOLS)
        result = await client.session.call_tool("hostile/loop", {})
        assert result.is_error
        assert _text(result).startswith("[timeout]"), _text(result)
        first = await anyio.to_thread.run_sync(lambda: three["c"].wait_audit(method="loop"))
        assert first["outcome"] == "deadline"
        with anyio.move_on_after(0.5):  # the client gives up on the call (notifications/cancelled)
            await client.session.call_tool("hostile/loop", {})
        # node-c stops the guest as cancelled, well before its 2 s deadline
        second = await anyio.to_thread.run_sync(lambda: three["c"].wait_audit(method="loop"))
        assert second["outcome"] == "cancelled", json.dumps(second)
        assert second["duration_ms"] < 1900


async def test_status_and_metrics_show_the_cluster(
    three: dict[str, NodeProc], nats: NatsServer, gateway_bundle: Path
) -> None:
    """`skilld cluster status` lists the three nodes, verified; /metrics has the cluster gauges."""
    import os
    import subprocess
    import sys
    import urllib.request

    from support.env import cache_env

    url = three["a"].url
    assert url is not None
    async with mcp_client(url) as client:  # every node has joined node-a's view
        await client.wait_tools(lambda n: n >= DEMO_TOOLS | HOSTILE_TOOLS)
    done = await anyio.to_thread.run_sync(
        lambda: subprocess.run(
            [
                sys.executable,
                "-m",
                "skilld",
                "cluster",
                "status",
                "--cluster",
                nats.url,
                "--bundle",
                str(gateway_bundle),
                "--json",
                "--wait",
                "1.5",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, **cache_env()},
        )
    )
    assert done.returncode == 0, done.stderr
    nodes = {n["node"]: n for n in json.loads(done.stdout)["nodes"]}
    assert sorted(nodes) == ["node-a", "node-b", "node-c"]
    assert all(n["verified"] for n in nodes.values())
    assert nodes["node-c"]["roles"] == ["worker"]
    assert nodes["node-a"]["roles"] == ["entry"]  # entry-only: no skill of its own
    assert nodes["node-b"]["roles"] == ["entry", "worker"]
    assert {s["id"] for s in nodes["node-b"]["skills"]} == {
        "echo",
        "echo-wat",
        "notes",
        "conformance",
        "delegate",
        "kit.notes",
        "kit.text",
    }
    metrics = url.removesuffix("/mcp") + "/metrics"
    with urllib.request.urlopen(metrics, timeout=10) as response:  # a local test server
        text = response.read().decode()
    assert "skilld_cluster_connected 1.0" in text
    assert "skilld_cluster_nodes 2.0" in text
    # echo is on node-b and on node-c (one package): five remote skills, and node-b's
    # delegate with its kits kit.notes and kit.text
    assert "skilld_cluster_remote_skills 8.0" in text, text[-1500:]
    # `nats micro info skilld` asks this: every node answers as a service named skilld
    import nats as nats_client

    nc = await nats_client.connect(nats.url)
    try:
        info = json.loads((await nc.request("$SRV.INFO.skilld", b"", timeout=5)).data)
    finally:
        await nc.close()
    assert info["name"] == "skilld"
    assert info["metadata"]["node"] in {"node-b", "node-c"}
    assert all(e["subject"].startswith("skilld.call.") for e in info["endpoints"])


async def test_results_larger_than_the_payload_limit_arrive(
    keys: Keys, gateway_bundle: Path, tmp_path: Path
) -> None:
    """With nats-server's max_payload at 8 KiB, a 6 KiB echo comes back whole, in parts."""
    server = NatsServer(tmp_path / "jetstream", max_payload=8192)
    server.start()
    nodes = []
    try:
        nodes.append(
            start_node(
                "node-b", gateway_bundle, server.url, keys.member, tmp_path / "b", http=False
            )
        )
        nodes.append(
            start_node(
                "node-a",
                gateway_bundle,
                server.url,
                keys.member,
                tmp_path / "a",
                extra=["--entry-only"],
            )
        )
        url = nodes[1].url
        assert url is not None
        text = "".join(chr(0x41 + i % 26) for i in range(6 * 1024))
        async with mcp_client(url) as client:
            await client.wait_tools(lambda n: "echo-wat/echo" in n)
            result = await client.session.call_tool("echo-wat/echo", {"text": text})
            assert not result.is_error, _text(result)
            assert _text(result) == text
    finally:
        for node in nodes:
            node.stop()
        server.stop()
