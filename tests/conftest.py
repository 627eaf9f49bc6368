"""Shared fixtures: real components built once per run (cached by digest), one sandbox."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from skilld.package.build import build_component
from skilld.sandbox import Sandbox
from tests_env import SKILLS, cache_dir


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
