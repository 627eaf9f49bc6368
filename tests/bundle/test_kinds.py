"""The kinds of skill at build time: each step a loop over them, none depending on their order."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from skilld.bundle import _build, build_bundle
from skilld.bundle._kinds import KINDS
from skilld.policy import RUNNER
from skilld.sandbox import Sandbox
from support.env import ROOT, cache_dir

FIXTURES = ROOT / "tests" / "agentskills" / "fixtures"


def test_the_order_of_the_kinds_changes_nothing(
    sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Built with the kinds in reverse, a bundle holding kits, components and a wasm-executor
    Agent Skill has the same digest, and its one runner is still the kits' component."""
    shutil.copytree(ROOT / "skills", tmp_path / "skills")
    shutil.copytree(ROOT / "policies", tmp_path / "policies")
    shutil.copytree(FIXTURES / "skills" / "csv-summary", tmp_path / "skills" / "csv-summary")
    shutil.copy(FIXTURES / "policies" / "csv-summary.yaml", tmp_path / "policies")
    results = []
    for kinds in (KINDS, KINDS[::-1]):
        monkeypatch.setattr(_build, "KINDS", kinds)
        out = tmp_path / f"bundle-{len(results)}"
        results.append(
            build_bundle(
                tmp_path / "skills",
                tmp_path / "policies",
                out,
                sandbox=sandbox,
                cache_dir=cache_dir(),
            )
        )
    first, reversed_ = (r.lock for r in results)
    runner_skill = next(s for s in reversed_.skills if s.id == RUNNER)
    assert reversed_.runner is not None and reversed_.runner.native == runner_skill.native
    assert [a.id for a in reversed_.agent_skills] == ["csv-summary"]
    assert reversed_.bundle_digest == first.bundle_digest
    assert reversed_.runner == first.runner
    assert [(s.id, s.native_sha256) for s in reversed_.skills] == [
        (s.id, s.native_sha256) for s in first.skills
    ]
