"""Helpers for bundle tests: the demo bundle built from the repository's skills/ and policies/."""

from __future__ import annotations

from pathlib import Path

from skilld.bundle import BuildResult, build_bundle
from skilld.sandbox import Sandbox
from tests_env import ROOT, cache_dir


def build(sandbox: Sandbox, out: Path, **kw: object) -> BuildResult:
    """Build the repository's demo bundle into ``out``."""
    return build_bundle(
        ROOT / "skills", ROOT / "policies", out, sandbox=sandbox, cache_dir=cache_dir(), **kw
    )  # type: ignore[arg-type]
