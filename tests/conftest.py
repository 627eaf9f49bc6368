"""Shared fixtures: real components built once per run (cached by digest), one sandbox."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from skilld.package.build import build_component
from skilld.sandbox import Sandbox

ROOT = Path(__file__).resolve().parent.parent
SKILLS = {
    "echo": ROOT / "skills" / "echo",
    "notes": ROOT / "skills" / "notes",
    "hostile": ROOT / "tests" / "skills" / "hostile",
    "prober": ROOT / "tests" / "skills" / "prober",
}


def cache_dir() -> Path:
    """The build and native-code cache shared by every test (and CI run)."""
    path = Path(os.environ.get("SKILLD_CACHE") or ROOT / ".cache" / "skilld")
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def pytest_collection_finish(session: pytest.Session) -> None:
    """Make "no tests collected" an error, never a silent green run."""
    if not session.items and not session.config.option.collectonly:
        raise pytest.UsageError("no tests were collected: check the paths and -k/-m filters")


@pytest.fixture(scope="session")
def component_path() -> object:
    """Build a test skill (cached by source digest) and return its .wasm path."""
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            built[name] = build_component(SKILLS[name], cache_dir=cache_dir())
        return built[name]

    return get


@pytest.fixture(scope="session")
def sandbox() -> Iterator[Sandbox]:
    """One sandbox (engine, linker, native cache) for the whole run."""
    with Sandbox(cache_dir()) as sb:
        yield sb


@pytest.fixture(scope="session")
def demo_bundle(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> object:
    """The demo bundle built once per run from skills/ and policies/ (read-only)."""
    from tests_bundle_util import build

    return build(sandbox, tmp_path_factory.mktemp("demo") / "bundle")
