"""Kits compiled with the policy: tables, grades from compiled grants, errors with file:line."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from skilld.bundle import BuildResult
from skilld.delegate import BUILTINS
from skilld.errors import PolicyError
from skilld.permissions import SkillPermissions
from skilld.policy import compile_policies, grade_of
from support.env import ROOT, cache_dir

SKILLS = {
    "notes": {"kv": {}},
    "echo": {},
    "files": {"fs": [{"path": "/srv/docs/**", "mode": "ro"}]},
}
POLICIES = {
    "notes.yaml": "skill: notes\nkv: {}\nshell:\n  - program: /bin/true\n",
    "echo.yaml": "skill: echo\n",
    "files.yaml": "skill: files\nfs:\n  - path: /srv/docs/**\n    mode: rw\n",
}


def _compile(tmp_path: Path, kits: dict[str, str], skills: Any = SKILLS) -> Any:
    root = tmp_path / "policies"
    (root / "kits").mkdir(parents=True)
    for name, text in POLICIES.items():
        (root / name).write_text(text)
    for name, text in kits.items():
        (root / "kits" / name).write_text(text)
    return compile_policies(root, skills)


def test_grade_comes_from_compiled_grants_not_claims(tmp_path: Path) -> None:
    """files is granted rw but needs ro: its kit is read-only; notes' unneeded shell is dropped."""
    result = _compile(
        tmp_path,
        {
            "docs.yaml": "tools:\n  read: files/read\n",
            "mixed.yaml": "tools:\n  add: notes/add\n  read: files/read\n  echo: echo/echo\n",
            "pure.yaml": "tools:\n  echo: echo/echo\n",
        },
    )
    kits = result.tables.kits
    assert (kits["docs"]["grade"]["w"], kits["docs"]["grade"]["d"]) == (1, 0)
    assert list(kits["docs"]["grade"]["why"]) == ["files: fs ro /srv/docs/**"]
    assert (kits["mixed"]["grade"]["w"], kits["mixed"]["grade"]["d"]) == (3, 1)
    assert (kits["pure"]["grade"]["w"], kits["pure"]["grade"]["d"]) == (0, 0)
    # without declared needs the grants count as they are: rw files and a shell
    raw = _compile(tmp_path / "raw", {"docs.yaml": "tools:\n  read: files/read\n"}, None)
    assert raw.tables.kits["docs"]["grade"]["w"] == 3


def test_grade_levels() -> None:
    """Each grant maps to the documented (w, d)."""
    assert grade_of({}) == (0, 0, [])
    assert grade_of({"http": [{"url": "https://a/", "methods": ["GET"]}]})[:2] == (1, 0)
    assert grade_of({"env": [{"name": "X"}]})[:2] == (1, 0)
    assert grade_of({"shell": [{"program": "git"}]})[:2] == (2, 2)
    assert grade_of({"kv": {"id": "k"}})[:2] == (3, 1)
    assert grade_of({"fs": [{"path": "/d", "mode": "rw"}]})[:2] == (3, 2)
    assert grade_of({"http": [{"url": "https://a/", "methods": ["POST"]}]})[:2] == (3, 3)
    assert grade_of({"tcp": [{"host": "db"}]})[:2] == (3, 3)


def test_grade_covers_what_tools_may_invoke(tmp_path: Path) -> None:
    """A kit over echo alone is graded with whatever echo may itself invoke."""
    skills = {**SKILLS, "echo": {"invoke": {"calls": ["notes"]}}}
    root = tmp_path / "policies"
    (root / "kits").mkdir(parents=True)
    for name, text in POLICIES.items():
        (root / name).write_text(text)
    (root / "echo.yaml").write_text("skill: echo\ninvoke:\n  calls: [notes]\n")
    (root / "notes.yaml").write_text("skill: notes\nkv: {}\ninvoke:\n  called_by: [echo]\n")
    (root / "kits" / "pure.yaml").write_text("tools:\n  echo: echo/echo\n")
    grade = compile_policies(root, skills).tables.kits["pure"]["grade"]
    assert (grade["w"], grade["d"]) == (3, 1) and list(grade["skills"]) == ["echo", "notes"]


def test_runner_entry_may_invoke_exactly_the_kit_skills(tmp_path: Path) -> None:
    """kit.<name> may call the kit's skills (they consent), nothing else; no other grant."""
    tables = _compile(tmp_path, {"docs.yaml": "tools:\n  read: files/read\n"}).tables
    runner = tables.skill("kit.docs")
    assert list(runner["invoke"]["calls"]) == ["files"]
    assert not any(runner[s] for s in ("fs", "http", "tcp", "shell", "env", "transfer", "kv"))
    assert tables.interfaces("kit.docs") == {"log", "mcp", "invoke"}
    assert "kit.docs" in tables.skill("files")["invoke"]["called_by"]
    assert tables.interfaces("files") == {"log", "mcp", "fs"}  # consent adds no import
    checker = SkillPermissions.from_tables(tables, "kit.docs")
    assert checker.check_invoke("files", 1).allowed
    assert not checker.check_invoke("notes", 1).allowed
    assert list(tables.skill("pyrunner")["mcp"]["hidden"]) == ["run_program"]


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("tools:\n  read: nosuch/read\n", 2, "names unknown skill 'nosuch'"),
        ("tools:\n  read: files\n", 2, "must name skill/method"),
        ("tools:\n  Read: files/read\n", 2, "not a valid function name"),
        ("tools: {}\n", 1, "at least one tool"),
        ("tool:\n  read: files/read\n", 1, "unknown key 'tool'"),
        (
            "tools:\n  read: files/read\ntemplates:\n  - id: t\n    pattern: '(unclosed'\n"
            "    program: result = read('x')\n",
            5,
            "bad pattern",
        ),
        (
            "tools:\n  read: files/read\ntemplates:\n  - id: t\n    pattern: 'x (?P<read>.+)'\n"
            "    program: result = read(read)\n",
            4,
            "has the name of a kit tool",
        ),
        ("tools:\n  read: files/read\nlimits:\n  tool_calls: 0\n", 4, "limits.tool_calls"),
        ("kit: other\ntools:\n  read: files/read\n", 1, "does not match"),
        (
            "tools:\n  read: files/read\nrules:\n  - id: r\n    keywords: [two words]\n"
            "    program: result = read('x')\n",
            5,
            "must be one word",
        ),
    ],
)
def test_kit_errors_name_file_and_line(tmp_path: Path, text: str, line: int, message: str) -> None:
    """A malformed kit is refused at compile time with its file and line."""
    with pytest.raises(PolicyError, match=message) as info:
        _compile(tmp_path, {"docs.yaml": text})
    # named as the user gave the directory
    assert info.value.location == f"{tmp_path}/policies/kits/docs.yaml:{line}"


def test_demo_bundle_locks_the_kits_and_the_runner(demo_bundle: BuildResult) -> None:
    """The demo bundle holds the runner component and tables with the kits, under the lock."""
    lock = demo_bundle.lock
    assert "pyrunner" in {s.id for s in lock.skills}
    tables = json.loads((demo_bundle.out / "policy" / "tables.json").read_text())
    assert set(tables["kits"]) == {"notes", "text"}
    assert tables["kits"]["notes"]["templates"][0]["params"] == ["body", "title"]
    assert "policy/tables.json" in lock.files


def test_kit_method_unknown_fails_the_build(tmp_path: Path, sandbox: Any) -> None:
    """A kit naming a method its skill does not describe stops the build at the kit's line."""
    import shutil

    from skilld.bundle import build_bundle

    skills = tmp_path / "skills"
    shutil.copytree(ROOT / "skills" / "echo", skills / "echo")
    policies = tmp_path / "policies"
    (policies / "kits").mkdir(parents=True)
    (policies / "echo.yaml").write_text("skill: echo\n")
    (policies / "kits" / "k.yaml").write_text("tools:\n  shout: echo/shout\n")
    with pytest.raises(PolicyError, match="method 'shout'") as info:
        build_bundle(skills, policies, tmp_path / "b", sandbox=sandbox, cache_dir=cache_dir())
    assert info.value.location == "policies/kits/k.yaml:2"


def test_runner_builtins_match_the_validator() -> None:
    """The names the validator lets a program call are the names the runner provides."""
    source = (ROOT / "src" / "skilld" / "sandbox" / "pyrunner" / "skill.py").read_text()
    tree = ast.parse(source)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.DictComp) and isinstance(node.generators[0].iter, ast.Tuple):
            found = {e.value for e in node.generators[0].iter.elts if isinstance(e, ast.Constant)}
    assert found | {"print"} == set(BUILTINS)


def _skilld(*args: str, state: Path) -> subprocess.CompletedProcess[str]:
    env = {"SKILLD_CACHE": str(cache_dir()), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "skilld", *args, "--state-dir", str(state)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        timeout=300,
    )


def test_cli_delegate_and_validate(demo_bundle: BuildResult, tmp_path: Path) -> None:
    """skilld delegate runs an intent (exit 0, JSON with trace); validate exits 1 when refused."""
    bundle = ["--bundle", str(demo_bundle.out)]
    run = _skilld("delegate", "shout", "hello", "world", "--kit", "text", *bundle, state=tmp_path)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["output"] == "HELLO WORLD" and out["trace"][0]["tool"] == "echo"
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\nwhile x:\n    pass\n")
    refused = _skilld("delegate", "validate", str(bad), "--kit", "text", *bundle, state=tmp_path)
    assert refused.returncode == 1
    problems = json.loads(refused.stdout)["problems"]
    assert problems[0]["line"] == 2 and problems[0]["rule"] == "delegate.while"
    good = tmp_path / "good.py"
    good.write_text("result = echo(word)\n")
    ok = _skilld("delegate", "validate", str(good), "--kit", "text", *bundle, state=tmp_path)
    assert ok.returncode == 0 and json.loads(ok.stdout)["valid"] is True
    param = _skilld(
        "delegate", "echo", "--kit", "text", "--param", "text=hi", *bundle, state=tmp_path
    )
    assert param.returncode == 0, param.stderr
    assert json.loads(param.stdout)["output"] == "hi"
    unknown = _skilld("delegate", "x", "--kit", "nope", *bundle, state=tmp_path)
    assert unknown.returncode == 1 and "no kit named 'nope'" in unknown.stderr


def test_cli_delegate_run_is_run_program(demo_bundle: BuildResult, tmp_path: Path) -> None:
    """delegate run FILE --args JSON is run_program from the shell; a refused program exits 1."""
    bundle = ["--bundle", str(demo_bundle.out)]
    program = tmp_path / "shout.py"
    program.write_text("result = [echo(word), echo(other)]\n")
    args = ["--args", '{"word": "hi", "other": "there"}']
    ran = _skilld("delegate", "run", str(program), "--kit", "text", *args, *bundle, state=tmp_path)
    assert ran.returncode == 0, ran.stderr
    out = json.loads(ran.stdout)
    assert out["output"] == ["hi", "there"] and [t["tool"] for t in out["trace"]] == ["echo"] * 2
    shadow = ["--args", '{"len": 5}']
    refused = _skilld(
        "delegate", "run", str(program), "--kit", "text", *shadow, *bundle, state=tmp_path
    )
    assert (
        refused.returncode == 1 and json.loads(refused.stdout)["error"]["code"] == "invalid-program"
    )
    bad = _skilld(
        "delegate", "run", str(program), "--kit", "text", "--args", "[1]", *bundle, state=tmp_path
    )
    assert bad.returncode == 2 and "--args must be a JSON object" in bad.stderr


def test_refused_template_program_stops_the_node(tmp_path: Path, sandbox: Any) -> None:
    """A kit whose template holds a refused program is refused when a node loads it, at its line."""
    import shutil

    from skilld.bundle import build_bundle
    from skilld.errors import DelegateError
    from skilld.node import Node, NodeConfig

    skills = tmp_path / "skills"
    shutil.copytree(ROOT / "skills" / "echo", skills / "echo")
    policies = tmp_path / "policies"
    (policies / "kits").mkdir(parents=True)
    (policies / "echo.yaml").write_text("skill: echo\n")
    (policies / "kits" / "k.yaml").write_text(
        "tools:\n  echo: echo/echo\ntemplates:\n  - id: bad\n    pattern: 'x (?P<t>.+)'\n"
        "    program: |\n      import os\n"
    )
    bundle = tmp_path / "b"
    build_bundle(skills, policies, bundle, sandbox=sandbox, cache_dir=cache_dir())
    with pytest.raises(DelegateError, match=r"entry 'bad'.*imports are not allowed") as info:
        Node.open(NodeConfig(bundle=bundle, state_dir=tmp_path / "state"))
    assert info.value.location == "policies/kits/k.yaml:4"
