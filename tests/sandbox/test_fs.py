"""fs host functions, driven from a real guest: folded paths, opened beneath the grant without
following symlinks, keep the guest inside it."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from skilld.registry import NullChannel
from skilld.sandbox import CallContext, Component, Sandbox
from skilld.sandbox.abi import fs
from skilld.types import Decision, Limits
from support.checkers import TextQuestions


class PrefixChecker(TextQuestions):
    """Allows fs reads under ``ro`` and ``rw`` roots and writes under ``rw`` only."""

    def __init__(self, ro: Path, rw: Path):
        self.ro, self.rw = str(ro), str(rw)

    def check(self, capability: str, action: str, target: str) -> Decision:
        roots = [("rw", self.rw)] + ([("ro", self.ro)] if action == "read" else [])
        for rule, root in roots:
            if capability == "fs" and (target == root or target.startswith(root + "/")):
                return Decision(True, capability, action, target, f"t.fs.{rule}", "under grant")
        return Decision(False, capability, action, target, "default-deny", "no grant covers it")


@pytest.fixture(scope="module")
def prober(sandbox: Sandbox, component_path: Callable[[str], Path]) -> Component:
    """The prober guest, loaded."""
    return sandbox.load(component_path("prober").read_bytes(), name="prober")


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    """ro/ and rw/ grants beside a secret outside them."""
    (tmp_path / "ro").mkdir()
    (tmp_path / "rw").mkdir()
    (tmp_path / "ro" / "hello.txt").write_text("hello")
    (tmp_path / "secret.txt").write_text("TOP SECRET")
    (tmp_path / "ro-evil").mkdir()
    (tmp_path / "ro-evil" / "x.txt").write_text("evil")
    return {"root": tmp_path, "ro": tmp_path / "ro", "rw": tmp_path / "rw"}


def run(prober: Component, tree: dict[str, Path], method: str, **args: Any) -> dict[str, Any]:
    """Call one prober method under the PrefixChecker; return its report."""
    ctx = CallContext(
        "prober", Limits(), NullChannel(), checker=PrefixChecker(tree["ro"], tree["rw"])
    )
    result: dict[str, Any] = prober.call(method, json.dumps(args), ctx).value
    return result


def test_read_inside_grant(prober: Component, tree: dict[str, Path]) -> None:
    """A granted file reads fine."""
    assert run(prober, tree, "fs_read", path=f"{tree['ro']}/hello.txt") == {"ok": "hello"}


@pytest.mark.parametrize(
    "suffix",
    [
        "/../secret.txt",
        "/./../secret.txt",
        "//../secret.txt",
        "/sub/../../secret.txt",
        "/../ro-evil/x.txt",
        "/../../../../../../etc/passwd",
    ],
)
def test_dotdot_escapes_denied(prober: Component, tree: dict[str, Path], suffix: str) -> None:
    """.. sequences that leave the grant are denied with the rule and the path as written."""
    path = f"{tree['ro']}{suffix}"
    out = run(prober, tree, "fs_read", path=path)
    assert out["error"] == "not-permitted" and out["rule"] == "default-deny"
    assert out["message"].startswith(f"fs.read {path} denied")


def test_prefix_sibling_denied(prober: Component, tree: dict[str, Path]) -> None:
    """A sibling directory sharing the grant's name as prefix is not inside it."""
    out = run(prober, tree, "fs_read", path=f"{tree['root']}/ro-evil/x.txt")
    assert out["error"] == "not-permitted"


def test_symlink_escape_denied(prober: Component, tree: dict[str, Path]) -> None:
    """A symlink inside the grant is not followed, and the refusal does not say where it leads."""
    (tree["ro"] / "link.txt").symlink_to(tree["root"] / "secret.txt")
    (tree["ro"] / "up").symlink_to(tree["root"])
    for path in (f"{tree['ro']}/link.txt", f"{tree['ro']}/up/secret.txt"):
        out = run(prober, tree, "fs_read", path=path)
        assert out["error"] == "not-permitted" and out["rule"] == "fs.no-follow", out
        assert "secret" not in out["message"].replace(path, "")
    out = run(prober, tree, "fs_write", path=f"{tree['rw']}/../ro/hello.txt", data="x")
    assert out["error"] == "not-permitted"


def test_symlink_inside_grant_refused(prober: Component, tree: dict[str, Path]) -> None:
    """Even a symlink whose target stays inside the grant is not followed (fs.no-follow)."""
    (tree["ro"] / "alias.txt").symlink_to(tree["ro"] / "hello.txt")
    out = run(prober, tree, "fs_read", path=f"{tree['ro']}/alias.txt")
    assert out["error"] == "not-permitted" and out["rule"] == "fs.no-follow"


def test_write_needs_rw(prober: Component, tree: dict[str, Path]) -> None:
    """Writing under a read-only grant is denied; under rw it lands."""
    assert (
        run(prober, tree, "fs_write", path=f"{tree['ro']}/n.txt", data="x")["error"]
        == "not-permitted"
    )
    assert run(prober, tree, "fs_write", path=f"{tree['rw']}/n.txt", data="x") == {"ok": None}
    assert run(prober, tree, "fs_write", path=f"{tree['rw']}/n.txt", data="y", append=True) == {
        "ok": None
    }
    assert (tree["rw"] / "n.txt").read_text() == "xy"
    assert not (tree["ro"] / "n.txt").exists()


def test_relative_and_nul_paths_invalid(prober: Component, tree: dict[str, Path]) -> None:
    """Relative paths and NUL bytes are invalid arguments, not lookups."""
    assert run(prober, tree, "fs_read", path="etc/passwd")["error"] == "invalid-argument"
    assert (
        run(prober, tree, "fs_read", path=f"{tree['ro']}/a\u0000b")["error"] == "invalid-argument"
    )


def test_trailing_slash_on_file(prober: Component, tree: dict[str, Path]) -> None:
    """A trailing slash does not change what is checked; a file with one is still that file."""
    out = run(prober, tree, "fs_read", path=f"{tree['root']}/secret.txt/")
    assert out["error"] == "not-permitted"


def test_missing_file_not_found(prober: Component, tree: dict[str, Path]) -> None:
    """A missing file inside the grant is not-found."""
    assert run(prober, tree, "fs_read", path=f"{tree['ro']}/nope")["error"] == "not-found"


def test_dirs_list_stat_remove(prober: Component, tree: dict[str, Path]) -> None:
    """mkdir with parents, list, stat and remove work inside rw."""
    rw = tree["rw"]
    assert run(prober, tree, "fs_mkdir", path=f"{rw}/a/b/c") == {"ok": None}
    assert run(prober, tree, "fs_list", path=f"{rw}/a") == {"ok": ["b"]}
    assert run(prober, tree, "fs_stat", path=f"{rw}/a/b")["ok"]["is_dir"] is True
    assert run(prober, tree, "fs_remove", path=f"{rw}/a/b/c") == {"ok": None}
    assert run(prober, tree, "fs_mkdir", path=f"{tree['ro']}/x")["error"] == "not-permitted"
    assert (
        run(prober, tree, "fs_remove", path=f"{tree['ro']}/hello.txt")["error"] == "not-permitted"
    )


def test_glob_filters_by_policy(prober: Component, tree: dict[str, Path]) -> None:
    """glob returns only matches the policy allows, and neither follows nor returns symlinks."""
    (tree["ro"] / "sub").mkdir()
    (tree["ro"] / "sub" / "deep.txt").write_text("d")
    (tree["ro"] / "leak.txt").symlink_to(tree["root"] / "secret.txt")
    out = run(prober, tree, "fs_glob", pattern=f"{tree['ro']}/**/*.txt")
    assert out["ok"] == [f"{tree['ro']}/hello.txt", f"{tree['ro']}/sub/deep.txt"]
    assert run(prober, tree, "fs_glob", pattern=f"{tree['root']}/*")["error"] == "not-permitted"


def test_no_checker_denies(prober: Component, tree: dict[str, Path]) -> None:
    """Without any policy every fs call is denied by default."""
    ctx = CallContext("prober", Limits(), NullChannel())
    out = prober.call("fs_read", json.dumps({"path": f"{tree['ro']}/hello.txt"}), ctx).value
    assert out["error"] == "not-permitted" and out["rule"] == "default-deny"


def test_hardlinked_file_is_never_written(prober: Component, tree: dict[str, Path]) -> None:
    """A second name of a file outside the grants is refused for writing, before any byte
    (truncation included) reaches it; reading it is allowed (docs/policy.md says why)."""
    outside = tree["root"] / "secret.txt"
    os.link(outside, tree["rw"] / "alias.txt")
    for append in (False, True):
        out = run(prober, tree, "fs_write", path=f"{tree['rw']}/alias.txt", data="x", append=append)
        assert out["error"] == "not-permitted" and out["rule"] == "fs.hardlink", out
    assert outside.read_text() == "TOP SECRET"
    assert run(prober, tree, "fs_read", path=f"{tree['rw']}/alias.txt") == {"ok": "TOP SECRET"}


def test_symlink_itself_is_removed_not_its_target(prober: Component, tree: dict[str, Path]) -> None:
    """Removing a symlink in a granted directory removes the link, never what it points to."""
    (tree["rw"] / "link").symlink_to(tree["root"] / "secret.txt")
    assert run(prober, tree, "fs_remove", path=f"{tree['rw']}/link") == {"ok": None}
    assert not (tree["rw"] / "link").is_symlink()
    assert (tree["root"] / "secret.txt").read_text() == "TOP SECRET"


@pytest.mark.parametrize("use_openat2", [True, False])
def test_both_resolvers_agree(
    prober: Component, tree: dict[str, Path], monkeypatch: pytest.MonkeyPatch, use_openat2: bool
) -> None:
    """openat2 and the component walk give the same answers, refusals included."""
    monkeypatch.setattr(fs, "USE_OPENAT2", use_openat2)
    (tree["ro"] / "sub").mkdir()
    (tree["ro"] / "link").symlink_to(tree["ro"] / "hello.txt")
    assert run(prober, tree, "fs_read", path=f"{tree['ro']}/hello.txt") == {"ok": "hello"}
    assert run(prober, tree, "fs_stat", path=f"{tree['ro']}/sub")["ok"]["is_dir"] is True
    assert run(prober, tree, "fs_list", path=f"{tree['ro']}") == {
        "ok": ["hello.txt", "link", "sub"]
    }
    for method in ("fs_read", "fs_stat", "fs_list"):
        out = run(prober, tree, method, path=f"{tree['ro']}/link")
        assert out["rule"] == "fs.no-follow", (method, out)
    assert run(prober, tree, "fs_read", path=f"{tree['ro']}/sub/nope")["error"] == "not-found"
    assert run(prober, tree, "fs_read", path=f"{tree['ro']}/hello.txt/x")["error"] == "not-found"


def test_glob_stops_at_its_visit_cap(
    prober: Component, tree: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A walk that would look at more entries than the cap stops with limit-exceeded."""
    for i in range(30):
        (tree["ro"] / f"f{i}").write_text("x")
    monkeypatch.setattr(fs, "MAX_GLOB_VISITS", 20)
    out = run(prober, tree, "fs_glob", pattern=f"{tree['ro']}/*")
    assert out["error"] == "limit-exceeded" and "20 entries" in out["message"], out
    monkeypatch.setattr(fs, "MAX_GLOB_VISITS", 40)
    assert len(run(prober, tree, "fs_glob", pattern=f"{tree['ro']}/*")["ok"]) == 31


def test_a_file_outgrowing_its_size_is_read_one_byte_past_the_limit() -> None:
    """A regular file with more bytes than its size said (as one growing while it is read;
    /proc/PID/status says 0) is read no further than one byte past the limit."""
    status = f"/proc/{os.getpid()}/status"  # /proc/self is a link, which fs never follows
    target = fs._Target(status, "/")
    assert Path(status).stat().st_size == 0
    assert len(fs.read_regular(target, "status", 16, "read")) == 17


def test_transfer_refuses_a_file_that_grew_past_its_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """transfer's read holds at most one byte past its limit and refuses the file."""
    from skilld.errors import HostCallError
    from skilld.sandbox.abi import transfer

    monkeypatch.setattr(transfer, "MAX_TRANSFER", 16)
    with pytest.raises(HostCallError, match="grew past the transfer limit"):
        transfer.read_file(f"/proc/{os.getpid()}/status", "status")
