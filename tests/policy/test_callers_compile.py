"""Caller rules (``policies/callers/*.yaml``): file:line errors, ids, the compiled table."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skilld.errors import PolicyError
from skilld.policy import compile_documents, compile_policies, load_tables

RULE = """\
rules:
  - id: writers
    who:
      - issuer: https://idp.example.com
        group: writers
      - token: ci
    skills: [notes]
    tools: ['echo/*']
  - who: local
    may: [list]
    resources: ['skill://notes/**']
"""


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run in tmp_path, so that ``policies`` given relative is what errors show."""
    monkeypatch.chdir(tmp_path)


def write(tmp_path: Path, callers: dict[str, str]) -> Path:
    """A policies directory with a notes and an echo policy and ``callers/`` holding ``callers``."""
    root = tmp_path / "policies"
    (root / "callers").mkdir(parents=True)
    (root / "notes.yaml").write_text("kv: {}\n")
    (root / "echo.yaml").write_text("{}\n")
    for name, text in callers.items():
        (root / "callers" / name).write_text(text)
    return Path("policies")


def error_of(tmp_path: Path, text: str, **kw: object) -> PolicyError:
    """The PolicyError compiling ``callers/team.yaml`` holding ``text`` raises."""
    with pytest.raises(PolicyError) as info:
        compile_policies(write(tmp_path, {"team.yaml": text}), **kw)  # type: ignore[arg-type]
    return info.value


def test_rules_compile_with_ids_and_sources(tmp_path: Path) -> None:
    """Each rule gets its id (explicit, or file[index]) and its source line; who is normalised."""
    tables = compile_policies(write(tmp_path, {"team.yaml": RULE})).tables
    callers = tables.callers
    assert callers is not None
    first, second = callers["rules"]
    assert first["id"] == "callers.writers"
    assert first["source"] == "policies/callers/team.yaml:2"
    assert first["effect"] == "allow"
    assert first["may"] == ("call", "list")
    assert first["skills"] == ("notes",) and first["tools"] == ("echo/*",)
    assert {"token": "ci"} in [dict(w) for w in first["who"]]
    assert second["id"] == "callers.team[1]"
    assert second["source"] == "policies/callers/team.yaml:9"
    assert [dict(w) for w in second["who"]] == [{"principal": "local"}]
    assert second["may"] == ("list",)
    # An allow rule names local: only anonymous stays open.
    assert callers["open"] == ("anonymous",)


def test_tables_are_frozen_and_round_trip(tmp_path: Path) -> None:
    """The callers table is a frozen value of the tables, and reads back to the same digest."""
    result = compile_policies(write(tmp_path, {"team.yaml": RULE}))
    rules = result.tables.callers["rules"]  # type: ignore[index]
    with pytest.raises(TypeError):
        rules[0]["id"] = "x"  # type: ignore[index]
    path = tmp_path / "tables.json"
    result.tables.write(path)
    assert load_tables(path).digest == result.digest


def test_no_callers_directory_keeps_the_digest(tmp_path: Path) -> None:
    """Without policies/callers/ the tables hold no callers key: older bundles keep their digest."""
    root = write(tmp_path, {})
    tables = compile_policies(root).tables
    assert tables.callers is None
    assert "callers" not in tables.to_json()


def test_a_deny_rule_naming_local_leaves_it_open(tmp_path: Path) -> None:
    """Only allow rules close local and anonymous; a deny rule only takes away."""
    text = "rules:\n  - effect: deny\n    who: [local, anonymous]\n    tools: [notes/add]\n"
    callers = compile_policies(write(tmp_path, {"team.yaml": text})).tables.callers
    assert callers is not None and callers["open"] == ("anonymous", "local")


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("rules:\n  - who: local\n    skils: [notes]\n", 3, "unknown key 'skils'"),
        ("rulez: []\n", 1, "unknown key 'rulez'"),
        ("rules:\n  - who: locl\n    skills: [notes]\n", 2, "unknown principal 'locl'"),
        ("rules:\n  - who: {subject: alice}\n    skills: [notes]\n", 2, "name the issuer"),
        ("rules:\n  - who: {issuer: idp.example.com}\n    skills: ['*']\n", 2, "issuer's URL"),
        ("rules:\n  - who: {token: ci, issuer: https://i}\n    skills: ['*']\n", 2, "token alone"),
        ("rules:\n  - who: {token: 'c i'}\n    skills: ['*']\n", 2, "printable"),
        ("rules:\n  - who: {grop: x}\n    skills: ['*']\n", 2, "unknown key 'grop'"),
        ("rules:\n  - who: []\n    skills: ['*']\n", 2, "name nobody"),
        ("rules:\n  - who: local\n", 2, "names nothing"),
        ("rules:\n  - who: local\n    tools: ['echo/a**']\n", 3, "whole segment"),
        ("rules:\n  - who: local\n    tools: ['echo/[ab]']\n", 3, "bad tool name pattern"),
        ("rules:\n  - who: local\n    resources: ['skill://x/?']\n", 3, "cannot match"),
        ("rules:\n  - who: local\n    resources: ['notes/*']\n", 3, "must be a URI"),
        ("rules:\n  - who: local\n    skills: [Notes]\n", 3, "bad skill id"),
        ("rules:\n  - who: local\n    may: [read]\n    skills: ['*']\n", 3, "unknown action"),
        ("rules:\n  - who: local\n    effect: permit\n    skills: ['*']\n", 3, "allow or deny"),
        ("rules:\n  - id: 'a b'\n    who: local\n    skills: ['*']\n", 2, "bad rule id"),
    ],
)
def test_errors_name_file_and_line(tmp_path: Path, text: str, line: int, words: str) -> None:
    """Unknown keys, impossible principals and patterns are refused at their line."""
    err = error_of(tmp_path, text)
    assert err.location == f"policies/callers/team.yaml:{line}", err
    assert words in str(err)


def test_unknown_key_suggests_the_right_one(tmp_path: Path) -> None:
    """A misspelt key gets a did-you-mean."""
    err = error_of(tmp_path, "rules:\n  - who: local\n    skils: [notes]\n")
    assert err.hint is not None and "skills" in err.hint


def test_a_skill_the_bundle_does_not_hold_is_warned_about(tmp_path: Path) -> None:
    """With the bundle's skills known, skills: naming another is a warning at its line (in a
    cluster another node may serve it), with a did-you-mean when one is close."""
    text = "rules:\n  - who: local\n    skills:\n      - notes\n      - nots\n"
    root = write(tmp_path, {"team.yaml": text})
    result = compile_policies(root, {"notes": None, "echo": None})
    [warning] = [w for w in result.warnings if w.skill == "callers"]
    assert warning.location == "policies/callers/team.yaml:5"
    assert "'nots', which this bundle does not hold; did you mean 'notes'?" in warning.message
    assert result.tables.callers["rules"][0]["skills"] == ("notes", "nots")  # type: ignore[index]


def test_duplicate_ids_across_files_are_refused(tmp_path: Path) -> None:
    """Rule ids are unique over the whole directory; the second use is located."""
    one = "rules:\n  - id: ops\n    who: local\n    skills: ['*']\n"
    with pytest.raises(PolicyError) as info:
        compile_policies(write(tmp_path, {"a.yaml": one, "b.yaml": one}))
    assert info.value.location == "policies/callers/b.yaml:2"
    assert "already used at policies/callers/a.yaml:2" in info.value.message


def test_malformed_caller_tables_are_refused_at_load(tmp_path: Path) -> None:
    """Tables whose callers key is not a caller table fail to load, naming the file."""
    path = tmp_path / "tables.json"
    path.write_text('{"format": "skilld-policy-tables/1", "skills": {}, "callers": {"rules": 1}}')
    with pytest.raises(PolicyError) as info:
        load_tables(path)
    assert info.value.location == str(path) and "caller table" in info.value.message


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from(["", "*", "**", "local", "ci", "notes", "echo/*", "a**", "skill://x/**"]),
    st.text(max_size=8),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.sampled_from(
                ["token", "issuer", "subject", "group", "scope", "id", "who", "may", "skills"]
            ),
            inner,
            max_size=3,
        ),
    ),
    max_leaves=8,
)
_BASE = {"who": ["local"], "skills": ["*"]}
_KEYS = ["id", "who", "may", "effect", "skills", "tools", "prompts", "resources", "wat"]
# A well-formed rule with one value made odd: at a key, in who, or in a target list, so
# every example reaches the check it tests.
_RULES = st.one_of(
    st.builds(lambda k, v: {**_BASE, k: v}, st.sampled_from(_KEYS), _VALUES),
    st.builds(lambda v: {**_BASE, "who": ["local", v]}, _VALUES),
    st.builds(
        lambda k, v: {**_BASE, k: ["*" if k == "skills" else "a/*", v]},
        st.sampled_from(["skills", "tools", "prompts", "resources"]),
        _VALUES,
    ),
)


@settings(max_examples=300, deadline=None)
@given(doc=st.one_of(_VALUES, st.builds(lambda r: {"rules": r}, st.lists(_RULES, max_size=3))))
def test_any_document_compiles_or_is_refused_with_its_file(doc: object) -> None:
    """Whatever a caller document holds, the compiler answers with tables or a PolicyError
    located in that file, never another exception."""
    try:
        compile_documents({}, callers={"team.yaml": ("policies/callers/team.yaml", doc)})
    except PolicyError as exc:
        refused = exc
    else:
        return
    assert (refused.location or "").startswith("policies/callers/team.yaml"), refused
