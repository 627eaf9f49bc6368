"""A confined script attacks the host itself, with real processes, files and sockets.

What Landlock does not govern (file metadata, ``connect`` to pathname unix sockets,
keyrings) must still be refused: the script runs as its skill's own uid (never root,
never skilld's), which owns nothing outside its grants, and the seccomp layer refuses
what that leaves. A daemon that double-forks and calls ``setsid`` ends with the call;
a tree of processes each under its memory limit stays bounded; the next call answers.
The same attacks run as an unprivileged user with every capability dropped (no
separate identity: the shared mode), and with namespaces forced off (Docker's default).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from skilld import confine
from skilld.confine import Confinement, ResourceLimits
from skilld.confine._identity import SLOT
from support.grants import give_grant

ROOT = Path(__file__).resolve().parents[2]


def _reachable(path: str) -> bool:
    real = Path(os.path.realpath(path))
    return all(p.stat().st_mode & 0o001 for p in (real, *real.parents))


# The interpreter of the probes: one a skill's uid can execute (see tests/confine).
PYTHON = sys.executable if _reachable(sys.executable) else "/usr/bin/python3"
PREFIX = str(Path(os.path.realpath(PYTHON)).parents[1])
SKILL = "attacker"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sets files up as root")


def probe(code: str, confinement: Confinement, seconds: float = 20.0) -> confine.ProcessResult:
    """Run ``code`` with the probe interpreter, confined as ``confinement`` says."""
    return confine.run(
        [PYTHON, "-I", "-S", "-c", code],
        confinement=confinement,
        deadline=time.monotonic() + seconds,
        env={"PATH": "/usr/bin:/bin"},
    )


def state_of(path: Path) -> tuple[int, int, int, int, bytes, list[str]]:
    """Mode, owner, group, mtime, content and xattr names: what an attack would change."""
    info = path.lstat()
    body = path.read_bytes() if stat.S_ISREG(info.st_mode) else b""
    return (info.st_mode, info.st_uid, info.st_gid, info.st_mtime_ns, body, os.listxattr(path))


@pytest.fixture
def host(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Root's files beside the grants: a setuid-able copy of ``id``, a 0600 key, a bundle
    lock and an audit log; 0600/0660/0666 pathname sockets; ro/ and rw/ grants (rw/
    owned by the skill's uid, as the operator sets it up)."""
    root = Path(os.path.realpath(tmp_path))
    files = {
        "id": (shutil.copy2("/usr/bin/id", root / "id"), 0o755),
        "key": (root / "key.pem", 0o600),
        "lock": (root / "bundle.lock", 0o644),
        "audit": (root / "audit.jsonl", 0o640),
    }
    for name, (path, mode) in files.items():
        target = Path(path)
        if name != "id":
            target.write_text(f"{name} secret\n")
        target.chmod(mode)
    socks = []
    for name, mode, gid in (("root", 0o600, 0), ("group", 0o660, 4242), ("world", 0o666, 0)):
        path = root / f"{name}.sock"
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(str(path))
        srv.listen(4)
        os.chown(path, 0, gid)
        path.chmod(mode)
        socks.append(srv)
    (root / "ro").mkdir()
    (root / "rw").mkdir()
    give_grant([root / "rw"], SKILL)
    try:
        yield {
            "root": root,
            "files": {n: Path(p) for n, (p, _) in files.items()},
            "walls": Confinement(
                read_only=(str(root / "ro"), PREFIX),
                read_write=(str(root / "rw"),),
                skill=SKILL,
            ),
        }
    finally:
        for srv in socks:
            srv.close()


METADATA_ATTACK = """
import json, os, sys
out = {}
for path in sys.argv[1:]:
    for name, act in (
        ("chmod", lambda p: os.chmod(p, 0o4777)),
        ("chown", lambda p: os.chown(p, os.getuid(), os.getgid())),
        ("utime", lambda p: os.utime(p, (0, 0))),
        ("setxattr", lambda p: os.setxattr(p, "user.pwned", b"1")),
        ("truncate", lambda p: os.truncate(p, 0)),
    ):
        try:
            act(path)
            out[path + " " + name] = "DONE"
        except OSError as exc:
            out[path + " " + name] = exc.errno
print(json.dumps(out))
"""


def metadata_attack(paths: list[Path], walls: Confinement) -> dict[str, Any]:
    """Try chmod/chown/utime/setxattr/truncate on each path; errno or DONE for each."""
    result = confine.run(
        [PYTHON, "-I", "-S", "-c", METADATA_ATTACK, *map(str, paths)],
        confinement=walls,
        deadline=time.monotonic() + 20,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert result.exit_code == 0, result.stderr
    answers: dict[str, Any] = json.loads(result.stdout)
    return answers


def test_root_owned_files_keep_their_modes_owners_and_times(host: dict[str, Any]) -> None:
    """As root, skilld's script cannot make a copy of id setuid, a key world-readable,
    the lock or the audit log writable, nor change owners, times or xattrs: every
    attempt fails and every file is byte-for-byte and mode-for-mode unchanged."""
    files = list(host["files"].values())
    before = {p: state_of(p) for p in files}
    answers = metadata_attack(files, host["walls"])
    assert answers and all(v != "DONE" for v in answers.values()), answers
    assert {p: state_of(p) for p in files} == before
    assert probe("print('next')", host["walls"]).stdout == b"next\n"


def test_the_script_is_neither_root_nor_skillds_uid(host: dict[str, Any]) -> None:
    """The script's real, effective and saved uids are its call's own (one of its skill's
    slot, never the skill's number), its gids the skill's group, with no other group."""
    result = probe(
        "import os; print(os.getresuid(), os.getresgid(), os.getgroups())", host["walls"]
    )
    group = confine.uid_for(SKILL)
    uids, gids, groups = result.stdout.decode().split("\n")[0].split(") ")
    uid = int(uids.strip("(").split(",")[0])
    assert uids + ")" == str((uid,) * 3)
    assert gids + ")" == str((group,) * 3) and groups == "[]"
    assert group < uid < group + SLOT
    assert uid not in (0, os.getuid())


CONNECT = """
import socket, sys
for path in sys.argv[1:]:
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        print(path, "CONNECTED")
    except OSError as exc:
        print(path, exc.errno)
"""


def test_pathname_sockets_outside_the_grants_are_refused(host: dict[str, Any]) -> None:
    """connect() to a 0600 root, a 0660 group and a 0666 world socket is refused: the
    modes refuse the first two to the skill's uid, the seccomp layer refuses every
    AF_UNIX socket without a socket grant (then all three twice over)."""
    paths = [str(host["root"] / f"{n}.sock") for n in ("root", "group", "world")]
    result = confine.run(
        [PYTHON, "-I", "-S", "-c", CONNECT, *paths],
        confinement=host["walls"],
        deadline=time.monotonic() + 20,
        env={},
    )
    lines = dict(line.rsplit(" ", 1) for line in result.stdout.decode().splitlines())
    assert set(lines) == set(paths), result.stderr
    assert lines[paths[0]] != "CONNECTED"
    assert lines[paths[1]] != "CONNECTED"
    if not confine.profile().seccomp:
        pytest.skip("a world-writable socket is refused by the seccomp layer, absent here")
    assert all(v != "CONNECTED" for v in lines.values()), lines


DAEMON = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sleep", ["/bin/sleep", "60", sys.argv[1]])
    os._exit(0)
print("parent done", flush=True)
"""


def _live(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if marker.encode() in cmd and state != "Z":
                found.append(int(entry.name))
    return found


def test_a_double_forked_setsid_daemon_is_gone_after_the_call(host: dict[str, Any]) -> None:
    """A script's daemon (fork, setsid, fork, exec) dies when the script ends: the
    subreaper adopts it and SIGKILLs it before the call reports."""
    marker = f"4242{os.getpid()}"
    walls = Confinement(
        read_only=(PREFIX,), executables=("/bin/sleep", "/usr/bin/sleep"), skill=SKILL
    )
    result = confine.run(
        [PYTHON, "-I", "-S", "-c", DAEMON, marker],
        confinement=walls,
        deadline=time.monotonic() + 20,
        env={},
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout == b"parent done\n"
    assert _live(marker) == []
    assert probe("print('next')", host["walls"]).stdout == b"next\n"


TREE = """
import os, sys
made = 0
hold, keep = os.pipe()  # the children wait on it until this process ends
for _ in range(int(sys.argv[1])):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        block = bytearray(96 << 20)  # under each process's address-space limit
        os.read(hold, 1)
        os._exit(0)
    made += 1
print(made, flush=True)
"""


def test_a_tree_of_processes_each_under_its_memory_limit_is_bounded(
    host: dict[str, Any],
) -> None:
    """Forking many children that each stay under the address-space limit stops at the
    process limit: the tree's memory is bounded by processes times address space; the
    tree is gone after the call and the next call answers."""
    walls = Confinement(
        read_only=(PREFIX,),
        skill="tree-skill",
        limits=ResourceLimits(address_space=512 << 20, processes=6),
    )
    result = confine.run(
        [PYTHON, "-I", "-S", "-c", TREE, "40"],
        confinement=walls,
        deadline=time.monotonic() + 20,
        env={},
        stdin=b"",
    )
    assert result.exit_code == 0, result.stderr
    made = int(result.stdout)
    assert 1 <= made < 6
    assert probe("print('next')", host["walls"]).stdout == b"next\n"


KEYRING = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
# request_key(type, description, callout, destination): search the session, process,
# thread and user keyrings the script has.
found = libc.syscall(249, b"user", sys.argv[1].encode(), None, 0)
print("FOUND" if found > 0 else ctypes.get_errno())
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="syscall numbers of x86_64")
def test_the_hosts_keyrings_are_out_of_reach(host: dict[str, Any]) -> None:
    """A key root put in its session and user keyrings is not found by the script: it
    has a fresh session keyring and its own uid's user keyring (and the seccomp layer
    refuses the keyring calls)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    name = f"skilld-test-{os.getpid()}"
    ids = []
    for ring in (-3, -4):  # KEY_SPEC_SESSION_KEYRING, KEY_SPEC_USER_KEYRING
        key = libc.syscall(248, b"user", name.encode(), b"hunter2", 7, ring)
        if key < 0:
            pytest.skip(f"add_key refused here (errno {ctypes.get_errno()})")
        ids.append(key)
    try:
        result = confine.run(
            [PYTHON, "-I", "-S", "-c", KEYRING, name],
            confinement=host["walls"],
            deadline=time.monotonic() + 20,
            env={},
        )
        assert result.exit_code == 0, result.stderr
        assert result.stdout.strip() != b"FOUND"
    finally:
        for key in ids:
            libc.syscall(250, 3, key)  # KEYCTL_REVOKE


def test_without_namespaces_commands_are_still_confined(
    host: dict[str, Any], monkeypatch: pytest.MonkeyPatch, listener: int
) -> None:
    """With namespaces forced off (as under Docker's default seccomp profile), a command
    still runs confined: no TCP without a grant (Landlock), files and modes unchanged;
    where no seccomp layer exists either it is refused, naming seccomp."""
    monkeypatch.setenv("SKILLD_CONFINE_NAMESPACES", "0")
    code = (
        "import socket\ns = socket.socket()\n"
        f"try:\n s.connect(('127.0.0.1', {listener})); print('CONNECTED')\n"
        "except OSError as exc: print(exc.errno)"
    )
    if not confine.profile().seccomp:
        with pytest.raises(confine.ConfinementUnavailable) as caught:
            probe(code, host["walls"])
        assert caught.value.feature == "seccomp"
        return
    assert confine.profile().namespaces == ()
    result = probe(code, host["walls"])
    assert result.stdout.strip() not in (b"CONNECTED", b""), result.stderr
    files = list(host["files"].values())
    before = {p: state_of(p) for p in files}
    assert all(v != "DONE" for v in metadata_attack(files, host["walls"]).values())
    assert {p: state_of(p) for p in files} == before


# -- as an unprivileged user with every capability dropped ------------------------

SHARED = """
import json, os, sys, time
sys.path[:0] = sys.argv.pop(1).split(":")
from skilld import confine
from skilld.confine import Confinement
prof = confine.profile()
out = {"profile": prof.describe(), "identity": prof.identity}
code, python, prefix = sys.argv[1:4]
try:
    r = confine.run(
        [python, "-I", "-S", "-c", code, *sys.argv[4:]],
        confinement=Confinement(read_only=(prefix,)),
        deadline=time.monotonic() + 20,
        env={},
    )
    out["stdout"] = r.stdout.decode()
    out["stderr"] = r.stderr.decode()
except confine.ConfinementUnavailable as exc:
    out["refused"] = exc.feature
print(json.dumps(out))
"""


def test_as_an_unprivileged_user_skillds_own_files_keep_their_metadata(
    tmp_path: Path,
) -> None:
    """Run by a user with no capability (Kubernetes' restricted profile), the script
    shares skilld's uid: the seccomp layer refuses chmod/chown/utime/setxattr on files
    that uid owns (its state, audit log, bundle); without seccomp nothing runs."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    state = Path(os.path.realpath(tmp_path)) / "state"
    state.mkdir()
    for name in ("audit.jsonl", "bundle.lock", "key.pem"):
        (state / name).write_text(name)
        (state / name).chmod(0o600)
    for path in (state, *state.iterdir()):
        os.chown(path, 65534, 65534)
    files = sorted(state.iterdir())
    before = {p: state_of(p) for p in files}
    paths = ":".join([str(ROOT / "src"), *(p for p in sys.path if p.endswith("site-packages"))])
    argv = [
        "setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
        "--inh-caps=-all", "--bounding-set=-all",
        PYTHON, "-I", "-c", SHARED, paths, METADATA_ATTACK, PYTHON, PREFIX, *map(str, files),
    ]  # fmt: skip
    env = {"PATH": "/usr/bin:/bin", "SKILLD_CACHE": "/nonexistent"}
    done = subprocess.run(argv, capture_output=True, env=env, timeout=120, check=False, cwd="/")
    assert done.returncode == 0, done.stderr.decode()
    out = json.loads(done.stdout)
    assert out["identity"] == "shared", out
    if "refused" in out:
        assert out["refused"] == "seccomp", out
    else:
        answers = json.loads(out["stdout"])
        assert answers and all(v != "DONE" for v in answers.values()), answers
    assert {p: state_of(p) for p in files} == before


# -- the image's mode: started as root with SKILLD_RUN_AS ---------------------------

RUN_AS = """
import json, os, shutil, sys, tempfile, time
sys.path[:0] = sys.argv.pop(1).split(":")
from skilld import confine
from skilld.confine import Confinement
python, prefix = sys.argv[1:3]
confine.start_from_env()
def caps(pid):
    with open(f"/proc/{pid}/status") as f:
        return {k: v.strip() for k, v in (l.split(":", 1) for l in f if ":" in l)}
me, launcher = caps("self"), caps(confine.start().proc.pid)
work = tempfile.mkdtemp(prefix="skilld-ws-")
with open(os.path.join(work, "input.txt"), "w") as f:
    f.write("from the server")
code = (
    "import os\\n"
    "print(open('input.txt').read(), os.getuid())\\n"
    "os.mkdir('out', 0o700)\\n"
    "fd = os.open('out/result', os.O_WRONLY | os.O_CREAT, 0o600)\\n"
    "os.write(fd, b'made by the script')\\n"
    "os.chmod('out', 0)\\n"
)
out = {
    "server": [me["Uid"], me["CapEff"], me["CapBnd"]],
    "launcher": [launcher["Uid"], launcher["CapEff"], launcher["CapBnd"]],
    "skill_uid": confine.uid_for("s"),
}
try:
    r = confine.run(
        [python, "-I", "-S", "-c", code],
        confinement=Confinement(
            read_only=(prefix,), read_write=(work,), workspace=work, skill="s"
        ),
        deadline=time.monotonic() + 20, cwd=work, env={},
    )
except confine.ConfinementUnavailable as exc:
    out["refused"] = exc.feature
else:
    os.chmod(os.path.join(work, "out"), 0o700)
    out["result"] = open(os.path.join(work, "out", "result")).read()
    out["owners"] = sorted(
        os.stat(os.path.join(work, p)).st_uid for p in ("input.txt", "out", "out/result")
    )
    out["script"] = r.stdout.decode()
shutil.rmtree(work)
print(json.dumps(out))
"""


def test_run_as_keeps_only_the_launcher_privileged_and_hands_the_workspace_back() -> None:
    """Started as root with SKILLD_RUN_AS=10001 (the image): the server becomes 10001
    with no capability, the launcher 10001 with CAP_CHOWN/SETGID/SETUID only and an empty
    bounding set (it never execs; so no command's process has one to drop); a script
    runs as its skill's uid in a workspace handed to it, and everything it made there
    (even in a directory it closed with mode 0) is the server's again afterwards."""
    paths = ":".join([str(ROOT / "src"), *(p for p in sys.path if p.endswith("site-packages"))])
    done = subprocess.run(
        [PYTHON, "-I", "-c", RUN_AS, paths, PYTHON, PREFIX],
        capture_output=True,
        env={"PATH": "/usr/bin:/bin", "SKILLD_RUN_AS": "10001", "TMPDIR": "/tmp"},
        timeout=120,
        check=False,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr.decode()
    out = json.loads(done.stdout)
    uid = "10001\t10001\t10001\t10001"
    assert out["server"] == [uid, "0000000000000000", "0000000000000000"], out
    launcher_caps = (1 << 0) | (1 << 6) | (1 << 7)
    assert out["launcher"] == [uid, f"{launcher_caps:016x}", "0000000000000000"], out
    if "refused" in out:
        # No namespace can be made without CAP_SYS_ADMIN: the seccomp layer is needed.
        assert out["refused"] == "seccomp", out
        assert not confine.profile().seccomp
        return
    script, call_uid = out["script"].rsplit(" ", 1)
    assert script == "from the server", out
    assert out["skill_uid"] < int(call_uid) < out["skill_uid"] + SLOT, out
    assert out["result"] == "made by the script"
    assert out["owners"] == [10001] * 3, out


LOCAL_PIPE = """
import errno, socket, sys, time
here, there = sys.argv[1], sys.argv[2]
def act(name, fn):
    try:
        fn()
        print(name, "ok", flush=True)
    except OSError as exc:
        print(name, errno.errorcode.get(exc.errno, exc.errno), flush=True)
own = socket.socket(socket.AF_UNIX)
act("bind", lambda: own.bind(here + "/pipe"))
act("listen", lambda: own.listen(1))
act("connect-host", lambda: socket.socket(socket.AF_UNIX).connect(there))
act("file", lambda: open(here + "/file", "w").close())
act("unlink-root", lambda: __import__("os").unlink(here + "/root.sock"))
left = socket.socket(socket.AF_UNIX)
act("left", lambda: left.bind(here + "/left.sock"))
left.listen(1)
time.sleep(60)
"""


def test_a_socket_directory_gives_sockets_only_and_is_swept(
    host: dict[str, Any], tmp_path: Path
) -> None:
    """Given a socket directory (LibreOffice's /tmp), the skill's uid binds and listens
    there, makes no other file, removes nothing it does not own, connects nowhere (a
    0666 socket outside included); killed at the deadline, the socket it left is removed
    by the launcher, root's is kept."""
    here = tmp_path / "sockets"
    here.mkdir()
    here.chmod(0o1777)
    root_sock = socket.socket(socket.AF_UNIX)
    root_sock.bind(str(here / "root.sock"))
    world = str(host["root"] / "world.sock")
    walls = Confinement(read_only=host["walls"].read_only, socket_dirs=(str(here),), skill=SKILL)
    try:
        result = probe(
            LOCAL_PIPE.replace("sys.argv[1]", repr(str(here))).replace("sys.argv[2]", repr(world)),
            walls,
            seconds=4,
        )
    finally:
        root_sock.close()
    got = dict(line.split(" ", 1) for line in result.stdout.decode().splitlines())
    assert result.timed_out, result
    assert got["bind"] == got["listen"] == got["left"] == "ok", (got, result.stderr)
    assert got["connect-host"] != "ok"
    assert got["file"] == "EACCES"
    assert got["unlink-root"] in ("EPERM", "EACCES")
    assert sorted(p.name for p in here.iterdir()) == ["root.sock"]
