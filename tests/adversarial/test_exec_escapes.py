"""shell and env tricks, from the real prober under real compiled tables: argv stays data."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from skilld.policy import Tables, compile_policies
from skilld.sandbox import Component
from support.adversarial import Probe, assert_outcome, case_ids, compile_dir, fill

POLICY = """\
shell:
  - id: echo
    program: /bin/echo
    args: ["**"]
  - id: ls
    program: /bin/ls
    args: ["--format=*", "*"]
    cwd: [{R}/work]
  - id: pwd
    program: /bin/pwd
    cwd: [{R}/work]
  - id: sleep
    program: /bin/sleep
    args: ["*"]
    timeout: 300ms
  - id: head
    program: /usr/bin/head
    args: ["-c", "*", /dev/zero]
    output_bytes: 1KiB
  - id: env
    program: /usr/bin/env
    env: [SKILLD_ADV_PASS, SKILLD_ADV_UNSET]
  - id: bare
    program: echo
    args: [bare]
  - id: url
    program: /usr/bin/basename
    args: ["https://api.example.com/v1/*"]
  - id: text
    program: /usr/bin/printf
    args: ["%s|%s", "s/a//g", "application/bin"]
env:
  - SKILLD_ADV_OK
  - SKILLD_FAM_*
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """work/ (the listed cwd) with a subdirectory, siblings beside it and a symlink out."""
    root = Path(os.path.realpath(tmp_path_factory.mktemp("exec")))
    for d in ("work/sub", "work-evil", "outside"):
        (root / d).mkdir(parents=True)
    (root / "work" / "keep.txt").write_text("keep")
    (root / "work" / "link-out").symlink_to(root / "outside")
    return root


@pytest.fixture(scope="module")
def tables(world: Path, tmp_path_factory: pytest.TempPathFactory) -> Tables:
    """The prober's shell and env policy, compiled."""
    text = POLICY.replace("{R}", str(world))
    return compile_dir(tmp_path_factory.mktemp("policies"), {"prober": text})


@pytest.fixture
def probe(prober: Component, tables: Tables, monkeypatch: pytest.MonkeyPatch) -> Probe:
    """The prober under the compiled policy, with host variables it must and must not see."""
    monkeypatch.setenv("SKILLD_ADV_OK", "yes")
    monkeypatch.setenv("SKILLD_ADV_SECRET", "leak")
    monkeypatch.setenv("SKILLD_ADV_PASS", "passed")
    monkeypatch.setenv("SKILLD_FAM_A", "fa")
    monkeypatch.delenv("SKILLD_ADV_UNSET", raising=False)
    return Probe(prober, tables)


DENY = "default-deny"


def ran(expected: tuple[Any, ...]) -> Any:
    """An ``ok`` check: ``("stdout", TEXT)`` exit 0 with exactly TEXT; ``("failed",)``: the
    command was allowed to run and failed on its own."""
    if expected[0] == "stdout":
        return lambda v: v["exit"] == 0 and v["stdout"] == expected[1]
    return lambda v: v["exit"] != 0


# (id, argv, cwd, expected); {R} is the tree's root
SHELL: list[tuple[str, list[str], str | None, tuple[Any, ...]]] = [
    (
        "semicolon",
        ["/bin/echo", "a; rm -rf {R}/work"],
        None,
        ("ok", ("stdout", "a; rm -rf {R}/work\n")),
    ),
    ("and-and", ["/bin/echo", "a && id"], None, ("ok", ("stdout", "a && id\n"))),
    ("dollar-paren", ["/bin/echo", "$(id)"], None, ("ok", ("stdout", "$(id)\n"))),
    ("backticks", ["/bin/echo", "`id`"], None, ("ok", ("stdout", "`id`\n"))),
    (
        "pipe",
        ["/bin/echo", "x | cat /etc/passwd"],
        None,
        ("ok", ("stdout", "x | cat /etc/passwd\n")),
    ),
    ("newline", ["/bin/echo", "a\nid"], None, ("ok", ("stdout", "a\nid\n"))),
    (
        "redirect",
        ["/bin/echo", "x > {R}/work/pwned"],
        None,
        ("ok", ("stdout", "x > {R}/work/pwned\n")),
    ),
    ("glob-not-expanded", ["/bin/echo", "{R}/*"], None, ("ok", ("stdout", "{R}/*\n"))),
    ("variable-not-expanded", ["/bin/echo", "$HOME"], None, ("ok", ("stdout", "$HOME\n"))),
    ("quotes", ["/bin/echo", "'a' \"b\""], None, ("ok", ("stdout", "'a' \"b\"\n"))),
    (
        "flag-pattern-allowed",
        ["/bin/ls", "--format=single-column", "{R}/work"],
        "{R}/work",
        ("ok", ("stdout", "keep.txt\nlink-out\nsub\n")),
    ),
    (
        "flag-injection-is-data",
        ["/bin/ls", "--format=x; rm -rf {R}/work", "{R}/work"],
        "{R}/work",
        ("ok", ("failed",)),
    ),
    ("bare-program", ["echo", "bare"], None, ("ok", ("stdout", "bare\n"))),
    ("default-cwd-is-rules-first", ["/bin/pwd"], None, ("ok", ("stdout", "{R}/work\n"))),
    ("cwd-below-listed", ["/bin/pwd"], "{R}/work/sub", ("ok", ("stdout", "{R}/work/sub\n"))),
    ("cwd-dotdot-inside", ["/bin/pwd"], "{R}/work/sub/../", ("ok", ("stdout", "{R}/work\n"))),
    ("cwd-double-slash", ["/bin/pwd"], "{R}//work//sub", ("ok", ("stdout", "{R}/work/sub\n"))),
    ("sleep-arg-is-data", ["/bin/sleep", "1;id"], None, ("ok", ("failed",))),
    # programs
    (
        "shell-program",
        ["/bin/sh", "-c", "id"],
        None,
        ("deny", DENY, "no shell rule for program '/bin/sh'"),
    ),
    (
        "relative-program",
        ["ls", "--format=x", "{R}/work"],
        "{R}/work",
        ("deny", DENY, "no shell rule for program 'ls'"),
    ),
    (
        "other-path-same-binary",
        ["/usr/bin/ls", "--format=x", "{R}/work"],
        "{R}/work",
        ("deny", DENY, "'/usr/bin/ls'"),
    ),
    (
        "dotdot-program",
        ["/bin/../bin/ls", "--format=x", "{R}/work"],
        "{R}/work",
        ("deny", DENY, "'/bin/../bin/ls'"),
    ),
    ("dot-slash-program", ["./ls", "--format=x", "{R}/work"], "{R}/work", ("deny", DENY, "'./ls'")),
    ("program-with-space", ["/bin/echo x"], None, ("deny", DENY, "no shell rule for program")),
    ("program-case", ["/BIN/ECHO", "x"], None, ("deny", DENY, "no shell rule for program")),
    ("bare-for-absolute-rule", ["pwd"], None, ("deny", DENY, "no shell rule for program 'pwd'")),
    ("absolute-for-bare-rule", ["/bin/echo", "bare"], None, ("ok", ("stdout", "bare\n"))),
    # patterns with a "/" that are not absolute paths are text, never resolved as paths
    (
        "slash-text-args",
        ["/usr/bin/printf", "%s|%s", "s/a//g", "application/bin"],
        None,
        ("ok", ("stdout", "s/a//g|application/bin")),
    ),
    # arguments
    (
        "extra-flag",
        ["/bin/ls", "-la", "{R}/work"],
        "{R}/work",
        ("deny", "prober.ls", "arguments do not match"),
    ),
    (
        "extra-arg",
        ["/bin/ls", "--format=x", "{R}/work", "/etc"],
        "{R}/work",
        ("deny", "prober.ls", "arguments do not match"),
    ),
    (
        "reordered",
        ["/bin/ls", "{R}/work", "--format=x"],
        "{R}/work",
        ("deny", "prober.ls", "arguments do not match"),
    ),
    ("too-few", ["/bin/ls"], "{R}/work", ("deny", "prober.ls", "arguments do not match")),
    (
        "split-flag",
        ["/bin/ls", "--format", "x"],
        "{R}/work",
        ("deny", "prober.ls", "arguments do not match"),
    ),
    ("bare-other-arg", ["echo", "other"], None, ("deny", "prober.bare", "allows ['bare']")),
    ("bare-extra-arg", ["echo", "bare", "x"], None, ("deny", "prober.bare", "allows ['bare']")),
    (
        "no-args-rule-given-args",
        ["/bin/pwd", "-P"],
        None,
        ("deny", "prober.pwd", "arguments do not match"),
    ),
    (
        "env-rule-no-args",
        ["/usr/bin/env", "SKILLD_X=1", "/bin/sh"],
        None,
        ("deny", "prober.env", "arguments do not match"),
    ),
    ("nul-in-arg", ["/bin/echo", "a\u0000b"], None, ("error", "invalid-argument", "NUL")),
    ("empty-program", [""], None, ("error", "invalid-argument", "must name a program")),
    # working directories
    ("cwd-parent", ["/bin/pwd"], "{R}", ("deny", DENY, "no shell rule lists a cwd above")),
    (
        "cwd-prefix-sibling",
        ["/bin/pwd"],
        "{R}/work-evil",
        ("deny", DENY, "no shell rule lists a cwd above"),
    ),
    ("cwd-dotdot-out", ["/bin/pwd"], "{R}/work/../outside", ("deny", DENY, "{R}/outside")),
    ("cwd-symlink-out", ["/bin/pwd"], "{R}/work/link-out", ("deny", DENY, "{R}/outside")),
    ("cwd-case", ["/bin/pwd"], "{R}/WORK", ("deny", DENY, "no shell rule lists a cwd above")),
    (
        "cwd-root",
        ["/bin/ls", "--format=x", "/"],
        "/",
        ("deny", DENY, "no shell rule lists a cwd above /"),
    ),
    (
        "cwd-of-another-rule",
        ["/bin/echo", "x"],
        "{R}/work",
        ("deny", "prober.echo", "allows running in no directory"),
    ),
    ("cwd-relative", ["/bin/pwd"], "work", ("error", "invalid-argument", "must be absolute")),
    (
        "url-arg-is-not-a-local-path",
        ["/usr/bin/basename", "https://api.example.com/v1/x"],
        None,
        ("ok", ("stdout", "x\n")),
    ),
    # a trailing newline is data, never dropped by a '$' anchor
    (
        "literal-arg-trailing-newline",
        ["echo", "bare\n"],
        None,
        ("deny", "prober.bare", "arguments do not match prober.bare (allows ['bare'])"),
    ),
    (
        "program-trailing-newline",
        ["/bin/echo\n", "x"],
        None,
        ("deny", DENY, "no shell rule for program '/bin/echo\\n'"),
    ),
    (
        "flag-literal-part-trailing-newline",
        ["/usr/bin/head", "-c\n", "1", "/dev/zero"],
        None,
        ("deny", "prober.head", "arguments do not match prober.head"),
    ),
    (
        "path-arg-trailing-newline",
        ["/usr/bin/head", "-c", "1", "/dev/zero\n"],
        None,
        ("deny", "prober.head", "arguments do not match prober.head"),
    ),
    (
        "cwd-trailing-newline",
        ["/bin/pwd"],
        "{R}/work\n",
        ("deny", DENY, "no shell rule lists a cwd above {R}/work\n"),
    ),
]


@pytest.mark.parametrize(("name", "argv", "cwd", "expected"), SHELL, ids=case_ids(SHELL))
def test_shell_case(
    probe: Probe,
    world: Path,
    name: str,
    argv: list[str],
    cwd: str | None,
    expected: tuple[Any, ...],
) -> None:
    """Each argv or cwd trick gets exactly the outcome in the table; nothing outside is touched."""
    root = str(world)
    expected = fill(expected, root)
    if expected[0] == "ok":
        expected = ("ok", ran(expected[1]))
    out = probe("shell_run", argv=fill(argv, root), cwd=fill(cwd, root))
    assert_outcome(out, expected)
    assert (world / "work" / "keep.txt").read_text() == "keep"
    assert not (world / "work" / "pwned").exists()
    if expected[0] == "deny":
        assert [d for d in out.decisions if not d.allowed][-1].rule == expected[1]


def test_rule_timeout_wins_over_request(probe: Probe) -> None:
    """The rule's 300 ms timeout applies although the guest asked for 5 s."""
    out = probe("shell_run_timed", argv=["/bin/sleep", "5"], timeout_ms=5000)
    assert_outcome(out, ("error", "timeout", "ran past 300 ms"))


def test_request_timeout_wins_when_smaller(probe: Probe) -> None:
    """A request timeout smaller than the rule's is the one that applies."""
    out = probe("shell_run_timed", argv=["/bin/sleep", "5"], timeout_ms=50)
    assert_outcome(out, ("error", "timeout", "ran past 50 ms"))


def test_rule_output_cap(probe: Probe) -> None:
    """Output past the rule's output_bytes is dropped and reported as truncated."""
    out = probe(
        "shell_run_timed", argv=["/usr/bin/head", "-c", "5000", "/dev/zero"], timeout_ms=5000
    )
    assert out.report["ok"]["stdout_bytes"] == 1024
    assert out.report["ok"]["truncated"] is True


def test_rule_env_passed_rest_scrubbed(probe: Probe) -> None:
    """The child sees the rule's variables and the scrubbed PATH/LANG, no other host variable."""
    out = probe("shell_run", argv=["/usr/bin/env"])
    lines = sorted(out.report["ok"]["stdout"].splitlines())
    assert lines == ["LANG=C.UTF-8", "PATH=/usr/local/bin:/usr/bin:/bin", "SKILLD_ADV_PASS=passed"]


def test_needs_without_cwd_keep_the_grants_cwd(
    prober: Component, world: Path, tmp_path: Path
) -> None:
    """A need that lists no cwd cannot drop the grant's: the command still runs in the grant's."""
    root = str(world)
    policy = f"shell:\n  - id: pwd\n    program: /bin/pwd\n    cwd: [{root}/work]\n"
    (tmp_path / "prober.yaml").write_text(policy)
    needs = {"shell": [{"program": "/bin/pwd"}]}
    result = compile_policies(tmp_path, {"prober": needs})
    assert not result.problems
    assert list(result.tables.skill("prober")["shell"][0]["cwd"]) == [f"{root}/work"]
    probe = Probe(prober, result.tables)
    out = probe("shell_run", argv=["/bin/pwd"])
    assert_outcome(out, ("ok", ran(("stdout", f"{root}/work\n"))))
    out = probe("shell_run", argv=["/bin/pwd"], cwd="/")
    assert_outcome(out, ("deny", DENY, "no shell rule lists a cwd above /"))


def test_needs_with_a_narrower_cwd_keep_it(prober: Component, world: Path, tmp_path: Path) -> None:
    """A need naming a directory inside the grant's narrows the command to that directory."""
    root = str(world)
    policy = f"shell:\n  - id: pwd\n    program: /bin/pwd\n    cwd: [{root}/work]\n"
    (tmp_path / "prober.yaml").write_text(policy)
    needs = {"shell": [{"program": "/bin/pwd", "cwd": [f"{root}/work/sub"]}]}
    result = compile_policies(tmp_path, {"prober": needs})
    assert not result.problems
    probe = Probe(prober, result.tables)
    out = probe("shell_run", argv=["/bin/pwd"])
    assert_outcome(out, ("ok", ran(("stdout", f"{root}/work/sub\n"))))
    out = probe("shell_run", argv=["/bin/pwd"], cwd=f"{root}/work")
    assert_outcome(out, ("deny", DENY, f"no shell rule lists a cwd above {root}/work"))


# (id, variable name, expected)
ENV: list[tuple[str, str, tuple[Any, ...]]] = [
    ("listed", "SKILLD_ADV_OK", ("ok", "yes")),
    ("family-member", "SKILLD_FAM_A", ("ok", "fa")),
    ("family-member-unset", "SKILLD_FAM_B", ("ok", None)),
    ("family-bare-prefix", "SKILLD_FAM_", ("ok", None)),
    ("listed-name-longer", "SKILLD_ADV_OKX", ("deny", DENY, "add 'SKILLD_ADV_OKX' to env")),
    ("listed-name-shorter", "SKILLD_ADV_O", ("deny", DENY, "add 'SKILLD_ADV_O' to env")),
    ("case-variant", "skilld_adv_ok", ("deny", DENY, "add 'skilld_adv_ok' to env")),
    ("family-without-separator", "SKILLD_FAMX", ("deny", DENY, "add 'SKILLD_FAMX' to env")),
    ("family-shorter", "SKILLD_FA", ("deny", DENY, "add 'SKILLD_FA' to env")),
    (
        "literal-star",
        "SKILLD_ADV_*",
        ("deny", "bad-request", "'SKILLD_ADV_*' is not an environment variable name"),
    ),
    (
        "trailing-newline",
        "SKILLD_ADV_OK\n",
        ("deny", "bad-request", "'SKILLD_ADV_OK\\n' is not an environment variable name"),
    ),
    ("unlisted-secret", "SKILLD_ADV_SECRET", ("deny", DENY, "add 'SKILLD_ADV_SECRET' to env")),
    (
        "shell-rule-env-not-readable",
        "SKILLD_ADV_PASS",
        ("deny", DENY, "add 'SKILLD_ADV_PASS' to env"),
    ),
    ("path", "PATH", ("deny", DENY, "add 'PATH' to env")),
    ("home", "HOME", ("deny", DENY, "add 'HOME' to env")),
    ("empty", "", ("deny", "bad-request", "'' is not an environment variable name")),
]


@pytest.mark.parametrize(("name", "variable", "expected"), ENV, ids=case_ids(ENV))
def test_env_case(probe: Probe, name: str, variable: str, expected: tuple[Any, ...]) -> None:
    """Each variable name gets exactly the outcome in the table."""
    out = probe("env_get", name=variable)
    assert_outcome(out, expected)
    assert "leak" not in str(out.report)
