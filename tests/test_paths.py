"""skilld.paths: default locations, apart for each served bundle and for ``skilld call``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from skilld import paths


def test_the_tests_never_see_the_users_state() -> None:
    """conftest points the default state (for this process and its children) at a temporary dir."""
    assert "SKILLD_STATE_DIR" not in os.environ
    home = Path(os.environ["XDG_STATE_HOME"])
    assert home.name.startswith("skilld-test-state-")
    assert paths.state_dir("demo") == home / "skilld" / "demo"


@pytest.mark.parametrize("name", ["demo", "call"])
def test_default_state_is_apart_per_bundle_and_for_call(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without $SKILLD_STATE_DIR each bundle, and `call`, has its own default state."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert paths.state_dir(name) == tmp_path / "skilld" / name
    a = paths.bundle_state_name(tmp_path / "a" / "bundle")
    b = paths.bundle_state_name(tmp_path / "b" / "bundle")
    assert a != b and a.startswith("bundle-") and b.startswith("bundle-")
    assert paths.bundle_state_name(tmp_path / "a" / "bundle") == a  # stable for one place
    monkeypatch.setenv("SKILLD_STATE_DIR", str(tmp_path / "chosen"))
    assert paths.state_dir(name) == tmp_path / "chosen"  # an operator's choice is kept as is
