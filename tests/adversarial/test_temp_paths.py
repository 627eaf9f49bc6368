"""Declared temporary paths (``Confinement.temp_paths``, a policy's ``scripts.temp_paths``):
made fresh for each call as the skill's own 0700 directory, removed after it, never
through a link, and one call at a time."""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_confined_host import PREFIX, probe

from skilld import confine
from skilld.confine import Confinement
from skilld.confine._identity import SLOT

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plants files as other uids")
SKILL = "tempuser"

SEE = """
import json, os, sys, time
path = sys.argv[1]
st = os.lstat(path)
seen = sorted(os.listdir(path))
start = time.monotonic()
with open(os.path.join(path, "profile"), "w") as f:
    f.write("macro")
os.mkdir(os.path.join(path, "sub"))
os.chmod(os.path.join(path, "sub"), 0)
try:
    open("/tmp/outside-" + os.path.basename(path), "w")
    outside = "DONE"
except OSError as exc:
    outside = exc.errno
time.sleep(float(sys.argv[2]))
print(json.dumps({"uid": st.st_uid, "gid": st.st_gid, "mode": st.st_mode & 0o7777,
                  "me": os.getuid(),
                  "seen": seen, "outside": outside, "start": start, "end": time.monotonic()}))
"""


@pytest.fixture
def temp() -> Iterator[str]:
    """A fresh /tmp name for one test, removed after it whatever happened."""
    path = f"/tmp/skilld-test-{uuid.uuid4().hex[:12]}"
    yield path
    top = Path(path)
    if top.is_symlink() or top.is_file():
        top.unlink()
    elif top.is_dir():
        for entry in sorted(top.rglob("*"), reverse=True):
            if entry.is_dir() and not entry.is_symlink():
                entry.chmod(0o700)
                entry.rmdir()
            else:
                entry.unlink()
        top.rmdir()


def run_see(temp: str, pause: float = 0.0, seconds: float = 20.0) -> confine.ProcessResult:
    """Run :data:`SEE` with ``temp`` declared, pausing ``pause`` seconds inside."""
    code = SEE.replace("sys.argv[1]", repr(temp)).replace("sys.argv[2]", repr(str(pause)))
    walls = Confinement(read_only=(PREFIX,), temp_paths=(temp,), skill=SKILL)
    return probe(code, walls, seconds=seconds)


def test_a_temp_path_is_the_calls_own_directory_and_is_gone_after(temp: str) -> None:
    """During the call the path is a fresh, empty 0700 directory of the call's uid (and
    the skill's group) that it may write beneath (not elsewhere in /tmp); after the call
    it is gone, a subdirectory the command closed (mode 0) included."""
    result = run_see(temp)
    assert result.exit_code == 0, result
    got = json.loads(result.stdout)
    group = confine.uid_for(SKILL)
    assert got["uid"] == got["me"] and group < got["me"] < group + SLOT
    assert got["gid"] == group
    assert got["mode"] == 0o700
    assert got["seen"] == []
    assert got["outside"] == 13  # EACCES: Landlock, the rest of /tmp is not granted
    assert not os.path.lexists(temp)


def test_a_temp_path_is_removed_after_a_timeout(temp: str) -> None:
    """A command killed at its deadline leaves no temporary path behind."""
    result = run_see(temp, pause=60, seconds=3)
    assert result.timed_out, result
    assert not os.path.lexists(temp)


def test_a_link_planted_at_the_path_fails_closed_untouched(temp: str, tmp_path: Path) -> None:
    """A symlink planted at the path (by another uid, towards a directory of root's) makes
    the call fail before anything runs; the link and its target are left as they were."""
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep").write_text("root's")
    Path(temp).symlink_to(target)
    os.lchown(temp, 4242, 4242)
    with pytest.raises(
        confine.ConfinementUnavailable, match="is a symbolic link of uid 4242"
    ) as err:
        run_see(temp)
    assert err.value.feature == "temp-paths"
    assert Path(temp).readlink() == target
    assert os.lstat(temp).st_uid == 4242
    assert sorted(p.name for p in target.iterdir()) == ["keep"]
    assert target.stat().st_uid == 0
    assert oct(target.stat().st_mode & 0o777) == oct(0o755)


def test_another_uids_directory_at_the_path_fails_closed_untouched(temp: str) -> None:
    """A directory another uid made at the path (with its own files) refuses the call;
    nothing in it is changed or handed over."""
    Path(temp).mkdir()
    Path(temp).chmod(0o777)
    os.chown(temp, 4242, 4242)
    (Path(temp) / "planted").write_text("macro of someone else")
    os.chown(Path(temp) / "planted", 4242, 4242)
    with pytest.raises(confine.ConfinementUnavailable, match="belongs to uid 4242"):
        run_see(temp)
    st = os.lstat(temp)
    assert (st.st_uid, st.st_mode & 0o7777) == (4242, 0o777)
    assert (Path(temp) / "planted").read_text() == "macro of someone else"


@pytest.mark.parametrize("slot_uid", [0, 5])
def test_a_leftover_of_the_skill_is_emptied_before_the_call(temp: str, slot_uid: int) -> None:
    """The skill's own directory (of its number, or of a uid of an earlier call, in its
    group) left by a launcher that died is emptied, then used."""
    group = confine.uid_for(SKILL)
    Path(temp).mkdir(0o755)
    os.chown(temp, group + slot_uid, group)
    (Path(temp) / "stale").write_text("last call's profile")
    result = run_see(temp)
    assert result.exit_code == 0, result
    assert json.loads(result.stdout)["seen"] == []
    assert not os.path.lexists(temp)


def test_a_path_held_by_another_process_is_refused_busy(temp: str) -> None:
    """A call of another skilld on this host holds the path (its lock): this call is
    refused as busy and leaves the directory alone."""
    uid = confine.uid_for(SKILL)
    Path(temp).mkdir(0o700)
    os.chown(temp, uid, uid)
    (Path(temp) / "theirs").write_text("in use")
    fd = os.open(temp, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(confine.ConfinementUnavailable, match="in use by another call"):
            run_see(temp)
    finally:
        os.close(fd)
    assert (Path(temp) / "theirs").read_text() == "in use"


def test_calls_sharing_a_temp_path_never_overlap(temp: str) -> None:
    """Three calls at once: each waits for the one before, sees an empty directory, and
    their runs (monotonic clock inside the commands) do not overlap."""
    results: list[confine.ProcessResult] = []

    def one() -> None:
        results.append(run_see(temp, pause=0.4, seconds=30))

    threads = [threading.Thread(target=one) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3
    assert all(r.exit_code == 0 for r in results), results
    runs = sorted((json.loads(r.stdout)["start"], json.loads(r.stdout)["end"]) for r in results)
    assert all(json.loads(r.stdout)["seen"] == [] for r in results)
    for (_, end), (start, _) in itertools.pairwise(runs):
        assert end <= start, runs
    assert not os.path.lexists(temp)


def test_a_call_waiting_for_the_path_ends_at_its_deadline_unstarted(temp: str) -> None:
    """While one call holds the path, another whose deadline passes while it waits ends
    as a timeout without having run."""
    first: list[confine.ProcessResult] = []
    holder = threading.Thread(target=lambda: first.append(run_see(temp, pause=3, seconds=30)))
    holder.start()
    try:
        # The first call holds the path once its directory exists.
        until = time.monotonic() + 20
        while not os.path.lexists(temp) and time.monotonic() < until:
            time.sleep(0.01)
        second = run_see(temp, seconds=0.5)
    finally:
        holder.join()
    assert second.timed_out and second.exit_code is None and second.stdout == b""
    assert first[0].exit_code == 0, first


DEEP = """
import os, sys
os.chdir(sys.argv[1])
os.symlink(sys.argv[2], "link")
os.symlink(sys.argv[2] + "/keep", "file-link")
for i in range(300):
    os.mkdir("d")
    os.chdir("d")
    open("f", "w").close()
    if i % 50 == 0:
        os.chmod(".", 0o300)
print("deep")
"""


def test_a_deep_tree_with_links_is_removed_without_following_them(
    temp: str, tmp_path: Path
) -> None:
    """A command leaves 300 nested directories (some closed to their owner) and links
    to a directory of root's: all is removed after the call, the links' targets are
    untouched."""
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep").write_text("root's")
    code = DEEP.replace("sys.argv[1]", repr(temp)).replace("sys.argv[2]", repr(str(target)))
    walls = Confinement(read_only=(PREFIX,), temp_paths=(temp,), skill=SKILL)
    result = probe(code, walls)
    assert result.stdout == b"deep\n", result
    assert not os.path.lexists(temp)
    assert sorted(p.name for p in target.iterdir()) == ["keep"]
    assert (target / "keep").read_text() == "root's"


ESCAPE = """
import json, os, socket
path = TEMP
name = os.path.basename(path)
with open(os.path.join(path, "secret"), "w") as f:
    f.write("macro of this call")
tries = {
    "rename-away": lambda: os.rename(path, "/tmp/kept-" + name),
    "mkdir-beside": lambda: os.mkdir("/tmp/beside-" + name),
    "file-beside": lambda: open("/tmp/file-" + name, "w").close(),
    "link-beside": lambda: os.link(os.path.join(path, "secret"), "/tmp/link-" + name),
    "symlink-beside": lambda: os.symlink(path, "/tmp/sym-" + name),
    "fifo-beside": lambda: os.mkfifo("/tmp/fifo-" + name),
}
seen = {}
for key, act in tries.items():
    try:
        act()
        seen[key] = "DONE"
    except OSError as exc:
        seen[key] = exc.errno
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind("/tmp/sock-" + name)
seen["socket-beside"] = "DONE"
print(json.dumps(seen))
"""


def test_a_calls_data_cannot_outlive_it_beside_its_temp_path(temp: str) -> None:
    """A command with a declared temp path and /tmp as a socket directory (LibreOffice's
    walls) tries to keep this call's data for the next one: renaming the path away,
    making a directory, file, hard link, symbolic link or FIFO beside it: each is refused;
    the socket it may make is swept; after the call nothing of it is left in /tmp."""
    name = Path(temp).name
    code = ESCAPE.replace("TEMP", repr(temp))
    walls = Confinement(read_only=(PREFIX,), temp_paths=(temp,), socket_dirs=("/tmp",), skill=SKILL)
    result = probe(code, walls, seconds=20)
    assert result.exit_code == 0, result
    seen = json.loads(result.stdout)
    assert seen.pop("socket-beside") == "DONE"
    assert all(v != "DONE" for v in seen.values()), seen
    left = [p.name for p in Path("/tmp").iterdir() if name in p.name]
    assert left == [], left
