"""The policy compiler: file:line errors, defaults, needs against grants, canonical tables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skilld.errors import PolicyError
from skilld.policy import Tables, compile_policies, load_tables
from support.policies import write_policies

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run in tmp_path, so that ``policies`` given relative is what errors show."""
    monkeypatch.chdir(tmp_path)


def write(tmp_path: Path, files: dict[str, str]) -> Path:
    """A policies directory holding ``files``, as the relative path ``policies``."""
    write_policies(tmp_path, files)
    return Path("policies")


def error_of(tmp_path: Path, files: dict[str, str], **kw: object) -> PolicyError:
    """The PolicyError compiling ``files`` raises."""
    with pytest.raises(PolicyError) as info:
        compile_policies(write(tmp_path, files), **kw)  # type: ignore[arg-type]
    return info.value


def test_unknown_key_names_file_line_and_suggests(tmp_path: Path) -> None:
    """A misspelt key is refused at its own line, with a did-you-mean."""
    err = error_of(tmp_path, {"notes.yaml": "fs:\n  - path: /data\n    mdoe: ro\n"})
    assert err.location == "policies/notes.yaml:3"
    assert "unknown key 'mdoe'" in err.message
    assert err.hint is not None and "mode" in err.hint


def test_unknown_top_level_key(tmp_path: Path) -> None:
    """An unknown section is refused at its line."""
    err = error_of(tmp_path, {"notes.yaml": "kv: {}\nraed: []\n"})
    assert err.location == "policies/notes.yaml:2"
    assert "unknown key 'raed'" in str(err)


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("fs:\n  - path: /data/a**b\n", 2, "bad glob"),
        ("fs:\n  - path: /data/[ab]\n", 2, "bad glob"),
        ("fs:\n  - path: data/notes\n", 2, "absolute"),
        ("fs:\n  - path: /data/../etc\n", 2, "not canonical"),
        ("fs:\n  - path: /data\n    mode: rx\n", 3, "mode"),
        ("tcp:\n  - host: 10.0.0.0/33\n    ports: 1\n", 2, "bad CIDR"),
        ("tcp:\n  - host: 10.0.0.1/8\n    ports: 1\n", 2, "bad CIDR"),
        ("tcp:\n  - host: db\n    ports: 9000-8000\n", 3, "start is after end"),
        ("tcp:\n  - host: db\n    ports: 70000\n", 3, "1..65535"),
        ("tcp:\n  - host: db\n    ports: [80, http]\n", 3, "bad port"),
        ("http:\n  - url: ftp://example.com/\n", 2, "scheme"),
        ("http:\n  - url: https://exa*mple.com/\n", 2, "bad URL pattern"),
        ("http:\n  - url: https://user@example.com/\n", 2, "userinfo"),
        ("http:\n  - url: https://example.com:0/\n", 2, "1..65535"),
        ("http:\n  - url: https://example.com/a*b\n", 2, "prefix"),
        ("http:\n  - url: example.com\n", 2, "scheme://"),
        ("http:\n  - url: https://example.com/\n    methods: [FETCH]\n", 3, "unknown HTTP method"),
        ("http:\n  - url: https://example.com/\n    addresses: [10.0.0.0/99]\n", 3, "bad CIDR"),
        ("shell:\n  - program: git status\n", 2, "one name"),
        ("shell:\n  - program: git\n    args: ['**', x]\n", 3, "last pattern"),
        ("shell:\n  - program: git\n    cwd: [tmp]\n", 3, "absolute"),
        ("env: ['1BAD']\n", 1, "environment variable"),
        ("limits:\n  memory: lots\n", 2, "bad size"),
        ("limits:\n  wall_time: 5 parsecs\n", 2, "bad duration"),
        ("mcp:\n  tools: some\n", 2, "per-method or per-skill"),
        ("invoke:\n  max_depth: 0\n", 2, "max_depth"),
        ("fs:\n  - {path: /a, id: x}\n  - {path: /b, id: x}\n", 3, "already used"),
        ("kv: {}\nkv: {}\n", 2, "duplicate key"),
        ("fs: [\n", 2, "not valid YAML"),
        ("shell:\n  - program: gh\n    env: [HOME, 'GH_*']\n", 3, "not a family"),
        ("shell:\n  - program: gh\n    env:\n      - HOME\n      - 'GH_*'\n", 5, "not a family"),
        # '$' anchors would have let a trailing newline through each of these
        ('env: ["HOME\\n"]\n', 1, "environment variable"),
        ('shell:\n  - program: gh\n    env: ["HOME\\n"]\n', 3, "environment variable"),
        ('fs:\n  - path: /data\n    id: "x\\n"\n', 3, "bad rule id"),
        ('mcp:\n  names: {add: "notes_add\\n"}\n', 2, "tool name"),
        ('transfer:\n  - nodes: ["edge\\n"]\n    paths: [/data]\n', 2, "bad node name"),
        ('invoke:\n  calls: ["echo\\n"]\n', 2, "bad skill id"),
        ('tcp:\n  - host: "db.internal\\n"\n    ports: 1\n', 2, "bad host name"),
        ('tcp:\n  - host: " db.internal"\n    ports: 1\n', 2, "bad host name"),
        ('tcp:\n  - host: "10.0.0.1\\n"\n    ports: 1\n', 2, "bad host name"),
    ],
)
def test_bad_values_are_located(tmp_path: Path, text: str, line: int, words: str) -> None:
    """Each kind of bad pattern or value is refused with the file and line that holds it."""
    err = error_of(tmp_path, {"notes.yaml": text})
    assert err.location == f"policies/notes.yaml:{line}", str(err)
    assert words in str(err)


def test_unknown_skill_reference_is_located(tmp_path: Path) -> None:
    """invoke.calls naming a skill that does not exist is refused at that line."""
    files = {"notes.yaml": "kv: {}\ninvoke:\n  max_depth: 2\n  calls: [ecko]\n"}
    err = error_of(tmp_path, files, skills={"notes": None, "echo": None})
    assert err.location == "policies/notes.yaml:4"
    assert "unknown skill 'ecko'" in err.message
    assert err.hint is not None and "echo" in err.hint


def test_remote_calls_naming_a_local_skill_is_refused(tmp_path: Path) -> None:
    """invoke.remote_calls is for skills other nodes hold: a bundle's own skill is an error."""
    files = {"notes.yaml": "kv: {}\ninvoke:\n  remote_calls: [echo]\n"}
    err = error_of(tmp_path, files, skills={"notes": None, "echo": None})
    assert err.location == "policies/notes.yaml:3"
    assert "'echo', a skill of this bundle" in err.message
    assert err.hint is not None and "invoke.calls" in err.hint


def test_remote_calls_close_to_a_local_name_warns(tmp_path: Path) -> None:
    """A remote callee one letter off a local skill compiles, with a warning at its line."""
    root = write(tmp_path, {"notes.yaml": "invoke:\n  remote_calls: [ecko, translate]\n"})
    result = compile_policies(root, {"notes": None, "echo": None})
    assert result.tables.skill("notes")["invoke"]["remote_calls"] == ("ecko", "translate")
    found = [w for w in result.warnings if "remote_calls" in w.message]
    assert len(found) == 1 and "'ecko'" in found[0].message and "'echo'" in found[0].message
    assert found[0].location == "policies/notes.yaml:2"


def test_bad_remote_called_by_entry_is_located(tmp_path: Path) -> None:
    """A remote_called_by entry that is neither SKILL, NODE/SKILL nor * is refused at its line."""
    files = {"notes.yaml": "invoke:\n  remote_called_by:\n    - node-a/ok\n    - Node A/x\n"}
    err = error_of(tmp_path, files)
    assert err.location == "policies/notes.yaml:4", str(err)
    assert "remote_called_by" in err.message


def test_remote_grants_meet_the_skills_needs(tmp_path: Path) -> None:
    """A need for calls is met by remote_calls too; what the skill does not need is left out."""
    root = write(tmp_path, {"a.yaml": "invoke:\n  remote_calls: [far, other]\n"})
    result = compile_policies(root, {"a": {"invoke": {"calls": ["far"]}}})
    inv = result.tables.skill("a")["invoke"]
    assert (inv["calls"], inv["remote_calls"]) == ((), ("far",))
    assert "invoke" in result.tables.interfaces("a")


def test_policy_for_unknown_skill(tmp_path: Path) -> None:
    """A policy file for a skill that is not known is refused."""
    err = error_of(tmp_path, {"nots.yaml": "kv: {}\n"}, skills={"notes": None})
    assert err.location == "policies/nots.yaml:1"
    assert "unknown skill 'nots'" in err.message


def test_skill_key_must_match_file_name(tmp_path: Path) -> None:
    """``skill:`` must agree with the file name."""
    err = error_of(tmp_path, {"notes.yaml": "kv: {}\nskill: other\n"})
    assert err.location == "policies/notes.yaml:2"


def test_defaults_apply_and_skill_overrides(tmp_path: Path) -> None:
    """defaults.yaml gives limits and rules to every skill; a skill's own values win."""
    root = write(
        tmp_path,
        {
            "defaults.yaml": "limits:\n  memory: 64MiB\n  wall_time: 2s\nenv: [LANG]\n",
            "a.yaml": "limits:\n  wall_time: 500ms\n",
            "b.yaml": "{}\n",
        },
    )
    tables = compile_policies(root).tables
    assert tables.limits("a").memory_bytes == 64 * 1024 * 1024
    assert tables.limits("a").timeout_ms == 500
    assert tables.limits("b").timeout_ms == 2000
    assert tables.skill("b")["env"][0]["id"] == "defaults.env[0]"


def test_needs_intersect_with_grants(tmp_path: Path) -> None:
    """The effective grant is the intersection: narrower need wins, mode is the lesser."""
    root = write(tmp_path, {"notes.yaml": "fs:\n  - path: /data\n    mode: rw\n"})
    needs = {"notes": {"fs": [{"path": "/data/notes", "mode": "ro"}]}}
    result = compile_policies(root, needs)
    fs = result.tables.skill("notes")["fs"]
    assert [(r["path"], r["mode"], r["id"]) for r in fs] == [("/data/notes", "ro", "notes.fs[0]")]
    assert not result.problems and not result.warnings


SHELL_GRANT = """\
shell:
  - id: pwd
    program: /bin/pwd
    args: ["**"]
    cwd: [/w/work, /w/other]
    timeout: 2s
    output_bytes: 1KiB
    env: [HOME]
"""


@pytest.mark.parametrize(
    ("need", "cwd"),
    [
        ({"program": "/bin/pwd"}, ["/w/work", "/w/other"]),
        ({"program": "/bin/pwd", "cwd": ["/w/work/sub"]}, ["/w/work/sub"]),
        ({"program": "/bin/pwd", "cwd": ["/w/other", "/w/work/a"]}, ["/w/other", "/w/work/a"]),
    ],
)
def test_shell_need_keeps_the_grants_cwd(
    tmp_path: Path, need: dict[str, object], cwd: list[str]
) -> None:
    """A need without cwd keeps the grant's directories; one with cwd narrows them, never widens."""
    root = write(tmp_path, {"notes.yaml": SHELL_GRANT})
    result = compile_policies(root, {"notes": {"shell": [need]}})
    assert not result.problems
    (rule,) = result.tables.skill("notes")["shell"]
    assert (rule["id"], list(rule["cwd"])) == ("notes.pwd", cwd)
    assert (rule["timeout_ms"], rule["output_bytes"]) == (2000, 1024)


def test_shell_need_outside_the_grants_cwd_is_not_granted(tmp_path: Path) -> None:
    """A need for a directory the grant does not list is a problem, not a wider grant."""
    root = write(tmp_path, {"notes.yaml": SHELL_GRANT})
    result = compile_policies(root, {"notes": {"shell": [{"program": "/bin/pwd", "cwd": ["/"]}]}})
    assert "not granted" in result.problems[0].message
    assert result.tables.skill("notes")["shell"] == ()


def test_grant_without_cwd_stays_without(tmp_path: Path) -> None:
    """A grant that lists no cwd (runs in /) gives a need for a directory only a problem."""
    root = write(tmp_path, {"notes.yaml": "shell:\n  - program: /bin/pwd\n"})
    need = {"program": "/bin/pwd", "cwd": ["/w"]}
    result = compile_policies(root, {"notes": {"shell": [need]}})
    assert "partly granted" in result.problems[0].message
    assert [list(r["cwd"]) for r in result.tables.skill("notes")["shell"]] == [[]]


@pytest.mark.parametrize(
    ("section", "grant", "need", "key", "value"),
    [
        ("invoke", "invoke:\n  calls: [b]\n  max_depth: 9\n", {"calls": ["b"]}, "max_depth", 9),
        (
            "invoke",
            "invoke:\n  calls: [b]\n  max_depth: 9\n",
            {"calls": ["b"], "max_depth": 3},
            "max_depth",
            3,
        ),
        ("invoke", "invoke:\n  calls: [b]\n", {"calls": ["b"], "max_depth": 30}, "max_depth", 4),
        (
            "http",
            "http:\n  - url: https://x.example/\n    max_response_bytes: 1000\n",
            {"url": "https://x.example/a"},
            "max_response_bytes",
            1000,
        ),
        (
            "http",
            "http:\n  - url: https://x.example/\n    addresses: [10.0.0.0/8]\n",
            {"url": "https://x.example/a"},
            "addresses",
            (),
        ),
        (
            "http",
            "http:\n  - url: https://x.example/\n    allow_private: true\n",
            {"url": "https://x.example/a"},
            "allow_private",
            False,
        ),
        (
            "tcp",
            "tcp:\n  - host: db\n    ports: 5432\n",
            {"host": "db", "ports": 5432},
            "allow_private",
            False,
        ),
        ("fs", "fs:\n  - path: /data\n    mode: rw\n", {"path": "/data/x"}, "mode", "ro"),
        (
            "transfer",
            "transfer:\n  - {nodes: [a], paths: [/d], mode: rw}\n",
            {"nodes": ["a"], "paths": ["/d/x"]},
            "mode",
            "ro",
        ),
    ],
)
def test_omitted_need_fields_never_widen_a_grant(
    tmp_path: Path, section: str, grant: str, need: object, key: str, value: object
) -> None:
    """For every rule kind, what the need leaves out keeps the grant's (narrower) value."""
    root = write(tmp_path, {"a.yaml": grant, "b.yaml": "invoke:\n  called_by: [a]\n"})
    result = compile_policies(
        root, {"a": {section: [need] if section != "invoke" else need}, "b": {}}
    )
    entry = result.tables.skill("a")[section]
    rule = entry if section == "invoke" else entry[0]
    assert rule[key] == value


def test_need_without_grant_is_a_problem(tmp_path: Path) -> None:
    """A need nothing grants is reported, and raise_for_problems makes it fatal."""
    root = write(tmp_path, {"notes.yaml": "fs:\n  - path: /data/notes\n"})
    needs = {"notes": {"http": [{"url": "https://api.example.com/"}], "kv": {}}}
    result = compile_policies(root, needs)
    assert len(result.problems) == 2
    assert any("not granted" in p.message for p in result.problems)
    assert result.tables.skill("notes")["http"] == ()
    with pytest.raises(PolicyError):
        result.raise_for_problems()


def test_partly_granted_need_is_a_problem_and_narrowed(tmp_path: Path) -> None:
    """A need wider than its grant keeps only the granted part and is reported."""
    root = write(tmp_path, {"notes.yaml": "fs:\n  - path: /data/notes\n    mode: rw\n"})
    result = compile_policies(root, {"notes": {"fs": [{"path": "/data", "mode": "rw"}]}})
    assert [r["path"] for r in result.tables.skill("notes")["fs"]] == ["/data/notes"]
    assert "partly granted" in result.problems[0].message


def test_unneeded_grant_warns_and_is_dropped(tmp_path: Path) -> None:
    """A grant the skill does not need is left out of the tables with a warning."""
    root = write(tmp_path, {"notes.yaml": "kv: {}\nenv: [HOME]\n"})
    result = compile_policies(root, {"notes": {"kv": {}}})
    assert result.tables.skill("notes")["env"] == ()
    assert result.warnings[0].location == "policies/notes.yaml:2"


def test_glob_need_covered_by_double_star_grant(tmp_path: Path) -> None:
    """A ``**`` grant covers ``*`` needs beneath it; a ``*`` grant does not cover ``**``."""
    root = write(tmp_path, {"a.yaml": "fs:\n  - path: /srv/*/docs\n  - path: /data/**\n"})
    ok = compile_policies(root, {"a": {"fs": [{"path": "/data/*/x.md"}]}})
    assert not ok.problems
    bad = compile_policies(root, {"a": {"fs": [{"path": "/srv/**/docs"}]}})
    assert bad.problems


def test_mcp_client_need(tmp_path: Path) -> None:
    """Needing sampling without the grant is a problem; ``mcp: {}`` alone is fine."""
    root = write(tmp_path, {"a.yaml": "mcp:\n  client: [sample]\n", "b.yaml": "{}\n"})
    result = compile_policies(
        root, {"a": {"mcp": {"client": ["sample", "elicit"]}}, "b": {"mcp": {}}}
    )
    assert [p.skill for p in result.problems] == ["a"]
    assert result.tables.exposure("a").client == ("sample",)
    assert "mcp" in result.grants_of("b") and "kv" not in result.grants_of("b")


def test_invoke_cycle_warns(tmp_path: Path) -> None:
    """Two skills that may call each other are reported as a cycle."""
    root = write(
        tmp_path,
        {
            "a.yaml": "invoke:\n  calls: [b]\n  called_by: [b]\n",
            "b.yaml": "invoke:\n  calls: [a]\n  called_by: [a]\n",
        },
    )
    result = compile_policies(root)
    assert any("cycle" in w.message for w in result.warnings)


def test_tables_are_canonical_and_round_trip(tmp_path: Path) -> None:
    """The same policy gives the same digest; written tables load back equal."""
    first = compile_policies(ROOT / "policies").tables
    second = compile_policies(ROOT / "policies").tables
    assert first.digest == second.digest
    out = tmp_path / "tables.json"
    first.write(out)
    loaded = load_tables(out)
    assert loaded.digest == first.digest
    assert json.loads(out.read_text()) == json.loads(first.to_json())
    assert list(json.loads(first.to_json())) == sorted(json.loads(first.to_json()))


def test_tables_are_frozen() -> None:
    """Compiled tables cannot be changed in place."""
    tables = compile_policies(ROOT / "policies").tables
    with pytest.raises(TypeError):
        tables.data["skills"]["notes"]["fs"] = ()  # type: ignore[index]


def test_load_tables_refuses_other_json(tmp_path: Path) -> None:
    """A JSON file that is not tables is refused with a hint."""
    path = tmp_path / "t.json"
    path.write_text('{"format": "other"}')
    with pytest.raises(PolicyError, match="not policy tables"):
        load_tables(path)
    with pytest.raises(PolicyError):
        Tables.from_data({"format": "skilld-policy-tables/1"})


def test_sample_policies_compile_against_sample_skills() -> None:
    """The shipped policies compile against the shipped skills' needs without problems."""
    import yaml

    skills = {}
    for d in (ROOT / "skills").iterdir():
        if (d / "skill.yaml").is_file():
            meta = yaml.safe_load((d / "skill.yaml").read_text())
            skills[meta["id"]] = meta.get("needs") or {}
    result = compile_policies(ROOT / "policies", skills)
    assert not result.problems
    assert result.tables.limits("notes").max_concurrency == 4
    assert result.tables.exposure("notes").names == {"add": "notes_add"}


def test_mcp_tasks_compiles_into_the_exposure(tmp_path: Path) -> None:
    """``mcp.tasks`` names the methods that may run as MCP tasks; a policy without it
    compiles to the tables it always did (no ``tasks`` key: no tool is a task)."""
    root = write(
        tmp_path,
        {"a.yaml": "mcp:\n  tasks: {slow: optional, must: required}\n", "b.yaml": "{}\n"},
    )
    result = compile_policies(root)
    assert result.tables.exposure("a").tasks == {"slow": "optional", "must": "required"}
    assert result.tables.exposure("b").tasks == {}
    assert "tasks" not in result.tables.skill("b")["mcp"]


@pytest.mark.parametrize("mode", ["always", "", "Optional", "[optional]"])
def test_mcp_tasks_refuses_an_unknown_mode(tmp_path: Path, mode: str) -> None:
    """A task mode other than optional/required is refused at its line."""
    err = error_of(tmp_path, {"a.yaml": f"mcp:\n  tasks:\n    slow: {mode or repr(mode)}\n"})
    assert err.location is not None and err.location.startswith("policies/a.yaml:")
    assert "tasks" in err.message or "task support" in err.message
