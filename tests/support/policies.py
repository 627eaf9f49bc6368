"""Policy directories written from text, compiled and explained, for the policy tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from skilld.cli import main
from skilld.errors import PolicyError
from skilld.policy import Tables, compile_policies


def write_policies(tmp_path: Path, files: dict[str, str]) -> Path:
    """A new directory ``tmp_path/policies`` holding ``files`` (file name to YAML text)."""
    root = tmp_path / "policies"
    root.mkdir()
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def compiled(tmp_path: Path, files: dict[str, str]) -> Tables:
    """The tables ``files`` compile into (see :func:`write_policies`)."""
    return compile_policies(write_policies(tmp_path, files)).tables


def assert_refused_at(tmp_path: Path, text: str, line: int, words: str) -> None:
    """Compiling ``notes.yaml`` holding ``text`` fails with a PolicyError naming
    ``notes.yaml:LINE`` and saying ``words``."""
    with pytest.raises(PolicyError) as info:
        compiled(tmp_path, {"notes.yaml": text})
    assert info.value.location is not None and info.value.location.endswith(f"notes.yaml:{line}")
    assert words in str(info.value)


def explained(root: Path, skill: str, capsys: pytest.CaptureFixture[str]) -> str:
    """What ``skilld policy explain --policies ROOT SKILL env.read X`` prints."""
    main(["policy", "explain", skill, "env.read", "X", "--policies", str(root)])
    return capsys.readouterr().out
