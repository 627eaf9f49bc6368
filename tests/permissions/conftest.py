"""A checker built from a policy written inline."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from skilld.permissions import SkillPermissions
from skilld.policy import compile_policies

Make = Callable[..., SkillPermissions]


@pytest.fixture
def make(tmp_path: Path) -> Make:
    """``make(yaml_text, skill="s", **other_skills_yaml)`` → the checker for ``skill``."""
    counter = iter(range(1_000_000))

    def build(text: str, skill: str = "s", **others: str) -> SkillPermissions:
        root = tmp_path / f"p{next(counter)}"
        root.mkdir()
        (root / f"{skill}.yaml").write_text(text)
        for name, other in others.items():
            (root / f"{name}.yaml").write_text(other)
        return SkillPermissions.from_tables(compile_policies(root).tables, skill)

    return build
