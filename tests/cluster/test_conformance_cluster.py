"""The official MCP conformance suite through an entry node that holds no skill itself."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from cluster_harness import Keys, NatsServer, start_node

from tests_env import ROOT

# Where tests/cli/test_conformance_serve.py looks for the runner too.
SUITE = Path(os.environ.get("SKILLD_MCP_CONFORMANCE") or ROOT / "tools" / "mcp-conformance")


@pytest.mark.slow
def test_entry_node_passes_every_server_scenario(
    bus_nats: tuple[NatsServer, Path],
    keys: Keys,
    demo_cluster_bundle: Path,
    gateway_bundle: Path,
    tmp_path: Path,
) -> None:
    """All 30 server scenarios pass against node-a, with the conformance skill on node-b,
    a worker carrying the whole demo bundle (delegate's kits kit.notes and kit.text too)."""
    assert SUITE.exists(), f"the conformance runner is not at {SUITE} (set SKILLD_MCP_CONFORMANCE)"
    nats, bus = bus_nats  # the documented bus: TLS, NKeys, subject permissions
    holder = start_node(
        "node-b", demo_cluster_bundle, nats.url, keys.member, tmp_path / "b", http=False, bus=bus
    )
    entry = start_node(
        "node-a",
        gateway_bundle,
        nats.url,
        keys.member,
        tmp_path / "a",
        extra=["--entry-only"],
        bus=bus,
    )
    try:
        # echo, echo-wat, notes, conformance, kit.notes, kit.text and their pyrunner
        entry.seen(r"node node-b joined \(7 skills\)")
        assert entry.url is not None
        done = subprocess.run(
            [str(SUITE), entry.url, "--requirements", "2025-11-25"],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
    finally:
        entry.stop()
        holder.stop()
    summary = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"scenarios: 30 passed, 0 failed", summary), done.stdout[-4000:]


@pytest.mark.slow
def test_entry_node_passes_every_2026_07_28_scenario(
    bus_nats: tuple[NatsServer, Path],
    keys: Keys,
    demo_cluster_bundle: Path,
    gateway_bundle: Path,
    tmp_path: Path,
) -> None:
    """All 37 scored 2026-07-28 scenarios pass against an entry-only node whose skills are
    on a worker (input-required rounds relayed over the signed envelope)."""
    assert SUITE.exists(), f"the conformance runner is not at {SUITE} (set SKILLD_MCP_CONFORMANCE)"
    nats, bus = bus_nats
    holder = start_node(
        "node-b", demo_cluster_bundle, nats.url, keys.member, tmp_path / "b", http=False, bus=bus
    )
    entry = start_node(
        "node-a",
        gateway_bundle,
        nats.url,
        keys.member,
        tmp_path / "a",
        extra=["--entry-only"],
        bus=bus,
    )
    try:
        entry.seen(r"node node-b joined \(7 skills\)")
        assert entry.url is not None
        done = subprocess.run(
            [str(SUITE), entry.url, "--requirements", "2026-07-28"],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
    finally:
        entry.stop()
        holder.stop()
    summary = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"scenarios: 37 passed, 0 failed", summary), done.stdout[-4000:]
