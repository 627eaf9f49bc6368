"""Many Agent Skills: one activation tool whose name is an enum, as the client guide shows."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_build import build, skill_md, tree

from skilld.agentskills import ACTIVATION_THRESHOLD
from skilld.errors import SkilldError
from skilld.node import Node, NodeConfig
from skilld.registry import NullChannel
from skilld.sandbox import Sandbox


def _names(n: int) -> list[str]:
    return [f"skill-{chr(ord('a') + i)}" for i in range(n)]


def test_many_skills_share_one_activation_tool(tmp_path: Path, sandbox: Sandbox) -> None:
    """Past the threshold, one activate_skill tool (a name enum, the catalog in its
    description) replaces a tool per skill and answers each skill's body once, wrapped."""
    names = _names(ACTIVATION_THRESHOLD + 1)
    root = tree(tmp_path, {n: {"SKILL.md": skill_md(n) + f"Body of {n}.\n"} for n in names}, {})
    result = build(root, sandbox)
    with Node.open(NodeConfig(bundle=result.out, state_dir=tmp_path / "state")) as node:
        tools = {t.name: t for t in node.registry.tools()}
        assert set(tools) == {"activate_skill"}
        tool = tools["activate_skill"]
        assert tool.input_schema["properties"]["name"]["enum"] == names
        assert all(f"- {n}: Test skill {n}." in (tool.description or "") for n in names)
        out = node.registry.call("activate_skill", {"name": "skill-c"}, NullChannel())
        [block] = out.content
        assert block.text is not None
        assert block.text.startswith('<skill_content name="skill-c">')
        assert block.text.count("Body of skill-c.") == 1
        with pytest.raises(SkilldError):
            node.registry.call("activate_skill", {"name": "../skill-c"}, NullChannel())
        uris = {r.uri for r in node.registry.resources()}
        assert {f"skill://{n}/SKILL.md" for n in names} <= uris


def test_a_few_skills_keep_a_tool_each(tmp_path: Path, sandbox: Sandbox) -> None:
    """At or under the threshold each skill stays its own tool (tier 1 is the tool list)."""
    names = _names(2)
    root = tree(tmp_path, {n: {"SKILL.md": skill_md(n)} for n in names}, {})
    result = build(root, sandbox)
    with Node.open(NodeConfig(bundle=result.out, state_dir=tmp_path / "state")) as node:
        assert {t.name for t in node.registry.tools()} == set(names)
