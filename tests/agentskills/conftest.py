"""Agent Skills fixtures: the sample skills built once per run into a real bundle."""

from __future__ import annotations

import shutil

import pytest

from skilld.bundle import BuildResult, build_bundle
from skilld.sandbox import Sandbox
from support.agentskills import FIXTURES, wheelhouse
from support.env import cache_dir


@pytest.fixture(scope="session")
def agent_bundle(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    """The fixture skills and policies built into one bundle (runner and pypdf baked in)."""
    root = tmp_path_factory.mktemp("agentskills")
    shutil.copytree(FIXTURES / "skills", root / "skills")
    shutil.copytree(FIXTURES / "policies", root / "policies")
    return build_bundle(
        root / "skills",
        root / "policies",
        root / "bundle",
        sandbox=sandbox,
        cache_dir=cache_dir(),
        wheelhouse=wheelhouse(),
    )
