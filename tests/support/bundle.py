"""Helpers for bundle tests: the demo bundle built from the repository's skills/ and policies/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from skilld.bundle import BuildResult, build_bundle
from skilld.sandbox import Sandbox
from support.env import ROOT, cache_dir


def build(sandbox: Sandbox, out: Path, **kw: Any) -> BuildResult:
    """Build the repository's demo bundle into ``out``."""
    return build_bundle(
        ROOT / "skills", ROOT / "policies", out, sandbox=sandbox, cache_dir=cache_dir(), **kw
    )
