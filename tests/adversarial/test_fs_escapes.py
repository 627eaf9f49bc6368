"""fs escapes, from the real prober under real compiled tables: no path leaves its grant."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from skilld.permissions import SkillPermissions
from skilld.policy import Tables
from skilld.sandbox import Component
from skilld.types import Decision
from support.adversarial import Probe, assert_outcome, case_ids, compile_dir, fill
from support.grants import give_grant_tree

POLICY = """\
fs:
  - id: notes
    path: {R}/data/Notes
  - id: work
    path: {R}/rw
    mode: rw
  - id: docs
    path: {R}/docs/*/*.md
  - id: vault
    path: {R}/vault/*/secret
shell:
  - id: ln
    program: /bin/ln
    args: ["-s", "*", "{R}/rw/*"]
  - id: ln-t
    program: /usr/bin/ln
    args: ["-s", /etc/hostname, "--target-directory={R}/rw/*"]
  - id: mkfifo
    program: /usr/bin/mkfifo
    args: ["{R}/rw/*"]
  - id: touch
    program: /usr/bin/touch
    args: ["{R}/rw/touched"]
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tree with grants, secrets beside them, case and prefix siblings, and symlinks."""
    root = Path(os.path.realpath(tmp_path_factory.mktemp("fs")))
    files = {
        "data/Notes/a.txt": "notes-a",
        "data/Notes/sub/b.txt": "notes-b",
        "data/Notes/%2e%2e/f.txt": "literal-dots",
        "data/notes/secret.txt": "lower",
        "data/NOTES/secret.txt": "upper",
        "data/Notes-evil/x.txt": "evil",
        "data/Notesx.txt": "evil",
        "secret.txt": "TOP SECRET",
        "rw/w.txt": "w",
        "rw-evil/x.txt": "evil",
        "docs/a/x.md": "x",
        "docs/a/y.txt": "y",
        "docs/b/deep/z.md": "z",
        "vault/a/secret": "granted",
        "vault/a/secret\n": "NEWLINE SECRET",
        "vault/a/secret\nx": "NEWLINE SECRET",
        "data/Notes\n/x.txt": "NEWLINE SECRET",
        "rw/tdir/keep": "keep",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    links = {
        "data/Notes/inside": "data/Notes/a.txt",
        "data/Notes/subdir-link": "data/Notes/sub",
        "data/Notes/escape": "secret.txt",
        "data/Notes/up": ".",
        "data/Notes/dangling": "newfile",
        "rw/link-out": "secret.txt",
        "rw/dir-out": "data",
        "docs/a/leak.md": "secret.txt",
    }
    for rel, target in links.items():
        (root / rel).symlink_to(root / target)
    # The rw grant belongs to the skill's group (its shell commands run in that group).
    give_grant_tree(root / "rw", "prober")
    return root


@pytest.fixture(scope="module")
def tables(world: Path, tmp_path_factory: pytest.TempPathFactory) -> Tables:
    """The prober's policy for this tree, compiled."""
    return compile_dir(
        tmp_path_factory.mktemp("policies"), {"prober": POLICY.replace("{R}", str(world))}
    )


@pytest.fixture
def probe(prober: Component, tables: Tables) -> Probe:
    """The prober under the compiled fs policy."""
    return Probe(prober, tables)


NOTES = "prober.notes"
DENY = "default-deny"
NOFOLLOW = "fs.no-follow"
NOFOLLOW_TEXT = "a symlink is on the way, and fs calls do not follow symlinks"

# (id, method, args with {R} for the tree's root, expected)
CASES: list[tuple[str, str, dict[str, Any], tuple[Any, ...]]] = [
    # inside the grant, however the path is spelled
    ("plain", "fs_read", {"path": "{R}/data/Notes/a.txt"}, ("ok", "notes-a")),
    ("nested", "fs_read", {"path": "{R}/data/Notes/sub/b.txt"}, ("ok", "notes-b")),
    ("double-slash", "fs_read", {"path": "{R}/data/Notes//a.txt"}, ("ok", "notes-a")),
    ("many-slashes", "fs_read", {"path": "{R}//data///Notes/a.txt"}, ("ok", "notes-a")),
    ("leading-double-slash", "fs_read", {"path": "/{R}/data/Notes/a.txt"}, ("ok", "notes-a")),
    ("dot-segment", "fs_read", {"path": "{R}/data/Notes/./a.txt"}, ("ok", "notes-a")),
    ("dotdot-inside", "fs_read", {"path": "{R}/data/Notes/sub/../a.txt"}, ("ok", "notes-a")),
    ("trailing-slash", "fs_read", {"path": "{R}/data/Notes/a.txt/"}, ("ok", "notes-a")),
    ("trailing-dot", "fs_read", {"path": "{R}/data/Notes/a.txt/."}, ("ok", "notes-a")),
    (
        "pct-2e-is-a-name",
        "fs_read",
        {"path": "{R}/data/Notes/%2e%2e/f.txt"},
        ("ok", "literal-dots"),
    ),
    (
        "pct-2f-is-a-name",
        "fs_read",
        {"path": "{R}/data/Notes/..%2fsecret.txt"},
        ("error", "not-found", "does not exist"),
    ),
    (
        "symlink-inside",
        "fs_read",
        {"path": "{R}/data/Notes/inside"},
        ("deny", NOFOLLOW, "do not follow symlinks"),
    ),
    (
        "symlink-dir-inside",
        "fs_read",
        {"path": "{R}/data/Notes/subdir-link/b.txt"},
        ("deny", NOFOLLOW, "do not follow symlinks"),
    ),
    (
        "symlink-loop-back-in",
        "fs_read",
        {"path": "{R}/data/Notes/up/data/Notes/a.txt"},
        ("deny", NOFOLLOW, "do not follow symlinks"),
    ),
    (
        "grant-dir-trailing-slash",
        "fs_stat",
        {"path": "{R}/data/Notes/"},
        ("ok", lambda v: v["is_dir"] is True),
    ),
    ("list-trailing-slash", "fs_list", {"path": "{R}/data/Notes/sub/"}, ("ok", ["b.txt"])),
    (
        "directory-is-not-a-file",
        "fs_read",
        {"path": "{R}/data/Notes/sub/.."},
        ("error", "invalid-argument", "not a regular file"),
    ),
    (
        "missing-inside",
        "fs_read",
        {"path": "{R}/data/Notes/nope"},
        ("error", "not-found", "does not exist"),
    ),
    # outside the grant
    (
        "dotdot-out",
        "fs_read",
        {"path": "{R}/data/Notes/../../secret.txt"},
        ("deny", DENY, "no fs rule covers"),
    ),
    (
        "dotdot-deep-out",
        "fs_read",
        {"path": "{R}/data/Notes/sub/../../../secret.txt"},
        ("deny", DENY, "no fs rule covers"),
    ),
    (
        "dotdot-to-case-sibling",
        "fs_read",
        {"path": "{R}/data/Notes/../notes/secret.txt"},
        ("deny", DENY, "no fs rule covers"),
    ),
    (
        "dotdot-to-prefix-sibling",
        "fs_read",
        {"path": "{R}/data/Notes/../Notes-evil/x.txt"},
        ("deny", DENY, "no fs rule covers"),
    ),
    (
        "pct-dir-then-dotdot",
        "fs_read",
        {"path": "{R}/data/Notes/%2e%2e/../../secret.txt"},
        ("deny", DENY, "no fs rule covers"),
    ),
    (
        "dotdot-past-root",
        "fs_read",
        {"path": "{R}/data/Notes/../../../../../../../../etc/passwd"},
        ("deny", DENY, "/etc/passwd"),
    ),
    (
        "case-lower",
        "fs_read",
        {"path": "{R}/data/notes/secret.txt"},
        ("deny", DENY, "no fs rule covers"),
    ),
    (
        "case-upper",
        "fs_read",
        {"path": "{R}/data/NOTES/secret.txt"},
        ("deny", DENY, "no fs rule covers"),
    ),
    (
        "case-parent",
        "fs_read",
        {"path": "{R}/DATA/Notes/a.txt"},
        ("deny", DENY, "no fs rule covers"),
    ),
    (
        "prefix-sibling-dir",
        "fs_read",
        {"path": "{R}/data/Notes-evil/x.txt"},
        ("deny", DENY, "no fs rule covers"),
    ),
    (
        "prefix-sibling-file",
        "fs_read",
        {"path": "{R}/data/Notesx.txt"},
        ("deny", DENY, "no fs rule covers"),
    ),
    (
        "symlink-file-out",
        "fs_read",
        {"path": "{R}/data/Notes/escape"},
        ("deny", NOFOLLOW, "do not follow symlinks"),
    ),
    (
        "symlink-dir-out",
        "fs_read",
        {"path": "{R}/data/Notes/up/secret.txt"},
        ("deny", NOFOLLOW, "do not follow symlinks"),
    ),
    (
        "symlink-dangling-out",
        "fs_read",
        {"path": "{R}/data/Notes/dangling"},
        ("deny", NOFOLLOW, "do not follow symlinks"),
    ),
    ("parent-of-grant", "fs_list", {"path": "{R}/data"}, ("deny", DENY, "no fs rule covers")),
    ("root", "fs_list", {"path": "/"}, ("deny", DENY, "no fs rule covers /")),
    ("etc-passwd", "fs_read", {"path": "/etc/passwd"}, ("deny", DENY, "no fs rule covers")),
    ("proc-self", "fs_read", {"path": "/proc/self/environ"}, ("deny", DENY, "no fs rule covers")),
    ("stat-outside", "fs_stat", {"path": "{R}/secret.txt"}, ("deny", DENY, "no fs rule covers")),
    (
        "nul-byte",
        "fs_read",
        {"path": "{R}/data/Notes/a.txt\u0000/../../secret.txt"},
        ("error", "invalid-argument", "NUL"),
    ),
    (
        "relative",
        "fs_read",
        {"path": "data/Notes/a.txt"},
        ("error", "invalid-argument", "must be absolute"),
    ),
    ("empty", "fs_read", {"path": ""}, ("error", "invalid-argument", "empty")),
    # writes
    (
        "write-read-only-grant",
        "fs_write",
        {"path": "{R}/data/Notes/new.txt", "data": "x"},
        ("deny", NOTES, "read only"),
    ),
    ("write-rw", "fs_write", {"path": "{R}/rw/new.txt", "data": "x"}, ("ok", None)),
    (
        "write-rw-dotdot-inside",
        "fs_write",
        {"path": "{R}/rw//deep/../n2.txt", "data": "x"},
        ("ok", None),
    ),
    (
        "write-through-symlink-out",
        "fs_write",
        {"path": "{R}/rw/link-out", "data": "x"},
        ("deny", NOFOLLOW, "do not follow symlinks"),
    ),
    (
        "write-through-dir-link-into-ro",
        "fs_write",
        {"path": "{R}/rw/dir-out/Notes/a.txt", "data": "x"},
        ("deny", NOFOLLOW, "do not follow symlinks"),
    ),
    (
        "write-dotdot-out",
        "fs_write",
        {"path": "{R}/rw/../secret.txt", "data": "x"},
        ("deny", DENY, "no fs rule covers"),
    ),
    (
        "write-prefix-sibling",
        "fs_write",
        {"path": "{R}/rw-evil/x.txt", "data": "x"},
        ("deny", DENY, "no fs rule covers"),
    ),
    (
        "write-case-variant",
        "fs_write",
        {"path": "{R}/RW/x.txt", "data": "x"},
        ("deny", DENY, "no fs rule covers"),
    ),
    ("mkdir-rw", "fs_mkdir", {"path": "{R}/rw/m/n/o"}, ("ok", None)),
    ("mkdir-out", "fs_mkdir", {"path": "{R}/rw/../mk"}, ("deny", DENY, "no fs rule covers")),
    ("remove-ro", "fs_remove", {"path": "{R}/data/Notes/a.txt"}, ("deny", NOTES, "read only")),
    (
        "remove-through-dir-link",
        "fs_remove",
        {"path": "{R}/rw/dir-out/notes/secret.txt"},
        ("deny", NOFOLLOW, "do not follow symlinks"),
    ),
    # globs: symlinks are neither walked nor matched; every match is judged on its own path
    (
        "glob-skips-links",
        "fs_glob",
        {"pattern": "{R}/data/Notes/*"},
        ("ok", ["{R}/data/Notes/%2e%2e", "{R}/data/Notes/a.txt", "{R}/data/Notes/sub"]),
    ),
    (
        "glob-suffix",
        "fs_glob",
        {"pattern": "{R}/data/Notes/*.txt"},
        ("ok", ["{R}/data/Notes/a.txt"]),
    ),
    (
        "glob-deep-no-link-descent",
        "fs_glob",
        {"pattern": "{R}/data/Notes/**/b.txt"},
        ("ok", ["{R}/data/Notes/sub/b.txt"]),
    ),
    ("glob-dotdot-after-wildcard", "fs_glob", {"pattern": "{R}/data/Notes/*/../../*"}, ("ok", [])),
    (
        "glob-dotdot-in-prefix",
        "fs_glob",
        {"pattern": "{R}/data/Notes/../*"},
        ("deny", DENY, "no fs rule covers"),
    ),
    (
        "glob-through-symlink-prefix",
        "fs_glob",
        {"pattern": "{R}/data/Notes/up/*"},
        ("deny", NOFOLLOW, "do not follow symlinks"),
    ),
    (
        "glob-case-variant",
        "fs_glob",
        {"pattern": "{R}/data/notes/*"},
        ("deny", DENY, "no fs rule covers"),
    ),
    (
        "glob-wildcard-above-grant",
        "fs_glob",
        {"pattern": "{R}/data/N*/*"},
        ("deny", DENY, "no fs rule covers"),
    ),
    (
        "glob-relative",
        "fs_glob",
        {"pattern": "data/*"},
        ("error", "invalid-argument", "must be absolute"),
    ),
    (
        "glob-nul",
        "fs_glob",
        {"pattern": "{R}/data/Notes/\u0000*"},
        ("error", "invalid-argument", "must be absolute"),
    ),
    (
        "glob-grant-root-unreadable",
        "fs_glob",
        {"pattern": "{R}/docs/*/*.md"},
        ("deny", DENY, "no fs rule covers"),
    ),
    ("read-glob-grant-match", "fs_read", {"path": "{R}/docs/a/x.md"}, ("ok", "x")),
    (
        "read-glob-grant-other-suffix",
        "fs_read",
        {"path": "{R}/docs/a/y.txt"},
        ("deny", DENY, "no fs rule covers"),
    ),
    (
        "read-glob-grant-too-deep",
        "fs_read",
        {"path": "{R}/docs/b/deep/z.md"},
        ("deny", DENY, "no fs rule covers"),
    ),
    (
        "read-glob-grant-symlink-out",
        "fs_read",
        {"path": "{R}/docs/a/leak.md"},
        ("deny", NOFOLLOW, "do not follow symlinks"),
    ),
    # a trailing newline is part of the name: '$' would have let it match
    ("glob-grant-exact", "fs_read", {"path": "{R}/vault/a/secret"}, ("ok", "granted")),
    (
        "glob-grant-trailing-newline",
        "fs_read",
        {"path": "{R}/vault/a/secret\n"},
        ("deny", DENY, "no fs rule covers"),
    ),
    (
        "glob-grant-newline-inside",
        "fs_read",
        {"path": "{R}/vault/a/secret\nx"},
        ("deny", DENY, "no fs rule covers"),
    ),
    (
        "glob-grant-trailing-newline-stat",
        "fs_stat",
        {"path": "{R}/vault/a/secret\n"},
        ("deny", DENY, "no fs rule covers"),
    ),
    (
        "tree-grant-newline-sibling",
        "fs_read",
        {"path": "{R}/data/Notes\n/x.txt"},
        ("deny", DENY, "no fs rule covers"),
    ),
    (
        "tree-grant-trailing-newline-dir",
        "fs_list",
        {"path": "{R}/data/Notes\n"},
        ("deny", DENY, "no fs rule covers"),
    ),
    (
        "glob-request-question-mark",
        "fs_glob",
        {"pattern": "{R}/data/Notes/?.txt"},
        ("error", "invalid-argument", "'?' is not supported"),
    ),
    (
        "glob-request-brackets",
        "fs_glob",
        {"pattern": "{R}/data/Notes/[a].txt"},
        ("error", "invalid-argument", "'[]' is not supported"),
    ),
]


@pytest.mark.parametrize(("name", "method", "args", "expected"), CASES, ids=case_ids(CASES))
def test_fs_case(
    probe: Probe,
    world: Path,
    name: str,
    method: str,
    args: dict[str, Any],
    expected: tuple[Any, ...],
) -> None:
    """Each path trick gets exactly the outcome in the table, and the secrets stay unread."""
    root = str(world)
    expected = fill(expected, root)
    out = probe(method, **fill(args, root))
    assert_outcome(out, expected)
    assert "TOP SECRET" not in str(out.report)
    assert (world / "secret.txt").read_text() == "TOP SECRET"
    if expected[0] == "deny" and expected[1] != NOFOLLOW:
        denied = [d for d in out.decisions if not d.allowed]
        assert denied and denied[-1].rule == expected[1]
    if expected[1:2] == (NOFOLLOW,):
        # The refusal names the path as the guest wrote it, and nothing of where links lead.
        written = fill(args, root).get("path") or fill(args, root)["pattern"]
        assert out.report["message"] == f"{written}: {NOFOLLOW_TEXT}", out.report


def test_guest_made_symlink_cannot_escape(probe: Probe, world: Path) -> None:
    """A symlink the guest plants through an allowed ln rule is not followed, nor revealed."""
    made = probe("shell_run", argv=["/bin/ln", "-s", f"{world}/secret.txt", f"{world}/rw/made"])
    assert made.report["ok"]["exit"] == 0
    out = probe("fs_read", path=f"{world}/rw/made")
    assert_outcome(out, ("deny", NOFOLLOW, "do not follow symlinks"))
    assert "secret.txt" not in out.report["message"]
    out = probe("fs_write", path=f"{world}/rw/made", data="pwned")
    assert_outcome(out, ("deny", NOFOLLOW, "do not follow symlinks"))
    dir_link = probe("shell_run", argv=["/bin/ln", "-s", f"{world}/data", f"{world}/rw/d"])
    assert dir_link.report["ok"]["exit"] == 0
    out = probe("fs_write", path=f"{world}/rw/d/notes/secret.txt", data="pwned")
    assert_outcome(out, ("deny", NOFOLLOW, "do not follow symlinks"))
    assert (world / "secret.txt").read_text() == "TOP SECRET"
    assert (world / "data/notes/secret.txt").read_text() == "lower"


@pytest.mark.parametrize(
    ("name", "link", "expected"),
    [
        (
            "dotdot-out-of-pattern",
            "{R}/rw/../planted",
            (
                "deny",
                "prober.ln",
                "{R}/rw/../planted (a path argument, resolved, is outside the pattern)",
            ),
        ),
        (
            "symlinked-dir-out",
            "{R}/rw/dir-out/planted",
            (
                "deny",
                "prober.ln",
                "{R}/rw/dir-out/planted (a path argument, resolved, is outside the pattern)",
            ),
        ),
        ("dot-segment-inside", "{R}/rw/./inside-link", ("ok", lambda v: v["exit"] == 0)),
    ],
)
def test_path_pattern_args_stay_in_their_directory(
    probe: Probe, world: Path, name: str, link: str, expected: tuple[Any, ...]
) -> None:
    """A path argument matched by '/dir/*' must still be under /dir once canonical."""
    root = str(world)
    out = probe("shell_run", argv=["/bin/ln", "-s", "/etc/passwd", fill(link, root)])
    assert_outcome(out, fill(expected, root))
    assert not (world / "planted").exists()
    assert not (world / "data" / "planted").exists()


# (id, --target-directory value, expected, where a planted link would land)
FLAG_PATHS: list[tuple[str, str, tuple[Any, ...], str]] = [
    (
        "flag-dotdot-out",
        "{R}/rw/..",
        (
            "deny",
            "prober.ln-t",
            "--target-directory={R}/rw/.. (a path argument, resolved, is outside the pattern)",
        ),
        "{R}/hostname",
    ),
    (
        "flag-dotdot-deep-out",
        "{R}/rw/tdir/../../data",
        (
            "deny",
            "prober.ln-t",
            "--target-directory={R}/rw/tdir/../../data "
            "(a path argument, resolved, is outside the pattern)",
        ),
        "{R}/data/hostname",
    ),
    (
        "flag-symlinked-dir-out",
        "{R}/rw/dir-out",
        (
            "deny",
            "prober.ln-t",
            "--target-directory={R}/rw/dir-out (a path argument, resolved, is outside the pattern)",
        ),
        "{R}/data/hostname",
    ),
    (
        "flag-trailing-newline-stays-a-name",
        "{R}/rw/tdir\n",
        ("ok", lambda v: v["exit"] != 0),
        "{R}/rw/tdir\n/hostname",
    ),
    ("flag-inside", "{R}/rw/tdir", ("ok", lambda v: v["exit"] == 0), "{R}/rw/tdir/hostname"),
    (
        "flag-double-slash-inside",
        "{R}/rw//tdir/",
        ("ok", lambda v: v["exit"] == 0),
        "{R}/rw/tdir/hostname",
    ),
]


@pytest.mark.parametrize(
    ("name", "directory", "expected", "landing"), FLAG_PATHS, ids=case_ids(FLAG_PATHS)
)
def test_path_in_a_flag_stays_in_its_directory(
    probe: Probe, world: Path, name: str, directory: str, expected: tuple[Any, ...], landing: str
) -> None:
    """A path inside a flag ('--target-directory=/dir/*') is made canonical and checked again."""
    root = str(world)
    link = Path(fill(landing, root))
    link.unlink(missing_ok=True)
    argv = ["/usr/bin/ln", "-s", "/etc/hostname", f"--target-directory={fill(directory, root)}"]
    out = probe("shell_run", argv=argv)
    assert_outcome(out, fill(expected, root))
    assert link.is_symlink() == (expected[0] == "ok" and "newline" not in name)
    assert not (world / "hostname").exists()
    assert not (world / "data" / "hostname").exists()
    if expected[0] == "deny":
        assert [d.allowed for d in out.decisions] == [True, False]
        assert out.decisions[-1].rule == "prober.ln-t"


def test_literal_path_arg_through_planted_symlink(probe: Probe, world: Path) -> None:
    """A literal path argument is checked canonical too: a symlink planted there is refused."""
    made = probe(
        "shell_run", argv=["/bin/ln", "-s", f"{world}/planted-by-touch", f"{world}/rw/touched"]
    )
    assert made.report["ok"]["exit"] == 0
    out = probe("shell_run", argv=["/usr/bin/touch", f"{world}/rw/touched"])
    assert_outcome(
        out,
        (
            "deny",
            "prober.touch",
            f"{world}/rw/touched (a path argument, resolved, is outside the pattern)",
        ),
    )
    assert not (world / "planted-by-touch").exists()
    (world / "rw" / "touched").unlink()


def test_glob_records_every_decision(probe: Probe, world: Path) -> None:
    """fs.glob records the root's decision and one per match (symlinks are not matches)."""
    out = probe("fs_glob", pattern=f"{world}/data/Notes/*")
    notes = world / "data" / "Notes"
    entries = sorted(e for e in notes.iterdir() if not e.is_symlink())
    assert [(d.action, d.target) for d in out.decisions] == [("read", str(notes))] + [
        ("read", str(e)) for e in entries
    ]
    assert all(d.allowed and d.rule == NOTES for d in out.decisions)


def test_guest_made_fifo_is_not_waited_on(probe: Probe, world: Path) -> None:
    """A FIFO planted inside the grant is refused as not a regular file, never blocks the host."""
    made = probe("shell_run", argv=["/usr/bin/mkfifo", f"{world}/rw/pipe"])
    assert made.report["ok"]["exit"] == 0
    out = probe("fs_read", path=f"{world}/rw/pipe")
    assert_outcome(out, ("error", "invalid-argument", "not a regular file"))


class SwapAfterCheck:
    """The real checker, plus a hook that runs right after the decision for one target."""

    def __init__(self, inner: SkillPermissions, target: str, hook: Callable[[], None]):
        self.inner, self.target, self.hook = inner, target, hook

    def check(self, capability: str, action: str, target: str) -> Decision:
        return self.inner.check(capability, action, target)

    def check_path(self, path: str, write: bool = False, *, action: str | None = None) -> Decision:
        decision = self.inner.check_path(path, write, action=action)
        if path == self.target:
            self.hook()
        return decision

    def rule(self, rule_id: str) -> Any:
        return self.inner.rule(rule_id)


@pytest.mark.parametrize(
    ("name", "method", "swap"),
    [
        ("file-read", "fs_read", "file"),
        ("file-write", "fs_write", "file"),
        ("parent-dir-read", "fs_read", "dir"),
        ("parent-dir-write", "fs_write", "dir"),
    ],
)
def test_symlink_planted_after_check(
    prober: Component, tables: Tables, world: Path, name: str, method: str, swap: str
) -> None:
    """A path replaced by a symlink between the check and the open is refused (fs.no-follow)."""
    import json

    from skilld.registry import NullChannel
    from skilld.sandbox import CallContext

    base = world / "rw" / f"race-{name}"
    base.mkdir()
    (base / "f.txt").write_text("mine")
    checked = base / "f.txt"
    if swap == "file":

        def hook() -> None:
            checked.unlink()
            checked.symlink_to(world / "secret.txt")

    else:
        moved = world / "rw" / f"moved-{name}"

        def hook() -> None:
            base.rename(moved)
            base.symlink_to(world / "data" / "notes")
            (world / "data" / "notes" / "f.txt").write_text("lower-f")

    checker = SwapAfterCheck(SkillPermissions.from_tables(tables, "prober"), str(checked), hook)
    ctx = CallContext("prober", checker.inner.limits, NullChannel(), checker=checker)
    args = {"path": str(checked)} | ({"data": "pwned"} if method == "fs_write" else {})
    out = prober.call(method, json.dumps(args), ctx).value
    assert out["error"] == "not-permitted" and out["rule"] == "fs.no-follow", out
    assert "symlink" in out["message"]
    assert (world / "secret.txt").read_text() == "TOP SECRET"
    if swap == "dir":
        assert (world / "data" / "notes" / "f.txt").read_text() == "lower-f"
