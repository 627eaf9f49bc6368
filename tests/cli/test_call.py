"""``skilld skill build`` and ``skilld call`` as a user runs them, in separate processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from skilld.cli import main

ROOT = Path(__file__).resolve().parents[2]


def skilld(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the skilld command in a new process."""
    return subprocess.run(
        [sys.executable, "-m", "skilld", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=False,
        timeout=300,
    )


def test_build_then_call_persists_state(
    tmp_path: Path, component_path: Callable[[str], Path]
) -> None:
    """A note added in one process is returned by get in the next one."""
    from tests_env import cache_env

    component_path("notes")  # warm the build cache
    out = tmp_path / "notes.wasm"
    env = cache_env()
    built = skilld("skill", "build", str(ROOT / "skills" / "notes"), "-o", str(out), env=env)
    assert built.returncode == 0, built.stderr
    state = str(tmp_path / "state")
    added = skilld(
        "call", str(out), "add", '{"title":"a","body":"b"}', "--state-dir", state, env=env
    )
    assert added.returncode == 0, added.stderr
    got = skilld("call", str(out), "get", '{"title":"a"}', "--state-dir", state, env=env)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout) == {"title": "a", "body": "b"}


def test_call_error_exit_code(
    tmp_path: Path, component_path: Callable[[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A typed guest error prints one line naming the code and exits 1; bad JSON exits 2."""
    wasm = str(component_path("notes"))
    state = str(tmp_path / "s")
    assert main(["call", wasm, "get", '{"title":"none"}', "--state-dir", state]) == 1
    assert "[not-found]" in capsys.readouterr().err
    assert main(["call", wasm, "get", "{not json", "--state-dir", state]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_build_error_shows_traceback(tmp_path: Path) -> None:
    """A skill whose module raises at import fails to build with the Python traceback shown."""
    assert main(["skill", "new", "broken", "--dir", str(tmp_path)]) == 0
    src = tmp_path / "broken" / "skill.py"
    src.write_text(src.read_text() + "\nraise RuntimeError('boom at import')\n")
    from tests_env import cache_env

    proc = skilld(
        "skill", "build", str(tmp_path / "broken"), "-o", str(tmp_path / "b.wasm"), env=cache_env()
    )
    assert proc.returncode == 1
    assert "RuntimeError: boom at import" in proc.stderr
    assert "Traceback" in proc.stderr


def test_skill_new_refuses_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """skill new scaffolds once and then refuses to overwrite."""
    assert main(["skill", "new", "fresh", "--dir", str(tmp_path)]) == 0
    assert (tmp_path / "fresh" / "skill.yaml").is_file()
    assert main(["skill", "new", "fresh", "--dir", str(tmp_path)]) == 2
    assert "already exists" in capsys.readouterr().err
