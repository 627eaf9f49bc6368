"""Manifest ``kind``: wasm components (absent) and Agent Skills (``agent-skill``)."""

from __future__ import annotations

import pytest

from skilld.errors import PackageFormatError
from skilld.package import (
    KIND_AGENT_SKILL,
    SigningKey,
    SkillMeta,
    build_package,
    read_package,
)
from skilld.package._manifest import manifest_from_json

META = SkillMeta(id="demo", name="demo", version="1.0.0", description="d")
SHA = "0" * 64


def doc(**extra: object) -> dict[str, object]:
    """A manifest document listing ``files`` (name -> size 1)."""
    files = extra.pop("files", ["component.wasm"])
    assert isinstance(files, list)
    return {
        "format": "skilld-skill/1",
        "id": "demo",
        "name": "demo",
        "version": "1.0.0",
        "description": "d",
        "abi": "0.1.0",
        "needs": {},
        "files": {n: {"sha256": SHA, "size": 1} for n in files},
        **extra,
    }


def test_an_agent_skill_package_has_no_component_and_reads_back() -> None:
    """A package without a component is an Agent Skill; its manifest says so."""
    data = build_package(META, None, files={"SKILL.md": b"---\n"}, keys=[SigningKey.generate()])
    contents = read_package(data)
    assert contents.manifest.kind == KIND_AGENT_SKILL
    assert "component.wasm" not in contents.files


def test_a_component_package_keeps_its_manifest_bytes() -> None:
    """A wasm component's manifest has no kind key (its bytes are as before)."""
    data = build_package(META, b"\0asm", keys=[SigningKey.generate()])
    assert b'"kind"' not in read_package(data).manifest_bytes


@pytest.mark.parametrize(
    ("manifest", "words"),
    [
        (doc(kind="component"), "kind must be absent"),
        (doc(kind="agent"), "kind must be absent"),
        (doc(kind=KIND_AGENT_SKILL), "lists SKILL.md and no component.wasm"),
        (doc(kind=KIND_AGENT_SKILL, files=["SKILL.md", "component.wasm"]), "no component.wasm"),
        (doc(files=["SKILL.md"]), "does not list component.wasm"),
    ],
)
def test_kind_and_files_must_agree(manifest: dict[str, object], words: str) -> None:
    """One spelling per kind; an Agent Skill holds SKILL.md and no component, a wasm skill
    its component."""
    with pytest.raises(PackageFormatError, match=words):
        manifest_from_json(manifest)
