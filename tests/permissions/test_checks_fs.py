"""fs checks on canonical paths: trees, globs, modes, prefix tricks, default deny."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from skilld.permissions import SkillPermissions, check_text
from skilld.types import PermissionChecker

POLICY = """
fs:
  - path: /data/notes
    mode: rw
  - id: shared
    path: /data/shared/*/docs
  - path: /data/md/**/*.md
  - path: /srv/*
"""

Make = Callable[..., SkillPermissions]


@pytest.fixture
def c(make: Make) -> SkillPermissions:
    """The checker for POLICY."""
    return make(POLICY)


def test_is_a_permission_checker(c: SkillPermissions) -> None:
    """The checker satisfies the PermissionChecker protocol the sandbox uses."""
    assert isinstance(c, PermissionChecker)


@pytest.mark.parametrize(
    ("path", "write", "allowed", "rule"),
    [
        ("/data/notes", False, True, "s.fs[0]"),
        ("/data/notes/a/b/c.txt", True, True, "s.fs[0]"),
        ("/data/notes-evil", False, False, "default-deny"),
        ("/data/notes-evil/x", False, False, "default-deny"),
        ("/data/note", False, False, "default-deny"),
        ("/data", False, False, "default-deny"),
        ("/", False, False, "default-deny"),
        ("/data/shared/team/docs", False, True, "s.shared"),
        ("/data/shared/team/docs", True, False, "s.shared"),
        ("/data/shared/team/docs/inner.txt", False, False, "default-deny"),
        ("/data/shared/a/b/docs", False, False, "default-deny"),
        ("/data/md/x.md", False, True, "s.fs[2]"),
        ("/data/md/a/b/c/x.md", False, True, "s.fs[2]"),
        ("/data/md/a/x.md.txt", False, False, "default-deny"),
        ("/data/md/a/x.txt", False, False, "default-deny"),
        ("/srv/site", False, True, "s.fs[3]"),
        ("/srv/site/index.html", False, False, "default-deny"),
    ],
)
def test_paths(c: SkillPermissions, path: str, write: bool, allowed: bool, rule: str) -> None:
    """Directory grants cover their tree only; ``*`` is one segment, ``**`` any depth."""
    d = c.check_path(path, write=write)
    assert (d.allowed, d.rule) == (allowed, rule), d.reason


@pytest.mark.parametrize(
    "path",
    [
        "/data/notes/../../etc/passwd",
        "/data/notes/./a",
        "/data/notes//a",
        "/data/notes/",
        "data/notes/a",
        "/data/notes/a\x00",
    ],
)
def test_non_canonical_paths_are_refused(c: SkillPermissions, path: str) -> None:
    """A path that is not canonical is refused, never interpreted."""
    d = c.check_path(path)
    assert not d.allowed and d.rule == "fs.not-canonical"


def test_readonly_grant_names_itself_on_write(c: SkillPermissions) -> None:
    """Writing under a read-only grant is denied by that rule, saying it needs rw."""
    d = c.check_path("/data/md/a.md", write=True)
    assert not d.allowed and d.rule == "s.fs[2]" and "rw" in d.reason


def test_default_deny_says_what_would_allow(c: SkillPermissions) -> None:
    """A default denial names the path and the rule that would allow it."""
    d = c.check_path("/etc/passwd")
    assert d.rule == "default-deny" and "/etc/passwd" in d.reason and "path:" in d.reason


def test_ro_and_rw_on_same_tree(make: Make) -> None:
    """A narrower rw grant inside a ro tree allows writes there only."""
    c = make("fs:\n  - path: /data\n  - path: /data/out\n    mode: rw\n")
    assert c.check_path("/data/out/x", write=True).allowed
    assert not c.check_path("/data/in/x", write=True).allowed
    assert c.check_path("/data/in/x").allowed


def test_no_policy_denies_everything(make: Make) -> None:
    """A skill with an empty policy gets nothing."""
    c = make("{}\n")
    assert not c.check_path("/").allowed
    assert not c.check_path("/tmp/x").allowed


def test_a_path_or_a_url_written_as_text_is_asked_typed(c: SkillPermissions) -> None:
    """check_text's fs and http questions decide what check_path and check_url decide; the
    plain check() refuses them, naming the typed question to ask."""
    assert check_text(c, "fs", "write", "/data/md/a.md") == c.check_path(
        "/data/md/a.md", write=True
    )
    assert check_text(c, "fs", "read", "/etc/passwd") == c.check_path("/etc/passwd")
    url = "https://api.example.com/v1/x"
    assert check_text(c, "http", "get", url) == c.check_url(url, "GET")
    for capability, action, target, typed in (
        ("fs", "read", "/etc/passwd", "check_path"),
        ("fs", "mkdir", "/data/md/new", "check_path"),
        ("http", "GET", url, "check_url"),
        ("http", "POST", url, "check_url"),
    ):
        refused = c.check(capability, action, target)
        assert (refused.allowed, refused.rule) == (False, "bad-request")
        assert f"ask it typed, with {typed}" in refused.reason


_segment = st.text(alphabet="abn-._~e", min_size=1, max_size=6).filter(
    lambda s: s not in (".", "..")
)
_paths = st.lists(_segment, min_size=0, max_size=6).map(lambda segs: "/" + "/".join(segs))


@given(_paths, st.booleans())
def test_never_allows_outside_granted_prefixes(path: str, write: bool) -> None:
    """Property: a tree grant allows exactly the canonical paths at or below it."""
    c = SkillPermissions(
        "p",
        {
            "fs": [
                {"id": "p.a", "path": "/a/n", "mode": "rw"},
                {"id": "p.b", "path": "/b", "mode": "ro"},
            ]
        },
    )
    d = c.check_path(path, write=write)
    under_a = path == "/a/n" or path.startswith("/a/n/")
    under_b = path == "/b" or path.startswith("/b/")
    assert d.allowed == (under_a or (under_b and not write))


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        ("/d/a/secret", True),
        ("/d/a\n/secret", True),
        ("/d/a/secret\n", False),
        ("/d/a/secret\nx", False),
        ("/d/a/secre", False),
        ("/d/a/b/secret", False),
        ("/d/secret", False),
    ],
)
def test_glob_grant_matches_the_whole_path(make: Make, path: str, allowed: bool) -> None:
    """A glob grant matches the whole name: a trailing newline does not slip past the end."""
    d = make("fs:\n  - id: g\n    path: /d/*/secret\n").check_path(path)
    assert (d.allowed, d.rule) == (allowed, "s.g" if allowed else "default-deny"), d.reason


_glob_segment = st.text(alphabet="as\n*.", min_size=1, max_size=5).filter(
    lambda s: s not in (".", "..")
)


@given(st.lists(_glob_segment, min_size=1, max_size=4))
def test_glob_grant_property(segments: list[str]) -> None:
    """Property: '/d/*/s*t' allows exactly three segments: d, anything, s…t (newlines included)."""
    c = SkillPermissions("p", {"fs": [{"id": "p.g", "path": "/d/*/s*t", "mode": "ro"}]})
    path = "/d/" + "/".join(segments)
    expect = len(segments) == 2 and segments[1].startswith("s") and segments[1].endswith("t")
    assert c.check_path(path).allowed == expect
