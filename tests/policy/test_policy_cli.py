"""``skilld policy compile|explain`` run in-process against the sample policies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skilld.cli import main

ROOT = Path(__file__).resolve().parents[2]
POLICIES = str(ROOT / "policies")


@pytest.mark.parametrize(
    ("action", "target", "code", "rule"),
    [
        ("fs.read", "/data/notes/a.txt", 0, "notes.notes-dir"),
        ("fs.write", "/data/notes-evil/a.txt", 1, "default-deny"),
        ("http.get", "https://api.example.com/v1/x", 0, "notes.example-api"),
        ("http.delete", "https://api.example.com/v1/x", 1, "notes.example-api"),
        ("http.get", "http://169.254.169.254/latest/meta-data/", 1, "default-deny"),
        ("shell.run", "/usr/bin/git status --short", 0, "notes.git-status"),
        ("shell.run", "git status; rm -rf /", 1, "notes.shell[1]"),
        ("invoke.call", "echo", 0, "notes.invoke"),
        ("invoke.call", "conformance", 1, "default-deny"),
        ("tcp.connect", "db.internal:5432", 0, "notes.tcp[0]"),
        ("env.read", "NOTES_LANG", 0, "notes.env[0]"),
    ],
)
def test_explain_answers_with_rule_and_reason(
    capsys: pytest.CaptureFixture[str], action: str, target: str, code: int, rule: str
) -> None:
    """explain prints allow/deny, the deciding rule with its source line, and why."""
    assert main(["policy", "explain", "notes", action, target, "--policies", POLICIES]) == code
    out = capsys.readouterr().out
    assert out.startswith("allow:" if code == 0 else "deny:")
    assert f"rule: {rule}" in out
    assert "why:" in out
    if rule.startswith("notes."):
        assert "policies/notes.yaml:" in out


def test_compile_writes_tables_then_explain_reads_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """compile -o writes canonical tables with the skills' needs; explain --tables uses them."""
    out = tmp_path / "tables.json"
    rc = main(["policy", "compile", POLICIES, "--skills", str(ROOT / "skills"), "-o", str(out)])
    assert rc == 0
    captured = capsys.readouterr()
    assert "digest sha256:" in captured.out
    assert "does not need it" in captured.err  # the sample grants more than notes needs
    data = json.loads(out.read_text())
    assert data["skills"]["notes"]["needs_checked"] is True
    assert (
        main(["policy", "explain", "notes", "fs.read", "/data/notes/a", "--tables", str(out)]) == 1
    )
    assert main(["policy", "explain", "notes", "kv.get", "k", "--tables", str(out)]) == 0


def test_compile_error_exits_1_with_location(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A broken policy fails compile with file:line on stderr."""
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "notes.yaml").write_text("kv: {}\nfs:\n  - path: /x\n    raed: 1\n")
    assert main(["policy", "compile", str(tmp_path / "p"), "-o", str(tmp_path / "t")]) == 1
    assert "p/notes.yaml:4: unknown key 'raed'" in capsys.readouterr().err


def test_strict_makes_problems_fatal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--strict turns a need without a grant into a failure."""
    skills = tmp_path / "skills" / "notes"
    skills.mkdir(parents=True)
    (skills / "skill.yaml").write_text("id: notes\nneeds:\n  env: [SECRET]\n")
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "notes.yaml").write_text("kv: {}\n")
    args = ["policy", "compile", str(tmp_path / "p"), "--skills", str(tmp_path / "skills")]
    assert main([*args, "-o", str(tmp_path / "t")]) == 0
    assert "skill.yaml:3: env need SECRET is not granted" in capsys.readouterr().err
    assert main([*args, "--strict", "-o", str(tmp_path / "t")]) == 1


def test_explain_unknown_skill(capsys: pytest.CaptureFixture[str]) -> None:
    """Explaining for a skill without a policy is an error naming the known skills."""
    assert main(["policy", "explain", "nope", "fs.read", "/x", "--policies", POLICIES]) == 1
    assert "no policy for skill 'nope'" in capsys.readouterr().err
