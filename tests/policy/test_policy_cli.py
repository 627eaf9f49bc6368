"""``skilld policy compile|explain`` run in-process against the demo and example policies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skilld.bundle import BuildResult
from skilld.cli import main

ROOT = Path(__file__).resolve().parents[2]
# docs/policy.md's example: a notes policy with every section (and no skills/ beside it,
# so every grant counts).
POLICIES = str(ROOT / "docs" / "examples" / "policies")
DEMO = str(ROOT / "policies")


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
    assert "does not need it" in captured.err  # the example grants more than notes needs
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
    assert (
        "skill.yaml:3: 'notes' needs env SECRET, which its policy has not granted"
        in capsys.readouterr().err
    )
    assert main([*args, "--strict", "-o", str(tmp_path / "t")]) == 1


def test_a_kv_need_without_a_grant_reads_as_a_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A kv need nothing grants is reported in English, naming the skill and what it needs."""
    skills = tmp_path / "skills" / "fresh"
    skills.mkdir(parents=True)
    (skills / "skill.yaml").write_text("id: fresh\nneeds:\n  kv: {}\n")
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "fresh.yaml").write_text("limits:\n  wall_time: 5s\n")
    args = ["policy", "compile", str(tmp_path / "p"), "--skills", str(tmp_path / "skills")]
    assert main([*args, "-o", str(tmp_path / "t")]) == 0
    err = capsys.readouterr().err
    assert "'fresh' needs kv (its key-value namespace), which its policy has not granted" in err
    assert "kv need a key-value namespace" not in err


def test_explain_unknown_skill(capsys: pytest.CaptureFixture[str]) -> None:
    """Explaining for a skill without a policy is a usage error (2, not a denial) naming it."""
    assert main(["policy", "explain", "nope", "fs.read", "/x", "--policies", POLICIES]) == 2
    assert "no policy for skill 'nope'" in capsys.readouterr().err


def test_demo_policies_build_without_warnings(capsys: pytest.CaptureFixture[str]) -> None:
    """The demo policies grant exactly what the demo skills need: no warning, no problem."""
    args = ["policy", "compile", DEMO, "--skills", str(ROOT / "skills"), "--strict"]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "0 warnings, 0 problems" in captured.out or '"skills"' in captured.out


@pytest.mark.parametrize(
    ("action", "target"),
    [
        ("fs.read", "/data/notes/a.txt"),
        ("http.get", "https://api.example.com/v1/x"),
        ("invoke.call", "echo"),
        ("env.read", "NOTES_LANG"),
        ("kv.get", "k"),
    ],
)
def test_explain_agrees_with_the_tables_a_build_keeps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], action: str, target: str
) -> None:
    """With the skills' needs, explain answers as the compiled tables do, dropped grants denied."""
    tables = tmp_path / "tables.json"
    skills = ["--skills", str(ROOT / "skills")]
    assert main(["policy", "compile", POLICIES, *skills, "-o", str(tables)]) == 0
    from_tables = main(["policy", "explain", "notes", action, target, "--tables", str(tables)])
    from_policies = main(
        ["policy", "explain", "notes", action, target, "--policies", POLICIES, *skills]
    )
    assert from_policies == from_tables
    # the notes skill needs only kv: everything else the example grants is left out
    assert from_tables == (0 if action == "kv.get" else 1)


def test_explain_uses_the_skills_beside_the_policies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --skills, the skills/ beside POLICIES supply the needs, as for a build."""
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "s.yaml").write_text("kv: {}\nenv: [HOME]\n")
    (tmp_path / "skills" / "s").mkdir(parents=True)
    (tmp_path / "skills" / "s" / "skill.yaml").write_text("id: s\nneeds:\n  kv: {}\n")
    policies = str(tmp_path / "policies")
    assert main(["policy", "explain", "s", "env.read", "HOME", "--policies", policies]) == 1
    assert "rule: default-deny" in capsys.readouterr().out
    assert main(["policy", "explain", "s", "kv.get", "k", "--policies", policies]) == 0


def test_explain_reads_a_bundles_tables(
    demo_bundle: BuildResult, capsys: pytest.CaptureFixture[str]
) -> None:
    """--bundle answers from the tables a built bundle carries."""
    bundle = str(demo_bundle.out)
    assert main(["policy", "explain", "notes", "kv.set", "k", "--bundle", bundle]) == 0
    assert main(["policy", "explain", "notes", "fs.read", "/etc/passwd", "--bundle", bundle]) == 1


@pytest.mark.parametrize("action", ["fs.rread", "env.get", "http", "kv", "shell.exec"])
def test_explain_mistyped_action_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], action: str
) -> None:
    """A mistyped action exits 2 and lists the valid ones; it is never reported as a deny."""
    assert main(["policy", "explain", "notes", action, "/x", "--policies", POLICIES]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"unknown action '{action}'" in captured.err
    assert "fs.read, fs.write" in captured.err and "env.read" in captured.err


def test_policy_errors_name_the_directory_as_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Errors, and explain's rule sources, name mine/policies/x.yaml, not policies/x.yaml."""
    (tmp_path / "mine" / "policies").mkdir(parents=True)
    (tmp_path / "mine" / "policies" / "x.yaml").write_text(
        "kv: {}\nfs:\n  - path: /x\n    raed: 1\n"
    )
    monkeypatch.chdir(tmp_path)
    assert main(["policy", "compile", "mine/policies", "-o", "t.json"]) == 1
    err = capsys.readouterr().err
    assert "skilld: error: mine/policies/x.yaml:4: unknown key 'raed'" in err
    (tmp_path / "mine" / "policies" / "x.yaml").write_text("kv: {}\nenv: [HOME]\n")
    assert main(["policy", "explain", "x", "env.read", "HOME", "--policies", "mine/policies"]) == 0
    assert "rule: x.env[0] (mine/policies/x.yaml:2)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("caller", "extra", "question", "name", "code", "rule"),
    [
        ("token:ci", [], "tool.call", "notes/add", 0, "callers.notes-writers"),
        ("token:ci", [], "tool.call", "echo/echo", 0, "callers.notes-writers"),
        ("token:stranger", [], "tool.list", "notes/add", 1, "default-deny"),
        (
            "oauth:https://idp.example.com#alice",
            ["--group", "notes-writers"],
            "resource.call",
            "skill://notes/x",
            0,
            "callers.notes-writers",
        ),
        (
            "oauth:https://idp.example.com#mallory",
            ["--group", "notes-writers"],
            "tool.call",
            "notes/add",
            1,
            "callers.no-mallory",
        ),
        ("token:r", ["--scope", "notes:read"], "tool.list", "notes/list", 0, "callers.readers"),
        ("token:r", ["--scope", "notes:read"], "tool.call", "notes/list", 1, "default-deny"),
        ("local", [], "skill.call", "echo", 0, "callers.local-all"),
        ("anonymous", [], "tool.call", "notes/add", 0, "callers.open-anonymous"),
        ("local", ["--skill", "notes"], "prompt.call", "summary", 0, "callers.local-all"),
    ],
)
def test_explain_caller_answers_offline(
    capsys: pytest.CaptureFixture[str],
    caller: str,
    extra: list[str],
    question: str,
    name: str,
    code: int,
    rule: str,
) -> None:
    """explain --caller: who may list and call what, from the policies alone, with the rule."""
    argv = ["policy", "explain", "--caller", caller, *extra, question, name, "--policies", POLICIES]
    assert main(argv) == code
    out = capsys.readouterr().out
    assert out.startswith("allow:" if code == 0 else "deny:")
    assert f"rule: {rule}" in out
    if rule.startswith("callers.") and not rule.startswith("callers.open-"):
        assert "policies/callers/team.yaml:" in out


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--caller", "bob", "tool.call", "notes/add"], "bad caller 'bob'"),
        (["--caller", "local", "tool.cal", "notes/add"], "unknown question 'tool.cal'"),
        (["--caller", "local", "prompt.call", "summary"], "which skill serves prompt"),
        (["--caller", "local", "tool.call", "notes/add", "extra"], "KIND.ACTION NAME"),
        (["notes", "kv.get"], "explain needs SKILL ACTION TARGET"),
    ],
)
def test_explain_caller_usage_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], words: str
) -> None:
    """A question explain --caller cannot ask exits 2 and says what to write."""
    assert main(["policy", "explain", *argv, "--policies", POLICIES]) == 2
    assert words in capsys.readouterr().err


def test_explain_caller_reads_compiled_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """explain --caller --tables answers from compiled tables, naming the rule's source."""
    out = tmp_path / "tables.json"
    assert main(["policy", "compile", POLICIES, "-o", str(out)]) == 0
    capsys.readouterr()
    argv = ["policy", "explain", "--caller", "token:ci", "tool.call", "notes/add"]
    assert main([*argv, "--tables", str(out)]) == 0
    assert "rule: callers.notes-writers (policies/callers/team.yaml:3)" in capsys.readouterr().out
    argv = ["policy", "explain", "--caller", "token:other", "tool.list", "notes/add"]
    assert main([*argv, "--tables", str(out)]) == 1
    assert "rule: default-deny" in capsys.readouterr().out
