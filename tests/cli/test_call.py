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
    from support.env import cache_env

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
    new = ["skill", "new", "broken", "--dir", str(tmp_path), "--policies", str(tmp_path / "p")]
    assert main(new) == 0
    src = tmp_path / "broken" / "skill.py"
    src.write_text(src.read_text() + "\nraise RuntimeError('boom at import')\n")
    from support.env import cache_env

    proc = skilld(
        "skill", "build", str(tmp_path / "broken"), "-o", str(tmp_path / "b.wasm"), env=cache_env()
    )
    assert proc.returncode == 1
    assert "RuntimeError: boom at import" in proc.stderr
    assert "Traceback" in proc.stderr


def test_skill_new_refuses_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """skill new scaffolds once and then refuses to overwrite."""
    policies = ["--policies", str(tmp_path / "policies")]
    assert main(["skill", "new", "fresh", "--dir", str(tmp_path), *policies]) == 0
    assert (tmp_path / "fresh" / "skill.yaml").is_file()
    assert main(["skill", "new", "fresh", "--dir", str(tmp_path), *policies]) == 2
    assert "already exists" in capsys.readouterr().err


def test_skill_new_writes_the_policy_its_needs_want(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """skill new writes a policy granting the template's needs: a strict compile finds nothing."""
    skills, policies = tmp_path / "skills", tmp_path / "policies"
    assert main(["skill", "new", "fresh", "--dir", str(skills), "--policies", str(policies)]) == 0
    out = capsys.readouterr().out
    assert f"created {policies}/fresh.yaml" in out and "skilld serve --bundle bundle" in out
    tables = tmp_path / "tables.json"
    compile_args = ["policy", "compile", str(policies), "--skills", str(skills), "--strict"]
    assert main([*compile_args, "-o", str(tables)]) == 0, capsys.readouterr().err
    assert "needs" not in capsys.readouterr().err
    assert main(["policy", "explain", "fresh", "kv.get", "count", "--tables", str(tables)]) == 0


def test_claimed_id_does_not_reach_that_skills_keys(
    tmp_path: Path,
    component_path: Callable[[str], Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A component describing itself as 'notes' gets a namespace derived from its bytes, not
    notes' keys; only --skill-id notes reaches them."""
    from skilld.cli._call import default_skill_id
    from skilld.state import SqliteState
    from support.env import cache_env

    monkeypatch.setenv("SKILLD_CACHE", cache_env()["SKILLD_CACHE"])
    wasm = component_path("notes")
    state_dir = tmp_path / "state"
    db = SqliteState(state_dir / "state.sqlite3")
    secret = {"title": "secret", "body": "the real notes skill's"}
    db.store("notes").set("note:secret", json.dumps(secret).encode())
    db.close()

    def call(method: str, arguments: str, *extra: str) -> int:
        return main(["call", str(wasm), method, arguments, "--state-dir", str(state_dir), *extra])

    assert call("get", '{"title":"secret"}') == 1
    err = capsys.readouterr().err
    # Named as it describes itself, though its keys are its bytes' namespace.
    assert "[not-found]" in err and "notes" in err and "wasm-" not in err
    assert call("add", '{"title":"mine","body":"x"}') == 0
    capsys.readouterr()
    assert call("get", '{"title":"secret"}', "--skill-id", "notes") == 0
    assert json.loads(capsys.readouterr().out) == secret

    db = SqliteState(state_dir / "state.sqlite3")
    assert db.store("notes").keys("", 10) == ["note:secret"]
    assert db.store(default_skill_id(wasm.read_bytes())).keys("", 10) == ["note:mine"]
    db.close()


def test_describe_needs_no_method(
    component_path: Callable[[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """--describe alone prints the methods; no method and no --describe is a usage error."""
    wasm = str(component_path("echo"))
    assert main(["call", wasm, "--describe"]) == 0
    described = json.loads(capsys.readouterr().out)
    assert "echo" in {m["name"] for m in described["methods"]}
    assert main(["call", wasm]) == 2
    assert "--describe" in capsys.readouterr().err
    assert main(["call", wasm, "echo", "--describe"]) == 2


def test_call_state_defaults_apart_from_served_bundles(
    component_path: Callable[[str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --state-dir, call keeps its notes under XDG_STATE_HOME/skilld/call, nowhere else."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    wasm = str(component_path("notes"))
    assert main(["call", wasm, "add", '{"title":"t","body":"b"}']) == 0
    assert [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.sqlite3")] == [
        "skilld/call/state.sqlite3"
    ]
