"""tcp, shell argv, invoke, env, transfer, kv and mcp checks."""

from __future__ import annotations

import shlex
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from skilld.permissions import SkillPermissions, check_text, explain
from skilld.permissions._text import _split_argv
from skilld.policy import Tables, compile_policies

TCP = """
tcp:
  - host: db.internal
    ports: 5432
    allow_private: true
  - id: cache
    host: "*.cache.svc"
    ports: "6379-6380"
  - id: lan
    host: 10.20.0.0/16
    ports: [22, "8000-8010"]
  - host: "*"
    ports: 443
"""

Make = Callable[..., SkillPermissions]


@pytest.mark.parametrize(
    ("host", "port", "allowed", "rule"),
    [
        ("db.internal", 5432, True, "s.tcp[0]"),
        ("DB.Internal.", 5432, True, "s.tcp[0]"),
        ("db.internal", 5433, False, "default-deny"),
        ("db.internal.evil", 5432, False, "default-deny"),
        ("a.cache.svc", 6380, True, "s.cache"),
        ("cache.svc", 6379, False, "default-deny"),
        ("10.20.3.4", 8005, True, "s.lan"),
        ("10.20.3.4", 8011, False, "default-deny"),
        ("10.21.3.4", 22, False, "default-deny"),
        ("example.com", 443, True, "s.tcp[3]"),
        ("93.184.216.34", 443, True, "s.tcp[3]"),
        ("127.0.0.1", 443, False, "default-deny"),
        ("2130706433", 443, False, "default-deny"),
        ("::ffff:10.20.0.9", 22, True, "s.lan"),
        ("169.254.169.254", 443, False, "default-deny"),
    ],
)
def test_tcp(make: Make, host: str, port: int, allowed: bool, rule: str) -> None:
    """host:port grants by name, suffix, CIDR and port range; IP literals need naming."""
    d = make(TCP).check_tcp(host, port)
    assert (d.allowed, d.rule) == (allowed, rule), d.reason


def test_tcp_resolved_address(make: Make) -> None:
    """A name that resolves privately passes only through a rule with allow_private."""
    c = make(TCP)
    assert c.check_address("10.0.0.7", 5432, "tcp", "db.internal").rule == "s.tcp[0]"
    assert not c.check_address("10.0.0.7", 443, "tcp", "example.com").allowed
    assert c.check_address("10.20.0.7", 22, "tcp").rule == "s.lan"
    assert check_text(c, "tcp", "address", "10.0.0.7:5432 db.internal").rule == "s.tcp[0]"
    assert check_text(c, "tcp", "connect", "db.internal:5432").allowed
    assert check_text(c, "tcp", "connect", "db.internal:x").rule == "bad-request"


SHELL = """
shell:
  - id: git-status
    program: /usr/bin/git
    args: [status, "**"]
    cwd: [/data/repo]
  - id: git-log
    program: git
    args: [log, "--format=*", "-n", "*"]
  - id: ls
    program: ls
"""


@pytest.mark.parametrize(
    ("argv", "allowed", "rule"),
    [
        (["/usr/bin/git", "status"], True, "s.git-status"),
        (["/usr/bin/git", "status", "--short", "-b"], True, "s.git-status"),
        (["/usr/bin/git", "push"], False, "s.git-status"),
        (["git", "status"], False, "s.git-log"),
        (["/usr/bin/git-evil", "status"], False, "default-deny"),
        (["git", "log", "--format=%H", "-n", "5"], True, "s.git-log"),
        (["git", "log", "--format=%H", "-n", "5", "--all"], False, "s.git-log"),
        (["git", "log", "--format=%H", "-n"], False, "s.git-log"),
        (["git", "log", "--format=x; rm -rf /", "-n", "5 && curl evil"], True, "s.git-log"),
        (["git", "log --format=x", "-n", "5"], False, "s.git-log"),
        (["ls"], True, "s.ls"),
        (["ls", "-la"], False, "s.ls"),
        (["ls; rm -rf /"], False, "default-deny"),
        (["sh", "-c", "ls"], False, "default-deny"),
        ([], False, "bad-request"),
    ],
)
def test_argv(make: Make, argv: list[str], allowed: bool, rule: str) -> None:
    """Programs match exactly; argv patterns match whole arguments; metacharacters are data."""
    d = make(SHELL).check_argv(argv)
    assert (d.allowed, d.rule) == (allowed, rule), d.reason


def test_a_command_written_as_text_is_split_like_a_shell_then_asked_as_argv(make: Make) -> None:
    """check_text's shell.run decides what check_argv decides; the plain check() refuses it."""
    c = make(SHELL)
    argv = ["git", "log", "--format=a b;c", "-n", "$(id)"]
    assert check_text(c, "shell", "run", shlex.join(argv)) == c.check_argv(argv)
    assert check_text(c, "shell", "run", "git 'unclosed").rule == "bad-request"
    refused = c.check("shell", "run", shlex.join(argv))
    assert (refused.allowed, refused.rule) == (False, "bad-request")
    assert "ask it typed, with check_argv" in refused.reason


def test_shell_cwd(make: Make) -> None:
    """Working directories must lie under a rule's cwd list."""
    c = make(SHELL)
    assert c.check_argv(["/usr/bin/git", "status"], cwd="/data/repo/sub").allowed
    assert not c.check_argv(["/usr/bin/git", "status"], cwd="/data/repo-evil").allowed
    assert not c.check_argv(["ls"], cwd="/data/repo").allowed
    assert c.check("shell", "cwd", "/data/repo").allowed
    assert not c.check("shell", "cwd", "/data").allowed


@given(st.lists(st.text(min_size=1, max_size=8).filter(lambda s: "\x00" not in s), max_size=4))
def test_argv_property(args: list[str]) -> None:
    """Property: only exactly ``ls`` or ``cat <one arg without '/'>`` pass."""
    c = SkillPermissions(
        "p",
        {
            "shell": [
                {"id": "p.ls", "program": "ls", "args": [], "cwd": [], "env": []},
                {"id": "p.cat", "program": "cat", "args": ["*"], "cwd": [], "env": []},
            ]
        },
    )
    assert not c.check_argv(["ls", *args]).allowed or not args
    assert c.check_argv(["cat", *args]).allowed == (len(args) == 1)


INVOKE = {
    "a": "invoke:\n  calls: [b, c, d]\n  max_depth: 2\n",
    "b": "invoke:\n  calls: [a]\n  called_by: [a]\n",
    "c": "invoke:\n  called_by: ['*']\n",
    "d": "kv: {}\n",
}


def _remote_tables() -> Tables:
    """Compiled once for the hypothesis test (which takes no function-scoped fixtures)."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "far.yaml").write_text("invoke:\n  remote_called_by: [a, 'edge-*/b']\n")
        return compile_policies(Path(tmp)).tables


_REMOTE_TABLES = _remote_tables()


def _invoke_checker(tmp_path: Path, skill: str) -> SkillPermissions:
    root = tmp_path / "inv"
    root.mkdir(exist_ok=True)
    for name, text in INVOKE.items():
        (root / f"{name}.yaml").write_text(text)
    return SkillPermissions.from_tables(compile_policies(root).tables, skill)


def test_invoke_needs_both_sides(tmp_path: Path) -> None:
    """A call needs the caller's calls and the callee's called_by (or '*')."""
    a = _invoke_checker(tmp_path, "a")
    assert a.check_invoke("b").rule == "a.invoke"
    assert a.check_invoke("c").allowed
    d = a.check_invoke("d")
    assert not d.allowed and "called_by" in d.reason
    assert not a.check_invoke("e").allowed
    assert a.check("invoke", "call", "b").allowed


def test_invoke_depth_and_cycles(tmp_path: Path) -> None:
    """Calls deeper than max_depth and calls back into the chain are refused."""
    a = _invoke_checker(tmp_path, "a")
    assert a.check_invoke("b", depth=2).allowed
    assert a.check_invoke("b", depth=3).rule == "a.invoke"
    assert not a.check_invoke("b", depth=3).allowed
    b = _invoke_checker(tmp_path, "b")
    cyc = b.check_invoke("a", depth=2, chain=["a"])
    assert not cyc.allowed and cyc.rule == "invoke.cycle"
    assert b.check_invoke("b").rule == "invoke.cycle"


def test_remote_calls_are_granted_here_and_consented_there(tmp_path: Path) -> None:
    """remote_calls lets the caller's node route a call; the holder checks remote_called_by."""
    root = tmp_path / "remote"
    root.mkdir()
    (root / "a.yaml").write_text("invoke:\n  remote_calls: [far]\n  max_depth: 1\n")
    (root / "far.yaml").write_text(
        "invoke:\n  id: consent\n  remote_called_by: [a, 'edge-*/b', 'hub/*']\n"
    )
    tables = compile_policies(root).tables
    a = SkillPermissions.from_tables(tables, "a")
    assert a.check_invoke("far").allowed and a.check_invoke("far").rule == "a.invoke"
    assert not a.check_invoke("far", depth=2).allowed
    assert not a.check_invoke("near").allowed and "remote_calls" in a.check_invoke("near").reason
    far = SkillPermissions.from_tables(tables, "far")
    assert far.check_remote_caller("any-node", "a").rule == "far.consent"
    assert far.check_remote_caller("edge-7", "b").allowed
    assert not far.check_remote_caller("core-1", "b").allowed
    assert far.check_remote_caller("hub", "whoever").allowed
    refused = far.check("invoke", "called-by", "core-1/c")
    assert (refused.allowed, refused.rule) == (False, "far.consent")
    assert "remote_called_by" in refused.reason
    # Without a rule of its own a skill consents to nobody on another node.
    assert a.check_remote_caller("hub", "far").rule == "a.invoke"
    assert not a.check_remote_caller("hub", "far").allowed
    assert explain(tables, "far", "invoke.called-by", "edge-2/b").allowed
    assert explain(tables, "far", "invoke.called-by", "a").rule == "bad-request"


@given(node=st.from_regex(r"[a-z0-9][a-z0-9._-]{0,20}", fullmatch=True), caller=st.text())
def test_remote_consent_never_widens(node: str, caller: str) -> None:
    """Whatever node and caller names arrive in a routed call's headers, only listed ones pass."""
    c = SkillPermissions.from_tables(_REMOTE_TABLES, "far")
    allowed = c.check_remote_caller(node, caller).allowed
    assert allowed == (caller == "a" or (node.startswith("edge-") and caller == "b"))


def test_env(make: Make) -> None:
    """Environment names match exactly or by a PREFIX_* family."""
    c = make("env:\n  - HOME\n  - {name: 'APP_*', id: app}\n")
    assert c.check_env("HOME").rule == "s.env[0]"
    assert c.check_env("APP_TOKEN").rule == "s.app"
    assert not c.check_env("HOMEX").allowed
    assert not c.check_env("PATH").allowed


def test_transfer(make: Make) -> None:
    """Transfers need a matching node and a path under a granted directory; fetch needs rw."""
    c = make(
        "transfer:\n  - nodes: [edge-*]\n    paths: [/data/out]\n"
        "  - nodes: [hub]\n    paths: [/data/in]\n    mode: rw\n"
    )
    assert c.check_transfer("edge-1", "/data/out/x").allowed
    assert not c.check_transfer("edge-1", "/data/out/x", fetch=True).allowed
    assert not c.check_transfer("core-1", "/data/out/x").allowed
    assert not c.check_transfer("edge-1", "/data/outside").allowed
    assert c.check("transfer", "fetch", "hub:/data/in/a").rule == "s.transfer[1]"


def test_kv_log_mcp_and_unknown(make: Make) -> None:
    """kv needs a grant, log is always allowed, sampling needs mcp.client, nonsense is refused."""
    c = make("kv: {}\nmcp:\n  client: [sample]\n")
    assert c.check("kv", "set", "k").rule == "s.kv"
    assert not make("{}\n").check("kv", "get", "k").allowed
    assert c.check("log", "info", "").allowed
    assert c.check("mcp", "sample", "").allowed
    assert not c.check("mcp", "elicit", "").allowed
    assert c.check("gpu", "use", "x").rule == "bad-request"


def test_limits_and_exposure_from_tables(make: Make) -> None:
    """The checker carries the skill's Limits and MCP exposure."""
    c = make(
        "limits:\n  memory: 32MiB\n  wall_time: 1s\n  concurrency: 2\n  kv_quota: 1MB\n"
        "mcp:\n  tools: per-skill\n  hidden: [x]\n  names: {s: tool_s}\n"
    )
    assert (c.limits.memory_bytes, c.limits.timeout_ms, c.limits.max_concurrency) == (
        32 * 1024 * 1024,
        1000,
        2,
    )
    assert c.limits.kv_total_bytes == 1_000_000
    assert c.exposure.per_skill and c.exposure.hidden == ("x",)
    assert c.exposure.names == {"s": "tool_s"}


def test_rule_lookup_for_sandbox(make: Make) -> None:
    """The sandbox can read the deciding rule's settings (timeouts, caps, env)."""
    c = make("shell:\n  - program: ls\n    timeout: 2s\n    output_bytes: 1KiB\n    env: [LANG]\n")
    d = c.check_argv(["ls"])
    rule = c.rule(d.rule)
    assert rule is not None
    assert (rule["timeout_ms"], rule["output_bytes"], tuple(rule["env"])) == (2000, 1024, ("LANG",))


def test_explain_splits_shell_commands() -> None:
    """explain parses 'shell.run' targets like a shell would, then checks the argv."""
    tables = compile_policies(
        Path(__file__).resolve().parents[2] / "docs" / "examples" / "policies"
    ).tables
    assert explain(tables, "notes", "shell.run", "/usr/bin/git status").allowed
    assert explain(tables, "notes", "shell.run", "'unclosed").rule == "bad-request"
    assert explain(tables, "notes", "http.post", "https://api.example.com/v1/n").allowed


@pytest.mark.parametrize(
    ("host", "reason"),
    [
        ("db.internal\n", "bad host name 'db.internal\\n'"),
        (" db.internal", "bad host name ' db.internal'"),
        ("10.20.0.9\n", "bad host name '10.20.0.9\\n'"),
        ("a.cache.svc\n", "bad host name 'a.cache.svc\\n'"),
    ],
)
def test_tcp_host_is_never_trimmed(make: Make, host: str, reason: str) -> None:
    """A host with a newline or space is a bad request, never read as the granted name."""
    d = make(TCP).check_tcp(host, 5432)
    assert (d.allowed, d.rule, d.reason) == (False, "bad-request", reason)


@pytest.mark.parametrize(
    ("argv", "rule"),
    [
        (["/usr/bin/git", "status\n"], "s.git-status"),
        (["git", "log\n", "--format=x", "-n", "1"], "s.git-log"),
        (["ls\n"], "default-deny"),
    ],
)
def test_argv_trailing_newline_is_data(make: Make, argv: list[str], rule: str) -> None:
    """A literal argument pattern does not match the same text with a trailing newline."""
    d = make(SHELL).check_argv(argv)
    assert (d.allowed, d.rule) == (False, rule), d.reason


@pytest.mark.parametrize("name", ["", "APP_*", "HOME\n", "A=B", "1X"])
def test_env_names_that_no_grant_could_list(make: Make, name: str) -> None:
    """Names that are not variable names are bad requests (not 'add it to env')."""
    d = make("env:\n  - HOME\n  - APP_*\n").check_env(name)
    assert (d.allowed, d.rule, d.reason) == (
        False,
        "bad-request",
        f"{name!r} is not an environment variable name",
    )


def test_transfer_node_trailing_newline(make: Make) -> None:
    """A node glob matches the whole node name."""
    c = make("transfer:\n  - nodes: [edge-*, core]\n    paths: [/data]\n")
    assert c.check_transfer("core", "/data/x").allowed
    assert not c.check_transfer("core\n", "/data/x").allowed
    assert not c.check_transfer("edge-1\n", "/data/x").allowed


@given(st.text(alphabet="ab '\"\\\t\n\r\x0b\x0c#$", max_size=16))
def test_shell_string_splits_like_shlex(text: str) -> None:
    """Property: the string form of shell.run is split exactly as shlex.split splits it."""
    try:
        expected = shlex.split(text)
    except ValueError:
        with pytest.raises(ValueError):
            _split_argv(text)
        return
    assert _split_argv(text) == expected


@given(st.lists(st.text(max_size=6).filter(lambda s: "\x00" not in s), min_size=1, max_size=4))
def test_shell_join_round_trips(argv: list[str]) -> None:
    """Property: what the sandbox writes (shlex.join) splits back to the same argv."""
    assert _split_argv(shlex.join(argv)) == argv
