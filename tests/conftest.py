"""Shared fixtures: real components built once per run (cached by digest), one sandbox."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from skilld.bundle import BuildResult
from skilld.package.build import build_component
from skilld.sandbox import Sandbox
from support.env import SKILLS, cache_dir

# No per-example deadline: a property test states a property, never a timing, and a
# loaded machine (CI's two cores running servers beside it) must not turn it red.
settings.register_profile("skilld", deadline=None, print_blob=True)
settings.load_profile("skilld")

_STATE_HOME = pytest.StashKey[str]()
_BASETEMP = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    """Keep every test, and every process a test starts, out of the user's skilld state.

    ``skilld serve`` and ``skilld call`` without ``--state-dir`` write under
    ``$XDG_STATE_HOME/skilld`` (or ``$SKILLD_STATE_DIR``): a test run's notes and audit
    records must never show up in the user's own server.
    """
    os.environ.pop("SKILLD_STATE_DIR", None)
    os.environ["XDG_STATE_HOME"] = config.stash[_STATE_HOME] = tempfile.mkdtemp(
        prefix="skilld-test-state-"
    )
    if config.option.basetemp is None:
        # Not /tmp/pytest-of-USER: every pytest session of that user (other checkouts,
        # other jobs) makes it 0700 again when it starts, and confined commands run as
        # a skill's own uid must search their way to a test's directories.
        config.option.basetemp = config.stash[_BASETEMP] = tempfile.mkdtemp(prefix="skilld-pytest-")


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the run's stand-in for the user's state directory and its temp dirs."""
    if home := config.stash.get(_STATE_HOME, None):
        shutil.rmtree(home, ignore_errors=True)
    if base := config.stash.get(_BASETEMP, None):
        shutil.rmtree(base, ignore_errors=True)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Make "no tests collected" an error, never a silent green run."""
    if not session.items and not session.config.option.collectonly:
        raise pytest.UsageError("no tests were collected: check the paths and -k/-m filters")


# Fixtures that build or load wasm (the first use of each builds it, cached by digest).
# A test that uses none of them, directly or through another fixture, is marked ``pure``:
# ``pytest tests/<area> -m pure`` runs a pure-Python area in seconds, no bundle built.
_BUILDING_FIXTURES = frozenset({"component_path", "sandbox", "demo_bundle"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``pure`` every test whose fixtures build nothing (see _BUILDING_FIXTURES)."""
    for item in items:
        if _BUILDING_FIXTURES.isdisjoint(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.pure)
def _searchable(path: Path, base: Path) -> None:
    """Give others search permission (not listing) on ``path`` and up to ``base``'s parent."""
    for directory in (path, *path.parents):
        info = directory.stat()
        if info.st_uid == os.geteuid() and info.st_mode & 0o111 != 0o111:
            directory.chmod(info.st_mode | 0o111)
        if directory == base.parent:
            break


@pytest.fixture(scope="session", autouse=True)
def _confined_can_traverse_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Let confined commands (an unprivileged uid per skill, never the test's) reach the
    directories tests make: pytest makes them 0700; search permission is given along the
    chain, so Landlock and the files' own modes decide the rest."""
    real = pytest.TempPathFactory.mktemp

    def mktemp(self: pytest.TempPathFactory, basename: str, numbered: bool = True) -> Path:
        path = real(self, basename, numbered)
        _searchable(path, self.getbasetemp())
        return path

    pytest.TempPathFactory.mktemp = mktemp  # type: ignore[method-assign]
    try:
        yield
    finally:
        pytest.TempPathFactory.mktemp = real  # type: ignore[method-assign]


@pytest.fixture(scope="session")
def component_path() -> Callable[[str], Path]:
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
def demo_bundle(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    """The demo bundle built once per run from skills/ and policies/ (read-only)."""
    from support.bundle import build

    return build(sandbox, tmp_path_factory.mktemp("demo") / "bundle")


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP listener on 127.0.0.1 that accepts and closes; yields its port."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()[1]
    srv.close()
