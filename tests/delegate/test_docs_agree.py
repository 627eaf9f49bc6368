"""docs/delegate.md and the demo kits say what the code computes: grades and the stack limit."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from skilld.errors import StackExhausted
from skilld.policy import compile_policies
from skilld.sandbox import _engine

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "delegate.md").read_text()


def _demo_grades() -> dict[str, tuple[int, int]]:
    needs = {}
    for skill_yaml in (ROOT / "skills").glob("*/skill.yaml"):
        doc = yaml.safe_load(skill_yaml.read_text())
        needs[doc["id"]] = doc.get("needs") or {}
    kits = compile_policies(ROOT / "policies", needs).tables.kits
    return {name: (kit["grade"]["w"], kit["grade"]["d"]) for name, kit in kits.items()}


def test_the_demo_kits_grades_in_the_docs_are_the_compiled_ones() -> None:
    """The grades docs/delegate.md and each kit file's comment give are what the build computes."""
    grades = _demo_grades()
    claimed = {
        name: (int(w), int(d))
        for name, w, d in re.findall(r"`(\w+)`(?: kit)? is Grade\((\d), (\d)\)", DOC)
    }
    assert claimed and claimed == {name: grades[name] for name in claimed}
    for kit_file in (ROOT / "policies" / "kits").glob("*.yaml"):
        name = yaml.safe_load(kit_file.read_text())["kit"]
        for w, d in re.findall(r"^#.*Grade\((\d), (\d)\)", kit_file.read_text(), re.MULTILINE):
            assert (int(w), int(d)) == grades[name], f"{kit_file.name} claims Grade({w}, {d})"


def test_the_stack_limit_in_the_docs_is_the_engines() -> None:
    """The docs' stack row names the engine's default wasm stack and the code delegate reports."""
    row = next(line for line in DOC.splitlines() if line.startswith("| stack"))
    assert (
        "wasmtime's default of 512 KiB" in row and "max_wasm_stack=default" in _engine._CONFIG_TAG
    )
    assert row.rstrip(" |").endswith(f"`{StackExhausted.outcome}`")
