"""Paths, caches and environment shared by the tests and the processes they start.

A plain module (not conftest.py): several test directories have a conftest of their
own, so ``from conftest import ...`` would be ambiguous.

The build cache lives outside the checkout: ``$SKILLD_CACHE`` when set (CI sets it),
else the user's (``~/.cache/skilld``), as for ``skilld`` itself (``skilld.paths``).
"""

from __future__ import annotations

from pathlib import Path

from skilld import paths

ROOT = Path(__file__).resolve().parents[2]
SKILLS = {
    "echo": ROOT / "skills" / "echo",
    "echo-wat": ROOT / "skills" / "echo-wat",
    "notes": ROOT / "skills" / "notes",
    "hostile": ROOT / "tests" / "skills" / "hostile",
    "prober": ROOT / "tests" / "skills" / "prober",
    "conformance": ROOT / "tests" / "skills" / "conformance",
}


def cache_dir() -> Path:
    """The build and native-code cache shared by every test (and CI run)."""
    path = paths.cache_dir()
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def cache_env() -> dict[str, str]:
    """SKILLD_CACHE pointing at this run's build and native-code cache."""
    return {"SKILLD_CACHE": str(cache_dir())}
