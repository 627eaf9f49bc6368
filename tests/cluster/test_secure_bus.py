"""The bus `skilld cluster nats-config` writes: nodes work, nobody else hears a thing."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nats as nats_client
import pytest
from mcp import types

from skilld.package import nkeys
from support.cluster import Keys, NatsServer, NodeProc, mcp_client, start_node

# nats-py answers the server's challenge with a module named nkeys: skilld's own (the
# PyPI package has no wheel), as skilld's cluster link registers it.
sys.modules.setdefault("nkeys", nkeys.NATS_MODULE)

pytestmark = pytest.mark.anyio

NODES = ("node-a", "node-b", "node-c")


@pytest.fixture(scope="module")
def bus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The configuration directory, written by the command itself."""
    out = tmp_path_factory.mktemp("bus") / "nats"
    argv = [sys.executable, "-m", "skilld", "cluster", "nats-config", "--out", str(out)]
    for node in NODES:
        argv += ["--node", node]
    subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60)
    return out


@pytest.fixture(scope="module")
def cluster(
    bus: Path,
    keys: Keys,
    demo_cluster_bundle: Path,
    gateway_bundle: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[NatsServer, dict[str, NodeProc]]]:
    """nats-server on that configuration; node-b holds the demo skills, node-a is the entry."""
    root = tmp_path_factory.mktemp("secure")
    server = NatsServer(root / "jetstream", config=bus / "nats.conf")
    server.start()
    nodes: dict[str, NodeProc] = {}
    try:
        nodes["b"] = start_node(
            "node-b", demo_cluster_bundle, server.url, keys.member, root / "b", http=False, bus=bus
        )
        nodes["a"] = start_node(
            "node-a",
            gateway_bundle,
            server.url,
            keys.member,
            root / "a",
            extra=["--entry-only"],
            bus=bus,
        )
        nodes["a"].seen(r"node node-b joined")
        yield server, nodes
    finally:
        for node in nodes.values():
            node.stop()
        server.stop()


def _tls(bus: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(bus / "ca.pem"))


async def test_nodes_serve_through_the_least_privilege_bus(
    cluster: tuple[NatsServer, dict[str, NodeProc]],
) -> None:
    """A tool call routed over the TLS, NKey, per-subject bus works, both audits name the
    verified other node, and nobody warns."""
    _server, nodes = cluster
    assert nodes["a"].url is not None
    async with mcp_client(nodes["a"].url) as client:
        await client.wait_tools(lambda n: "echo/echo" in n)
        result = await client.session.call_tool("echo/echo", {"text": "sealed"})
    assert not result.is_error, result.content
    assert [b.text for b in result.content if isinstance(b, types.TextContent)] == ["sealed"]
    for node in nodes.values():
        assert "INSECURE BUS" not in node.log()
    # Both audits name the verified other side: the holder its sender, the entry its holder.
    held = nodes["b"].audit_until(lambda rs: any(r.get("skill") == "echo" for r in rs))
    assert next(r for r in held if r.get("skill") == "echo")["caller"] == "node:node-a<anonymous"
    routed = nodes["a"].audit_until(lambda rs: any(r.get("skill") == "echo" for r in rs))
    assert next(r for r in routed if r.get("skill") == "echo")["holder"] == "node-b"


async def test_an_anonymous_client_cannot_even_connect(
    cluster: tuple[NatsServer, dict[str, NodeProc]], bus: Path
) -> None:
    """Without a node's NKey the server refuses the connection: no payload can be read."""
    server, _nodes = cluster
    with pytest.raises(Exception, match=r"(?i)authorization"):
        await nats_client.connect(
            server.url, tls=_tls(bus), allow_reconnect=False, connect_timeout=5
        )
    # Nor in plain text: the server requires TLS.
    with pytest.raises(Exception):  # noqa: B017 - any refusal will do
        await nats_client.connect(
            server.url.replace("tls://", "nats://"), allow_reconnect=False, connect_timeout=5
        )


async def test_a_node_cannot_read_another_nodes_calls(
    cluster: tuple[NatsServer, dict[str, NodeProc]], bus: Path
) -> None:
    """node-c's own credentials may not subscribe to node-b's calls nor node-a's inbox."""
    server, _nodes = cluster
    for subject in ("skilld.call.node-b.>", "_INBOX.node-a.>", "skilld.>", ">"):
        violations: asyncio.Queue[Exception] = asyncio.Queue()

        async def error(exc: Exception, box: asyncio.Queue[Exception] = violations) -> None:
            await box.put(exc)

        nc = await nats_client.connect(
            server.url,
            tls=_tls(bus),
            nkeys_seed_str=(bus / "node-c.nk").read_text().strip(),
            error_cb=error,
            allow_reconnect=False,
        )
        try:
            await nc.subscribe(subject)
            await nc.flush()
            exc = await asyncio.wait_for(violations.get(), timeout=10)
            assert "permissions violation" in str(exc).lower(), exc
        finally:
            await nc.close()


async def test_the_observer_hears_announcements_only(
    cluster: tuple[NatsServer, dict[str, NodeProc]], bus: Path
) -> None:
    """`skilld cluster status` with the observer seed lists the nodes and node-b's skills,
    delegate's kits among them (ids with a dot, served under a mapped endpoint name)."""
    server, _nodes = cluster
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "skilld",
            "cluster",
            "status",
            "--cluster",
            server.url,
            "--nats-nkey",
            str(bus / "observer.nk"),
            "--nats-tls-ca",
            str(bus / "ca.pem"),
            "--wait",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "node-b" in done.stdout and "node-a" in done.stdout, done.stdout
    for skill in ("kit.notes", "kit.text", "notes", "echo", "conformance"):
        assert f"    {skill} " in done.stdout, done.stdout


async def test_a_node_on_an_open_bus_says_so_loudly(
    nats: NatsServer, keys: Keys, gateway_bundle: Path, tmp_path: Path
) -> None:
    """A bus where an anonymous connection can subscribe to skilld.> is named at start-up."""
    node = start_node("node-a", gateway_bundle, nats.url, keys.member, tmp_path / "a")
    try:
        node.seen(r"INSECURE BUS", timeout=30)
    finally:
        node.stop()
