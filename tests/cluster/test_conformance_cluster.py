"""The official MCP conformance suite through an entry node that holds no skill itself."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from support.cluster import Keys, NatsServer, start_node
from support.env import ROOT

# Where tests/cli/test_conformance_serve.py looks for the runner too.
SUITE = Path(os.environ.get("SKILLD_MCP_CONFORMANCE") or ROOT / "tools" / "mcp-conformance")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("requirements", "scenarios", "tasks"), [("2025-11-25", 30, 0), ("2026-07-28", 37, 10)]
)
def test_entry_node_passes_every_scored_scenario(
    requirements: str,
    scenarios: int,
    tasks: int,
    bus_nats: tuple[NatsServer, Path],
    keys: Keys,
    demo_cluster_bundle: Path,
    gateway_bundle: Path,
    tmp_path: Path,
) -> None:
    """Every scored scenario of each revision passes against node-a, entry-only, with the
    conformance skill on node-b, a worker carrying the whole demo bundle (delegate's kits
    kit.notes and kit.text too); input-required rounds are relayed in the signed envelope,
    and the tasks extension (not scored) passes whole: its tools are tasks by the worker's
    policy (``mcp.tasks``), announced to the entry node, which runs them as remote calls and
    keeps their records in JetStream KV."""
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
        extra=["--entry-only", "--cluster-kv"],  # task records in JetStream KV
        bus=bus,
    )
    try:
        # echo, echo-wat, notes, conformance, kit.notes, kit.text and their pyrunner
        entry.seen(r"node node-b joined \(7 skills\)")
        assert entry.url is not None
        done = subprocess.run(
            [str(SUITE), entry.url, "--requirements", requirements],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
    finally:
        entry.stop()
        holder.stop()
    summary = done.stdout.strip().splitlines()[-1]
    assert summary == f"scenarios: {scenarios} passed, 0 failed", done.stdout[-4000:]
    passed = set(re.findall(r"^\s*✓ (tasks-[\w-]+)", done.stdout, re.MULTILINE))
    failed = set(re.findall(r"^\s*✗ (tasks-[\w-]+)", done.stdout, re.MULTILINE))
    assert (len(passed), failed) == (tasks, set()), done.stdout[-4000:]
