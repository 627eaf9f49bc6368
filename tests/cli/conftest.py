"""Fixtures shared by the tests that run `skilld serve` as a real process."""

from __future__ import annotations

from pathlib import Path

import pytest

from skilld.sandbox import Sandbox
from support.serve_process import build_ops_bundle


@pytest.fixture(scope="session")
def ops_bundle(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The operations bundle (echo, conformance, hostile), built once for the session."""
    return build_ops_bundle(sandbox, tmp_path_factory.mktemp("ops"))
