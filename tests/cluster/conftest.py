"""Fixtures for the cluster tests: keys, bundles, a nats-server per test."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

from skilld.sandbox import Sandbox
from support.callers import ALL_AUTHENTICATED
from support.cluster import (
    HOSTILE_POLICY,
    EntryNodes,
    Keys,
    NatsServer,
    entry_nodes,
    make_bundle,
    make_keys,
)
from support.env import ROOT


@pytest.fixture(scope="session")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    """Each node's own key (trusted for its name only) and a stranger's key."""
    return make_keys(tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="session")
def demo_cluster_bundle(
    sandbox: Sandbox, keys: Keys, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The whole demo bundle (echo, echo-wat, notes, delegate's kits kit.notes and kit.text)
    and the conformance skill, with the repo's policies and caller rules letting every
    authenticated caller use everything (a worker checks the caller an entry node
    verified against its own rules)."""
    policies = {
        p.name: p.read_text()
        for p in [
            *(ROOT / "policies").glob("*.yaml"),
            ROOT / "tests" / "policies" / "conformance.yaml",
        ]
    }
    policies |= {
        f"kits/{p.name}": p.read_text() for p in (ROOT / "policies" / "kits").glob("*.yaml")
    }
    policies["callers/all.yaml"] = ALL_AUTHENTICATED
    return make_bundle(
        sandbox,
        tmp_path_factory.mktemp("demo-cluster"),
        ["echo", "echo-wat", "notes", "conformance"],
        keys,
        policies,
    )


@pytest.fixture(scope="session")
def hostile_bundle(sandbox: Sandbox, keys: Keys, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The hostile test skill (spins, chats, keeps kv) with a 2 s wall time."""
    root = tmp_path_factory.mktemp("hostile-cluster")
    (root / "data").mkdir()
    return make_bundle(
        sandbox,
        root,
        ["hostile", "echo"],
        keys,
        {
            "hostile.yaml": HOSTILE_POLICY.replace("{data}", str(root / "data")),
            "echo.yaml": "skill: echo\ninvoke:\n  called_by: [hostile]\n",
        },
    )


@pytest.fixture(scope="session")
def gateway_bundle(sandbox: Sandbox, keys: Keys, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small bundle for entry-only nodes: its trust set, and caller rules letting every
    authenticated caller use everything (for entry nodes serving with tokens)."""
    callers = {"callers/all.yaml": ALL_AUTHENTICATED}
    return make_bundle(sandbox, tmp_path_factory.mktemp("gateway"), ["echo-wat"], keys, callers)


@pytest.fixture
def nats(tmp_path: Path) -> Iterator[NatsServer]:
    """A nats-server with JetStream in a temp dir, on an ephemeral port."""
    server = NatsServer(tmp_path / "jetstream")
    server.start()
    try:
        yield server
    finally:
        server.stop()


# The nodes the least-privilege bus of `bus_nats` knows (node-check: a test's own link).
BUS_NODES = ("node-a", "node-b", "node-c", "node-w1", "node-w2", "node-check")


@pytest.fixture
def bus_nats(tmp_path: Path) -> Iterator[tuple[NatsServer, Path]]:
    """nats-server on the configuration `skilld cluster nats-config` writes (TLS, an NKey
    user per node of BUS_NODES, subject permissions, no anonymous user), and its directory."""
    from skilld.cluster import write_nats_config

    bus = tmp_path / "bus"
    write_nats_config(bus, list(BUS_NODES))
    server = NatsServer(tmp_path / "unused", config=bus / "nats.conf")
    server.start()
    try:
        yield server, bus
    finally:
        server.stop()


@pytest.fixture
def bus_entry_nodes(
    bus_nats: tuple[NatsServer, Path],
    keys: Keys,
    demo_cluster_bundle: Path,
    gateway_bundle: Path,
    tmp_path: Path,
) -> EntryNodes:
    """:func:`support.cluster.entry_nodes` on the bus of ``bus_nats``: node-b with the whole
    demo bundle (7 skills), node-a and node-c entry-only with the gateway bundle, sharing
    the bus directory's ``request-state.key``; called with the entry nodes' ``extra``
    options."""
    nats, bus = bus_nats
    return functools.partial(
        entry_nodes,
        nats.url,
        keys.member,
        demo_cluster_bundle,
        gateway_bundle,
        tmp_path,
        bus / "request-state.key",
        bus=bus,
        worker_skills=7,
    )


@pytest.fixture
def anyio_backend() -> str:
    """The MCP client runs on asyncio."""
    return "asyncio"
