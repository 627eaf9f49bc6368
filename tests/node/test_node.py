"""skilld.node: one node assembled from a real bundle, used and closed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skilld.bundle import BuildResult
from skilld.errors import SandboxError, StateError, UsageError
from skilld.node import Node, NodeConfig
from skilld.registry import NullChannel


def test_opens_the_demo_bundle_and_calls_a_tool(demo_bundle: BuildResult, tmp_path: Path) -> None:
    """A node opened from a bundle serves its tools and audits each call to the state dir."""
    bundle = demo_bundle.out
    with Node.open(NodeConfig(bundle=bundle, state_dir=tmp_path / "state")) as node:
        assert node.registry.ready()
        assert "echo/echo" in {t.name for t in node.registry.tools()}
        out = node.registry.call("echo/echo", {"text": "hi"}, NullChannel())
        assert out.value == "hi"
        assert {"describe", "register"} <= node.timings.keys()
    records = (tmp_path / "state" / "audit.jsonl").read_text().splitlines()
    assert [json.loads(r)["skill"] for r in records] == ["echo"]
    assert (tmp_path / "state" / "state.sqlite3").exists()


def test_close_is_idempotent_and_final(demo_bundle: BuildResult, tmp_path: Path) -> None:
    """Closing a node twice is harmless, and what it closed refuses use afterwards."""
    bundle = demo_bundle.out
    node = Node.open(NodeConfig(bundle=bundle, state_dir=tmp_path, audit_log=tmp_path / "a.jsonl"))
    node.close()
    node.close()
    # Closed means closed: no silent reopen of the database, no new component.
    with pytest.raises(StateError, match="closed"):
        node.state.store("notes").get("k")
    with pytest.raises(SandboxError, match="closed"):
        node.sandbox.load(b"", name="late")


def test_a_directory_without_a_lock_is_refused(tmp_path: Path) -> None:
    """Opening something that is not a bundle says so and what to do, and leaves nothing open."""
    with pytest.raises(UsageError, match=r"not a bundle \(no bundle.lock\)") as info:
        Node.open(NodeConfig(bundle=tmp_path, state_dir=tmp_path / "state"))
    assert "skilld build" in (info.value.hint or "")


def test_a_node_on_its_own_wires_serving_to_nothing_and_a_closed_one_refuses(
    demo_bundle: BuildResult, tmp_path: Path
) -> None:
    """A node outside a cluster serves with no round peers and no task board (tasks in
    memory); a closed node wires nothing."""
    node = Node.open(NodeConfig(bundle=demo_bundle.out, state_dir=tmp_path / "state"))
    with node:
        wiring = node.serving(600.0)
        assert (wiring.round_peers, wiring.task_board) == (None, None)
    with pytest.raises(UsageError, match="closed"):
        node.serving(600.0)
