"""What a script leaves in its workspace is hostile input (issue 27, item 4).

Trees built here as a script would leave them (names that are not UTF-8, depths past
any recursion or descriptor limit, sparse files of any apparent size, directories
closed with mode 0): collecting reads nothing past its budget and sends no name that is
not UTF-8; removal and the launcher's hand-back reach every level; a leftover never
stops a start.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skilld import paths
from skilld.agentskills import _collect
from skilld.agentskills._kept import KeptOutputs
from skilld.audit import MemorySink
from skilld.confine import _launcher
from skilld.types import Caller

ALICE = Caller.token("alice")

# A name a script may give an entry: any bytes but "/" and NUL, not "." or "..".
NAMES = st.binary(min_size=1, max_size=12).filter(
    lambda b: b"/" not in b and b"\0" not in b and b not in (b".", b"..")
)


def _deep(top: Path, depth: int, *, closed: bool = False) -> Path:
    """A chain of ``depth`` directories under ``top`` made by descriptor (no path is
    ever longer than one name), a file at the bottom; each directory closed (mode 0)
    when ``closed``. The bottom file's relative path."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    made: list[tuple[int, str]] = []
    try:
        for _ in range(depth):
            os.mkdir("d", 0o700, dir_fd=fd)
            sub = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            made.append((fd, "d"))
            fd = sub
        leaf = os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)
        os.write(leaf, b"the bottom")
        os.close(leaf)
    finally:
        os.close(fd)
    if closed:
        # Close from the bottom up, by descriptor, as a script could.
        for parent, name in reversed(made):
            os.chmod(name, 0, dir_fd=parent)
    for parent, _name in made[1:]:
        os.close(parent)
    return Path(*(["d"] * depth), "bottom.txt")


def _store(tmp_path: Path) -> KeptOutputs:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return KeptOutputs(work, caller_bytes=256 << 20, total_bytes=1 << 30)


def _bottom(top: Path) -> os.stat_result:
    """The bottom file's status, reached by descriptor (its path is too long to name)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return next(s.st for s in paths.walk_beneath(fd) if s.name == "bottom.txt")
    finally:
        os.close(fd)


def test_a_tree_deeper_than_any_recursion_is_walked_removed_and_handed_back(
    tmp_path: Path,
) -> None:
    """3,000 levels (past Python's recursion limit and far past 64, where the hand-back
    stopped): the walk reaches the bottom file, the launcher hands every level to
    another uid and back, and removal leaves nothing."""
    top = tmp_path / "ws"
    top.mkdir()
    try:
        _deep(top, 3000)
        fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
        try:
            found = [s for s in paths.walk_beneath(fd) if s.name == "bottom.txt"]
        finally:
            os.close(fd)
        assert [len(s.parts) for s in found] == [3000]
        if os.geteuid() == 0:
            _launcher.hand_over(str(top), 0, 4242, owner_view=False)
            assert _bottom(top).st_uid == 4242
            _launcher.hand_over(str(top), 4242, 0, owner_view=False)
            assert _bottom(top).st_uid == 0
    finally:
        assert paths.remove_tree(top)
    assert not top.exists()


def test_the_hand_back_reaches_past_depth_64(tmp_path: Path) -> None:
    """The attack's tree, 70 levels: before, levels past 64 stayed the script's uid and
    the call failed with [internal] PermissionError; now every level is handed back."""
    if os.geteuid() != 0:
        pytest.skip("handing a tree to another uid needs root")
    top = tmp_path / "ws"
    top.mkdir()
    try:
        _deep(top, 70)
        _launcher.hand_over(str(top), 0, 4242, owner_view=False)
        assert _bottom(top).st_uid == 4242  # the control: the script's before
        _launcher.hand_over(str(top), 4242, 0, owner_view=False)
        assert _bottom(top).st_uid == 0
    finally:
        assert paths.remove_tree(top)


def test_removal_opens_closed_directories_at_every_depth(tmp_path: Path) -> None:
    """A tree of 200 levels each closed (mode 0), as a script can leave it: removed."""
    top = tmp_path / "ws"
    top.mkdir()
    _deep(top, 200, closed=True)
    assert paths.remove_tree(top)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    tree=st.lists(
        st.tuples(st.lists(NAMES, min_size=1, max_size=4), st.binary(max_size=64)),
        min_size=1,
        max_size=12,
    )
)
def test_hostile_names_are_never_sent_and_every_tree_is_removed(
    tmp_path_factory: pytest.TempPathFactory, tree: list[tuple[list[bytes], bytes]]
) -> None:
    """Any tree of any names: collecting never raises; every name it sends is UTF-8
    (JSON without surrogates), every name that is not is refused and listed escaped;
    what it embeds stays within its budget; the tree is removed whole."""
    root = tmp_path_factory.mktemp("hostile")
    ws = root / "ws"
    ws.mkdir()
    for parts, data in tree:
        leaf = ws.joinpath(*(os.fsdecode(p) for p in parts))
        try:
            leaf.parent.mkdir(parents=True, exist_ok=True)
            leaf.write_bytes(data)
        except (FileExistsError, NotADirectoryError, IsADirectoryError):
            continue  # a name taken by another kind of entry: the tree is as it is
    files = {
        os.fsencode(p.relative_to(ws)) for p in ws.rglob("*") if p.is_file() and not p.is_symlink()
    }
    bad = {f for f in files if not _utf8(f)}
    store = _store(root)
    reservation = store.reserve(ALICE)
    got = _collect.collect(ws, "hostile", {}, store, reservation)
    answer = {
        "files": [b.uri for b in got.embedded],
        "kept": [s.rel for s in got.spooled],
        "refused": got.refused,
    }
    json.dumps(answer, ensure_ascii=False).encode("utf-8")  # no surrogate can pass
    sent = {b.uri.removeprefix("workspace://hostile/") for b in got.embedded}
    sent |= {s.rel for s in got.spooled}
    assert sent == {f.decode("utf-8") for f in files - bad}
    assert len(got.refused) == min(len(bad), _collect.MAX_REFUSED_LISTED)
    assert got.omitted == len(bad)
    for name in got.refused:
        assert name.encode("utf-8")
    assert sum(len(b.text or b.data or b"") for b in got.embedded) <= _collect.MAX_EMBEDDED_BYTES
    store.release(reservation)
    assert paths.remove_tree(ws)


def _utf8(name: bytes) -> bool:
    try:
        name.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_sparse_files_at_the_size_cap_are_budgeted_by_size_not_blocks(tmp_path: Path) -> None:
    """40 sparse files of exactly MAX_KEPT_FILE (no blocks at all, so a block cap lets
    them through): collecting keeps as many as the caller's room holds by size, copied
    with their holes (the store uses no more blocks than they do), counts the rest, and
    reads none of them into memory."""
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(40):
        with (ws / f"big{i:02}.bin").open("wb") as fh:
            fh.truncate(_collect.MAX_KEPT_FILE)
    assert sum(p.stat().st_blocks for p in ws.iterdir()) == 0  # the control: sparse
    store = KeptOutputs(tmp_path, caller_bytes=4 * _collect.MAX_KEPT_FILE, total_bytes=1 << 40)
    reservation = store.reserve(ALICE)
    got = _collect.collect(ws, "hostile", {}, store, reservation)
    assert [s.size for s in got.spooled] == [_collect.MAX_KEPT_FILE] * 4
    assert got.omitted == 36
    assert got.embedded == []
    copies = [store.directory / s.file for s in got.spooled]
    assert all(p.stat().st_size == _collect.MAX_KEPT_FILE for p in copies)
    assert sum(p.stat().st_blocks for p in copies) == 0
    kept = store.commit(reservation, "hostile", got.spooled)
    assert len(kept) == 4
    assert store.used(ALICE) == 4 * _collect.MAX_KEPT_FILE


def test_a_file_is_read_no_further_than_the_size_it_was_budgeted_by(tmp_path: Path) -> None:
    """A file whose size is within the embedded budget is read up to that size only, and
    an unchanged input file (same size, same digest) does not come back."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "given.txt").write_text("as given")
    (ws / "new.txt").write_text("new")
    store = _store(tmp_path)
    reservation = store.reserve(ALICE)
    given = {"given.txt": (8, hashlib.sha256(b"as given").digest()), "gone.txt": (1, b"")}
    got = _collect.collect(ws, "s", given, store, reservation)
    assert [b.uri for b in got.embedded] == ["workspace://s/new.txt"]
    assert got.removed == ["gone.txt"]


def test_a_leftover_that_cannot_be_removed_never_stops_a_start(tmp_path: Path) -> None:
    """A dead server's call directory with something mounted in it (rmdir gives EBUSY,
    as a tree handed back short did): the start sweeps what it can, does not raise, logs
    it and records it in the audit log; a second start does the same."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    from skilld.agentskills._quota import mount_tmpfs

    state = tmp_path / "state"
    work = paths.make_work_dir(state)
    dead = work / "ws-999999999-hostile-x"
    (dead / "inner").mkdir(parents=True)
    (work / "ws-999999998-gone-y").mkdir()
    if not mount_tmpfs(dead / "inner", 1 << 20):
        pytest.skip("this process may not mount a tmpfs")
    try:
        for _ in range(2):
            sink = MemorySink()
            assert paths.make_work_dir(state, audit=sink.emit) == work
            assert [r["event"] for r in sink.records] == ["work-leftover"]
            assert sink.records[0]["path"] == str(dead)
            assert not (work / "ws-999999998-gone-y").exists()
    finally:
        import ctypes

        ctypes.CDLL(None).umount2(os.fsencode(dead / "inner"), 2)
    assert paths.remove_tree(dead)


def test_the_walk_refuses_a_tree_moved_under_it(tmp_path: Path) -> None:
    """A directory's ``..`` that is no longer the directory it was entered from stops
    the walk with an error instead of walking somewhere else."""
    top = tmp_path / "ws"
    (top / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        walk = paths.walk_beneath(fd)
        steps = [next(walk) for _ in range(3)]  # a, a/b, a/b/c: the walk is inside b
        assert [s.name for s in steps] == ["a", "b", "c"]
        (top / "a" / "b").rename(tmp_path / "elsewhere" / "b")
        with pytest.raises(OSError, match="moved while it was walked"):
            list(walk)
    finally:
        os.close(fd)
