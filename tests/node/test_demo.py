"""The demo bundle: the demo's skills only, the conformance suite's skill only on request."""

from __future__ import annotations

from pathlib import Path

import pytest

from skilld.errors import UsageError
from skilld.node import Node, NodeConfig, demo_bundle
from support.env import ROOT


def _served(bundle: Path, state: Path) -> tuple[set[str], set[str], set[str]]:
    with Node.open(NodeConfig(bundle=bundle, state_dir=state)) as node:
        reg = node.registry
        return (
            {t.name for t in reg.tools()},
            {r.uri for r in reg.resources()},
            {p.name for p in reg.prompts()},
        )


def test_demo_serves_conformance_tools_only_on_request(tmp_path: Path) -> None:
    """The demo bundle serves no test_* tools, resources or prompts; with_conformance adds them
    from the directory it names."""
    plain, extended = demo_bundle(), demo_bundle(with_conformance=ROOT / "tests")
    assert plain != extended
    tools, resources, prompts = _served(plain, tmp_path / "plain")
    assert "echo/echo" in tools
    assert not [t for t in tools if "test_" in t] and not resources and not prompts
    tools, resources, prompts = _served(extended, tmp_path / "extended")
    assert "test_simple_text" in tools and "echo/echo" in tools
    assert "test://static-text" in resources and "test_simple_prompt" in prompts


def test_with_conformance_reads_only_the_directory_it_is_given(tmp_path: Path) -> None:
    """A directory without the conformance skill is refused by name: the demo looks for it
    nowhere else (not in the checkout's tests/)."""
    with pytest.raises(UsageError, match="no conformance skill") as refused:
        demo_bundle(with_conformance=tmp_path)
    assert refused.value.location == str(tmp_path)
