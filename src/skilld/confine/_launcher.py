"""The launcher: one long-lived, single-threaded process per node that forks each command.

This file runs as a script (``python -I -S _launcher.py CTL_FD [RUN_AS]``), started once
by :mod:`skilld.confine._client`, because confining a process needs code between fork and
exec, and ``fork`` in a threaded server (or ``preexec_fn``) is unsafe; a fork of this
small, single-threaded process costs well under a millisecond and starts no interpreter.
The host also imports it for the Landlock constants and the ABI probe, so it imports
nothing but the standard library (``-S`` leaves site-packages out of ``sys.path``).

Three kinds of processes::

    L (this script)  started once; a child subreaper; reads one message per command on
      │              CTL_FD (a byte and four descriptors: the call socket, stdin, stdout,
      │              stderr), hands them to an idle C over its link or forks a new C,
      │              reaps; kills any orphan that reaches it
      └─ C           one per running command: a child subreaper. Reads the spec (and
           │         the host's Landlock ruleset) from the call socket, hands the
           │         per-call workspace to the call's uid, forks G,
           │         waits for G, a kill request (``K``, or EOF: the host is gone), the
           │         deadline or the tree over its memory limit (measured every 10 ms:
           │         ``tree_memory``); then SIGKILLs every descendant until ``wait`` says ECHILD
           │         (``setsid`` does not leave a subreaper), gives the workspace back,
           │         writes the status line, and tells L it is idle (``_serve``)
           └─ G      the command's own process: a new process group and keyring, net and IPC
                     namespaces where they can be made, the call's uid and the skill's gid (no
                     supplementary groups), no capabilities, rlimits, no_new_privs,
                     Landlock, the seccomp filter, then ``execve``

Every failure before ``execve`` is one line on the call socket (``unavailable`` names a
missing kernel feature; ``execve``/``chdir`` an errno): the command never runs without
the whole confinement. With ``RUN_AS`` (``UID:GID``, when the server was started as root
in an image) L switches to that identity keeping only CAP_SETUID, CAP_SETGID and
CAP_CHOWN, so that the server itself can run with no capability at all.
"""

from __future__ import annotations

# ``_socket``, not ``socket``: that one imports ``enum`` and ``selectors``.
import _socket as socket
import ctypes
import fcntl
import gc
import marshal
import os
import resource
import select
import stat
import sys
import time

# Not ``from typing import TYPE_CHECKING``: imports here are paid once per node, but
# ``json``, ``typing`` and ``signal`` (``enum``) are still not worth it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal
    from collections.abc import Mapping, Sequence
    from typing import Any
else:
    import _signal as signal

# -- Landlock (include/uapi/linux/landlock.h) ---------------------------------
# The three syscalls have the same numbers on every architecture (added after the
# tables were unified).
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
SYS_OPENAT2 = 437
CREATE_RULESET_VERSION = 1 << 0
RULE_PATH_BENEATH = 1
RULE_NET_PORT = 2

FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
FS_IOCTL_DEV = 1 << 15  # ABI 5
NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6

# The fs rights each ABI version handles (a ruleset can only name rights its kernel knows).
FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
# Rights that apply to a file (a rule on a regular file may name only these).
FS_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
READ = FS_READ_FILE | FS_READ_DIR
EXEC = READ | FS_EXECUTE
WRITE = (
    READ
    | FS_WRITE_FILE
    | FS_REMOVE_DIR
    | FS_REMOVE_FILE
    | FS_MAKE_DIR
    | FS_MAKE_REG
    | FS_MAKE_SOCK
    | FS_MAKE_FIFO
    | FS_MAKE_SYM
    | FS_REFER
    | FS_TRUNCATE
)
DEVICE = FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE

# -- prctl, namespaces, capabilities, keyrings --------------------------------
PR_SET_PDEATHSIG = 1
PR_SET_KEEPCAPS = 8
PR_CAPBSET_DROP = 24
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
CLONE_NEWIPC = 0x08000000
CLONE_NEWNET = 0x40000000
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
_CAP_VERSION_3 = 0x20080522
CAP_CHOWN = 0
CAP_SETGID = 6
CAP_SETUID = 7
# What L keeps when it runs as the image's unprivileged user (RUN_AS).
LAUNCHER_CAPS = (1 << CAP_CHOWN) | (1 << CAP_SETGID) | (1 << CAP_SETUID)
KEYCTL_JOIN_SESSION_KEYRING = 1
_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}
# Every fd L passes to C per command: the call socket, stdin, stdout, stderr.
FDS_PER_CALL = 4

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
# prctl is variadic and reads unsigned longs: declared once, its calls pass plain ints.
_libc.prctl.argtypes = (ctypes.c_int, *(ctypes.c_ulong,) * 4)
_libc.prctl.restype = ctypes.c_int
_MACHINE = os.uname().machine


class _RulesetAttr(ctypes.Structure):
    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    )


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


class _NetPort(ctypes.Structure):
    _fields_ = (("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64))


class _OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    )


class Unavailable(Exception):
    """A kernel feature the confinement needs is missing (``feature`` names it)."""

    def __init__(self, feature: str, detail: str):
        super().__init__(f"{feature}: {detail}")
        self.feature = feature
        self.detail = detail


def _prctl(option: int, arg: int = 0) -> int:
    return int(_libc.prctl(option, arg, 0, 0, 0))


def _check(result: int, feature: str, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise Unavailable(feature, f"{what} failed: {os.strerror(err)} (errno {err})")
    return result


def landlock_abi() -> int:
    """The Landlock ABI version of the running kernel; 0 when Landlock is off or absent."""
    abi = int(
        _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), CREATE_RULESET_VERSION)
    )
    return max(abi, 0)


def fs_rights(abi: int) -> int:
    """The fs access rights a ruleset handles on a kernel with Landlock ``abi``."""
    return FS_BY_ABI[max(v for v in FS_BY_ABI if v <= abi)]


def effective_caps() -> int:
    """This process's effective capability set, as a bit mask."""
    return _cap_line(b"CapEff:")


def _cap_line(key: bytes) -> int:
    with open("/proc/self/status", "rb") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1], 16)
    return 0


def _open_path(path: str, follow: bool) -> int:
    """An ``O_PATH`` descriptor for ``path``; without ``follow``, no symlink on the way.

    Grant paths are opened without following links: a skill that can write beside a
    granted directory must not turn the rule for it into a rule for where a link points.
    """
    if follow:
        return os.open(path, os.O_PATH | os.O_CLOEXEC)
    how = _OpenHow(os.O_PATH | os.O_CLOEXEC, 0, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
    fd = int(
        _libc.syscall(
            SYS_OPENAT2,
            ctypes.c_int(-100),  # AT_FDCWD
            os.fsencode(path),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return fd


def _add_path(ruleset: int, path: str, access: int, follow: bool) -> None:
    try:
        fd = _open_path(path, follow)
    except OSError:
        # A path that does not exist (or is a link, for a grant) gives no access.
        return
    try:
        allowed = access
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            allowed &= FS_FILE_RIGHTS
        if not allowed:
            return
        _add_rule(ruleset, RULE_PATH_BENEATH, _PathBeneath(allowed, fd), "landlock", path)
    finally:
        os.close(fd)


def _add_rule(ruleset: int, kind: int, rule: ctypes.Structure, feature: str, what: str) -> None:
    """Add one Landlock rule of ``kind`` (path-beneath or net-port) to ``ruleset``.

    Raises:
        Unavailable: the kernel refused it (``feature`` and ``what`` name it).
    """
    _check(
        int(_libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, kind, ctypes.byref(rule), 0)),
        feature,
        f"landlock_add_rule({what})",
    )


def landlock_ruleset(rules: Sequence[Any]) -> int:
    """A Landlock ruleset fd for precomputed ``rules``: handled fs, handled net, scoped,
    struct size, path rules, connect ports, bind ports. The host builds it for each
    command and hands it over with the spec; rules on paths the call's process makes
    itself (declared temporary paths) are added there (:func:`add_paths`).

    Raises:
        Unavailable: Landlock is missing or refused a rule.
    """
    fs, net, scoped, size, paths, connect, bind = rules
    attr = _RulesetAttr(fs, net, scoped)
    ruleset = _check(
        int(
            _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
        ),
        "landlock",
        "landlock_create_ruleset",
    )
    try:
        for path, access, follow in paths:
            _add_path(ruleset, path, access, follow)
        for right, ports in ((NET_CONNECT_TCP, connect), (NET_BIND_TCP, bind)):
            for port in ports:
                _add_rule(
                    ruleset, RULE_NET_PORT, _NetPort(right, port), "landlock-tcp", f"port {port}"
                )
    except BaseException:
        os.close(ruleset)
        raise
    return ruleset


def add_paths(ruleset: int, paths: Sequence[Any]) -> None:
    """Add ``(path, rights, follow links)`` rules to the open ``ruleset``.

    Raises:
        Unavailable: Landlock refused a rule.
    """
    for path, access, follow in paths:
        _add_path(ruleset, path, access, follow)


_last_cap: list[int] = []


def drop_bounding_set(keep: int = 0) -> None:
    """Drop every capability but ``keep`` from the bounding set (an EPERM without
    CAP_SETPCAP leaves it as small as it already is)."""
    if not _last_cap:
        with open("/proc/sys/kernel/cap_last_cap", "rb") as f:
            _last_cap.append(int(f.read()))
    for cap in range(_last_cap[0] + 1):
        if not keep & (1 << cap):
            _prctl(PR_CAPBSET_DROP, cap)


def bounding_set() -> int:
    """This process's capability bounding set, as a bit mask."""
    return _cap_line(b"CapBnd:")


# Whether L emptied its own bounding set at start-up (it never execs, and needs none):
# every C and G, its forks, inherit the empty set and need not drop 41 capabilities
# one ``prctl`` each per command.
_bounding_empty: list[bool] = [False]


def set_capabilities(keep: int = 0) -> None:
    """Permitted and effective sets become ``keep``; inheritable and ambient empty.

    Raises:
        Unavailable: the kernel refused.
    """
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    data[0].effective = data[0].permitted = keep & 0xFFFFFFFF
    data[1].effective = data[1].permitted = keep >> 32
    _check(_libc.capset(ctypes.byref(header), data), "capabilities", "capset")


def switch_identity(uid: int, gid: int) -> None:
    """No supplementary groups, then ``gid`` and ``uid`` as real, effective and saved ids.

    Raises:
        Unavailable: the kernel refused (no CAP_SETUID/CAP_SETGID, or no such id here).
    """
    try:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    except OSError as exc:
        raise Unavailable(
            "identity", f"switching to uid {uid} gid {gid} failed: {exc.strerror}"
        ) from exc


def _status(fd: int, kind: str, value: int, text: str = "") -> None:
    """One status line, ``KIND VALUE TEXT``, on the call socket."""
    line = f"{kind} {value} {text}".replace("\n", " ")[:3500]
    try:  # the host is gone: nobody to tell
        os.write(fd, (line + "\n").encode(errors="replace"))
    except OSError:
        pass


def _limits(rlimits: Mapping[str, int | None]) -> None:
    for name, value in rlimits.items():
        if value is None:
            continue
        which = getattr(resource, name)
        hard = resource.getrlimit(which)[1]
        # Lowering is always allowed; a host limit already below ours stays.
        limit = int(value) if hard == resource.RLIM_INFINITY else min(int(value), hard)
        resource.setrlimit(which, (limit, limit))


def _new_keyring() -> None:
    """A fresh, empty session keyring: the launcher's (root's) is not the command's.

    Docker's default seccomp profile refuses ``keyctl``; then there is no keyring to
    reach either, and the seccomp layer refuses it for the command too.
    """
    number = _SYS_KEYCTL.get(_MACHINE)
    if number is not None:
        _libc.syscall(number, KEYCTL_JOIN_SESSION_KEYRING, None)


# ``install(bpf)`` of ``_seccomp.py`` beside this file, imported once by L at start-up
# (``None`` when that module is not there: then no spec carries a filter).
_install_filter: list[Any] = []


def _load_seccomp() -> bool:
    # pathlib is not imported here: the launcher keeps to what it needs.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: PTH100, PTH120
    try:
        import _seccomp  # type: ignore[import-not-found]
    except ImportError:
        return False
    finally:
        del sys.path[0]
    _seccomp._libc()  # looked up here, once, not in every command's process
    _install_filter.append(_seccomp.install)
    return True


def _seccomp(bpf: bytes) -> None:
    """Install the host-compiled filter (after no_new_privs).

    Raises:
        Unavailable: the filter was refused, or there is no installer.
    """
    if not _install_filter:
        raise Unavailable("seccomp", "the filter installer (_seccomp.py) is missing")
    try:
        _install_filter[0](bpf)
    except OSError as exc:
        raise Unavailable("seccomp", f"installing the filter failed: {exc}") from exc


def _command(spec: Mapping[str, Any], call: int, stdio: tuple[int, int, int], ruleset: int) -> None:
    """G: the last steps in the command's own process, then ``execve``. Never returns."""
    try:
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
            # Python ignores SIGPIPE and SIGXFSZ, and an ignored signal stays ignored
            # across execve: a command must die of a closed pipe or its file-size limit.
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        for target, fd in enumerate(stdio):
            os.dup2(fd, target)
        # A process group of its own, in L's session (which has no terminal): not
        # ``setsid``, which also makes a scheduler autogroup per command where autogroups
        # are on (about 0.25 ms of the command's few). So every command shares L's
        # autogroup: under contention all of them together get the CPU share of one
        # session beside skilld's, however many run.
        os.setpgid(0, 0)
        if spec["unshare"]:
            _check(_libc.unshare(spec["unshare"]), "namespaces", "unshare")
        add_paths(ruleset, spec["late_paths"])
        _new_keyring()
        identity = spec["identity"]
        if identity is not None:
            if not _bounding_empty[0]:
                drop_bounding_set()
            switch_identity(*identity)
            # The call's own uid, the skill's group: what it makes in the skill's grants
            # stays writable by the skill's later calls, which run as other uids.
            os.umask(0o002)
        set_capabilities(0)
        _limits(spec["rlimits"])
        try:
            os.chdir(spec["cwd"])
        except OSError as exc:
            _status(call, "chdir", exc.errno or 0, spec["cwd"])
            os._exit(127)
        _check(_prctl(PR_SET_NO_NEW_PRIVS, 1), "no_new_privs", "prctl")
        _check(
            int(_libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0)),
            "landlock",
            "landlock_restrict_self",
        )
        os.close(ruleset)
        if spec["seccomp"] is not None:
            _seccomp(spec["seccomp"])
        try:
            os.execve(spec["program"], spec["argv"], spec["env"])  # noqa: S606 - argv only
        except OSError as exc:
            _status(call, "execve", exc.errno or 0, spec["program"])
    except Unavailable as exc:
        _status(call, "unavailable", 0, f"{exc.feature}: {exc.detail}")
    except BaseException as exc:  # noqa: BLE001 - reported, then this process ends
        _status(call, "internal", 0, f"{type(exc).__name__}: {exc}")
    os._exit(127)


# -- ending a tree -------------------------------------------------------------


def _children() -> list[int]:
    me = os.getpid()
    try:
        fd = os.open(f"/proc/{me}/task/{me}/children", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        return [int(p) for p in os.read(fd, 1 << 20).split()]
    except OSError:
        return []
    finally:
        os.close(fd)


def kill_descendants(reaped: dict[int, int] | None = None) -> None:
    """SIGKILL every child, reap, and again, until ``wait`` says there is none left.

    This process is a child subreaper: when a descendant's parent dies, it becomes a
    child of this one, ``setsid`` or not, so the loop ends only when the whole tree
    is gone. ``reaped`` collects the wait statuses by pid.
    """
    try:
        # No child at all (the usual end: the program exited, leaving nothing): an
        # orphan is this process's child before its parent is reaped, so none is left.
        pid, status = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return
    if pid and reaped is not None:
        reaped[pid] = status
    while True:
        for pid in _children():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            # Killed but not yet dead (or listed late): wait a little for one.
            select.select([], [], [], 0.001)
        elif reaped is not None:
            reaped[pid] = status


# -- the tree's memory -----------------------------------------------------------

# How often C measures its tree against a memory limit (the fallback where no cgroup
# can be had): a tree allocating faster than this lets it overshoot by what it takes
# in one interval.
MEMORY_POLL_S = 0.01


def descendants() -> list[int]:
    """Every process below this one (the subreaper's tree), read from each task's
    ``children`` list: a child forked by a thread is listed under that thread."""
    return [pid for pid, _ in _tree()]


def tree_tasks() -> int:
    """How many tasks (processes and their threads) the tree runs: what RLIMIT_NPROC
    counts, for a tree whose uid it does not bound (uid 0: see ``tasks`` in the spec)."""
    return sum(tasks for _, tasks in _tree())


def _tree() -> list[tuple[int, int]]:
    """Each process below this one, with how many tasks it has (0: gone meanwhile)."""
    found: list[tuple[int, int]] = []
    todo = _children()
    while todo:
        pid = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")  # noqa: PTH208 - no pathlib in the launcher
        except OSError:
            found.append((pid, 0))
            continue
        found.append((pid, len(tasks)))
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                    todo += [int(p) for p in f.read().split()]
            except OSError:
                continue
    return found


def tree_memory() -> int:
    """Bytes of memory the tree holds: each process's anonymous and shared-memory
    resident pages (``RssAnon`` + ``RssShmem`` of ``/proc/PID/status``, readable by any
    uid). Pages shared after a ``fork`` count once per process: the sum errs high."""
    total = 0
    for pid in descendants():
        try:
            with open(f"/proc/{pid}/status", "rb") as f:
                text = f.read()
        except OSError:
            continue
        for key in (b"RssAnon:", b"RssShmem:"):
            at = text.find(key)
            if at >= 0:
                total += int(text[at + len(key) : text.index(b"k", at)]) * 1024
    return total


# -- the per-call workspace -----------------------------------------------------


def hand_over(path: str, frm: int, to: int, *, owner_view: bool) -> None:
    """Give every entry under ``path`` (and itself) owned by ``frm`` to ``to`` (uid and
    gid), by descriptor and never through a link; hard-linked files are left alone.

    ``owner_view``: this process acts with ``frm``'s effective uid and no DAC override
    (the image's launcher), so a directory is first made readable to its owner.
    """
    if owner_view:
        # The script may have closed its workspace itself (mode 0); it cannot have
        # replaced it (Landlock gives it nothing of the parent).
        try:
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == frm:
                os.chmod(path, stat.S_IMODE(st.st_mode) | 0o700)  # noqa: PTH101 - no pathlib here
        except OSError:
            pass
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        if st.st_uid == frm:
            _hand_over_dir(fd, frm, to, owner_view)
            os.fchown(fd, to, to)
    finally:
        os.close(fd)


def _hand_over_dir(top: int, frm: int, to: int, owner_view: bool) -> None:
    """Hand over everything beneath the open directory ``top``, to any depth.

    Iterative, and a directory is left by its ``..`` (checked to be the one it was
    entered from), so that no depth costs a descriptor or a stack frame: a script's tree
    70 or 10,000 levels deep is handed back whole (before, past depth 64 it stayed the
    script's, and the server could not remove it). ``skilld.paths.walk_beneath`` walks
    the same way; this file imports nothing of skilld's (it runs as a script).
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    # Each level: (its identity, the names still to visit (reversed), its name in its
    # parent, or None for ``top``).
    first = os.fstat(top)
    levels: list[tuple[tuple[int, int], list[str], str | None]] = [
        ((first.st_dev, first.st_ino), _listing(top), None)
    ]
    fd = top
    try:
        while levels:
            _ident, names, name = levels[-1]
            if not names:
                levels.pop()
                if name is None:
                    break
                up = top if len(levels) == 1 else os.open("..", flags, dir_fd=fd)
                if (os.fstat(up).st_dev, os.fstat(up).st_ino) != levels[-1][0]:
                    if up != top:
                        os.close(up)
                    return  # moved while handed over: the rest stays as it is
                try:
                    os.fchown(fd, to, to)
                except OSError:
                    pass
                os.close(fd)
                fd = up
                continue
            entry = names.pop()
            try:
                st = os.lstat(entry, dir_fd=fd)
            except OSError:
                continue
            if st.st_uid != frm:
                continue
            if not stat.S_ISDIR(st.st_mode):
                if st.st_nlink == 1 or stat.S_ISLNK(st.st_mode):
                    try:
                        os.chown(entry, to, to, dir_fd=fd, follow_symlinks=False)
                    except OSError:
                        pass
                continue
            if owner_view:
                # A directory the script closed (mode 0): its owner may open it again.
                # Without CAP_FOWNER this can only ever change a file ``frm`` owns.
                try:
                    os.chmod(entry, stat.S_IMODE(st.st_mode) | 0o700, dir_fd=fd)
                except OSError:
                    pass
            try:
                sub = os.open(entry, flags, dir_fd=fd)
            except OSError:
                continue
            now = os.fstat(sub)
            if now.st_uid != frm or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                os.close(sub)
                continue
            if fd != top:
                os.close(fd)
            fd = sub
            levels.append(((now.st_dev, now.st_ino), _listing(sub), entry))
    except OSError:
        pass
    finally:
        if fd != top:
            os.close(fd)


def _listing(fd: int) -> list[str]:
    """The names in the open directory ``fd``, reversed (popped in order); [] unreadable."""
    try:
        return sorted(os.listdir(fd), reverse=True)
    except OSError:
        return []


def sweep_sockets(dirs: Any, uid: int, since: float) -> None:
    """Remove the unix sockets ``uid`` made at the top of ``dirs`` since ``since`` (wall
    clock): what a program killed at the deadline, or one that crashed, left behind
    (LibreOffice's pipe in /tmp). The tree is gone; this process acts as root or as
    ``uid`` itself (then the sticky /tmp lets it remove only ``uid``'s files)."""
    for directory in dirs or ():
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            with os.scandir(fd) as entries:
                names = [e.name for e in entries]
            for name in names:
                try:
                    st = os.lstat(name, dir_fd=fd)
                    if stat.S_ISSOCK(st.st_mode) and st.st_uid == uid and st.st_ctime >= since:
                        os.unlink(name, dir_fd=fd)
                except OSError:
                    pass
        finally:
            os.close(fd)


class TempPathRefused(Exception):
    """A declared temporary path cannot be made the call's own (the message says why)."""


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Where every temporary path lives: sticky, so a name made there stays its owner's.
TEMP_PARENT = "/tmp"  # noqa: S108 - the parent of declared temporary paths, by design


def temp_name(path: str) -> str:
    """The name of ``path`` in /tmp.

    Raises:
        TempPathRefused: ``path`` is not one name directly under /tmp.
    """
    parent, _, name = path.rpartition("/")
    if parent != TEMP_PARENT or name in ("", ".", "..") or "\x00" in name:
        raise TempPathRefused(f"{path!r} is not one name directly under {TEMP_PARENT}")
    return name


def make_temp_paths(
    paths: Any, uid: int, gid: int, slot: tuple[int, int] | None = None
) -> list[tuple[str, int, int, int]]:
    """Make each of ``paths`` (``/tmp/NAME``) a fresh directory of ``uid`` and ``gid``,
    mode 0700, locked (``flock``) for the call: ``(name, fd, st_dev, st_ino)`` each.

    Never through a link: ``mkdir``, then ``open(O_DIRECTORY|O_NOFOLLOW)`` and ``fstat``.
    A directory of the skill's group owned by a uid of its ``slot`` (``uid`` itself
    without one) is a leftover of a call that died with its launcher: emptied, given to
    ``uid`` and used, unless another call holds its lock. Anything else at the name (a
    link, a file, another uid's directory) refuses the call, untouched.

    Raises:
        TempPathRefused: naming the path and why; what was made so far is removed.
    """
    made: list[tuple[str, int, int, int]] = []
    if not paths:
        return made
    tmp = os.open(TEMP_PARENT, _DIR_FLAGS)
    try:
        for path in paths:
            made.append(_make_temp_path(tmp, path, (uid, gid), slot or (uid, uid)))
    except BaseException:
        remove_temp_paths(made)
        raise
    finally:
        os.close(tmp)
    return made


def _make_temp_path(
    tmp: int, path: str, owner: tuple[int, int], slot: tuple[int, int]
) -> tuple[str, int, int, int]:
    name = temp_name(path)
    try:
        os.mkdir(name, 0o700, dir_fd=tmp)
        fresh = True
    except FileExistsError:
        fresh = False
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=tmp)
    except OSError as exc:
        what = os.strerror(exc.errno or 0)
        try:
            st = os.lstat(name, dir_fd=tmp)
            what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"
            what += f" of uid {st.st_uid}"
        except OSError:
            pass
        raise TempPathRefused(
            f"{path} already exists and is {what}; it was left alone (remove it, or find "
            "who made it)"
        ) from None
    try:
        st = _claim(fd, path, owner, slot, fresh=fresh)
    except BaseException:
        os.close(fd)
        raise
    return name, fd, st.st_dev, st.st_ino


def _claim(
    fd: int, path: str, owner: tuple[int, int], slot: tuple[int, int], *, fresh: bool
) -> os.stat_result:
    """Make the directory ``fd`` (at ``path``) ``owner``'s (uid, gid) for the call,
    locked and empty.

    Raises:
        TempPathRefused: a uid outside the skill's slot owns it, or another call holds it.
    """
    st = os.fstat(fd)
    ours = slot[0] <= st.st_uid <= slot[1] and st.st_gid == owner[1]
    if fresh:
        # Mode first: after the chown a launcher that is not root no longer owns it.
        os.fchmod(fd, 0o700)
    elif not ours:
        raise TempPathRefused(
            f"{path} already exists and belongs to uid {st.st_uid} gid {st.st_gid}, not to "
            f"this skill (uids {slot[0]}-{slot[1]}, group {owner[1]}); it was left alone "
            "(remove it, or find who made it)"
        )
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise TempPathRefused(f"{path} is in use by another call of this skill") from None
    if not fresh:
        _empty(fd)
        with os.scandir(fd) as entries:
            if next(entries, None) is not None:
                raise TempPathRefused(
                    f"{path} is a leftover of this skill that could not be emptied; remove it"
                )
    if (st.st_uid, st.st_gid) != owner:
        os.fchown(fd, *owner)
    return os.fstat(fd)


_DEEP = 32
_moves = [0]


def _empty(fd: int) -> None:
    """Remove everything beneath the directory ``fd``, by descriptor, never through a
    link (a link is removed, not followed). Directories the command closed (mode 0) are
    opened again first: the tree is gone, nothing else writes there. A tree deeper than
    32 is moved up to ``fd`` piece by piece, so no pass holds more than 32 descriptors;
    passes go on while one moves something."""
    while _empty_level(fd, fd, 0):
        pass


def _empty_level(fd: int, top: int, depth: int) -> bool:
    """One pass under ``fd``; whether it moved a deep directory up to ``top``."""
    moved = False
    with os.scandir(fd) as entries:
        names = [e.name for e in entries]
    for name in names:
        try:
            st = os.lstat(name, dir_fd=fd)
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(name, dir_fd=fd)
                continue
            try:
                os.chmod(name, 0o700, dir_fd=fd)
            except OSError:
                pass
            if depth >= _DEEP:
                _moves[0] += 1
                os.rename(name, f".deep-{os.getpid()}-{_moves[0]}", src_dir_fd=fd, dst_dir_fd=top)
                moved = True
                continue
            sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            try:
                now = os.fstat(sub)
                if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                    moved = _empty_level(sub, top, depth + 1) or moved
            finally:
                os.close(sub)
            os.rmdir(name, dir_fd=fd)
        except OSError:
            pass
    return moved


def remove_temp_paths(made: list[tuple[str, int, int, int]]) -> None:
    """Empty and remove the directories :func:`make_temp_paths` made, by descriptor;
    the name is removed only while it is still that directory. Never raises."""
    if not made:
        return
    try:
        tmp = os.open(TEMP_PARENT, _DIR_FLAGS)
    except OSError:
        tmp = -1
    for name, fd, dev, ino in made:
        try:
            _empty(fd)
            st = os.lstat(name, dir_fd=tmp)
            if (st.st_dev, st.st_ino) == (dev, ino):
                os.rmdir(name, dir_fd=tmp)
        except OSError:
            pass
        os.close(fd)
    if tmp >= 0:
        os.close(tmp)


# -- C: one command --------------------------------------------------------------


def _descriptors(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    """The descriptors of ``SCM_RIGHTS`` messages in ``ancillary`` (from ``recvmsg``)."""
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += [
                int.from_bytes(data[i : i + 4], sys.byteorder) for i in range(0, len(data) - 3, 4)
            ]
    return fds


def _read_spec(call: int) -> tuple[Any, int]:
    """The spec from the call socket, and the Landlock ruleset the host sent with it.

    Raises:
        EOFError: the host closed the call before the whole spec came.
        Unavailable: no single ruleset came with it (nothing may run).
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, call)
    try:
        head, ancillary, _, _ = sock.recvmsg(
            4, socket.CMSG_SPACE(4), socket.MSG_CMSG_CLOEXEC | socket.MSG_WAITALL
        )
    finally:
        sock.detach()
    fds = _descriptors(ancillary)
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise Unavailable("landlock", f"{len(fds)} rulesets came with the command, not 1")
    try:
        return _read_body(call, head), fds[0]
    except BaseException:
        os.close(fds[0])
        raise


def _read_body(call: int, head: bytes) -> Any:
    while len(head) < 4:
        chunk = os.read(call, 4 - len(head))
        if not chunk:
            raise EOFError("the host closed the call before sending its spec")
        head += chunk
    size = int.from_bytes(head, "little")
    parts: list[bytes] = []
    while size:
        chunk = os.read(call, min(size, 1 << 20))
        if not chunk:
            raise EOFError("the host closed the call inside its spec")
        parts.append(chunk)
        size -= len(chunk)
    # Written by the host on a socket only it and this process hold.
    return marshal.loads(b"".join(parts))  # noqa: S302


def _as_skill(spec: Mapping[str, Any]) -> bool:
    """Act as the call's uid (effective only) where this launcher is not root: then
    its SIGKILLs reach the skill's processes and its directories can be read."""
    identity = spec["identity"]
    if identity is None or os.geteuid() == 0:
        return False
    os.setresuid(-1, identity[0], -1)
    return True


# How many commands one C runs, one after the other, before it exits (its heap is new
# again); and how many Cs may wait idle for the next command.
CALLS_PER_PROCESS = 500
IDLE_MAX = 4


def _serve(link: int, call: int, stdio: tuple[int, int, int]) -> None:
    """C: run commands one after the other, each to its end and its tree's, until L
    closes ``link``, a command fails before it ran, or :data:`CALLS_PER_PROCESS`. Never
    returns.

    Reused, C saves a fork of a Python process per command, with the pages everything
    it touches after a fork costs; between commands it has no child (``kill_descendants``
    waited for ECHILD), no descriptor of the last command, and its own uids again.
    """
    # L's wake-up pipe is closed here: a SIGCHLD must not write to its fd number.
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, 0, link)
    room = socket.CMSG_SPACE(FDS_PER_CALL * 4)
    for served in range(1, CALLS_PER_PROCESS + 1):
        again = _call(call, stdio) == 0 and served < CALLS_PER_PROCESS
        if again:
            # Before the host's EOF: L learns this C is free before the host can send
            # its next command (which L then hands here rather than to a new fork).
            try:
                sock.send(b"I")
            except OSError:
                again = False
        # The host reads to EOF: it comes now, not after this process is torn down.
        os.close(call)
        if not again:
            break
        try:
            msg, ancillary, _, _ = sock.recvmsg(1, room, socket.MSG_CMSG_CLOEXEC)
        except OSError:
            break
        fds = _descriptors(ancillary)
        if not msg or len(fds) != FDS_PER_CALL:
            for fd in fds:
                os.close(fd)
            break
        call, stdio = fds[0], (fds[1], fds[2], fds[3])
    os._exit(0)


def _call(call: int, stdio: tuple[int, int, int]) -> int:
    """C: run one command, end its tree, report on ``call`` (left open); 0, or 1 when it
    failed (then this process must not run another: it may hold a uid or a descriptor
    it should not)."""
    code = 0
    try:
        spec, ruleset = _read_spec(call)
        identity, owner, workspace = spec["identity"], spec["owner"], spec["workspace"]
        uid, gid = (os.geteuid(), os.getegid()) if identity is None else identity
        temps = make_temp_paths(spec.get("temp_paths"), uid, gid, spec.get("slot"))
        if identity is not None and workspace:
            # The workspace is the call's alone: its uid, and that number as its group.
            hand_over(workspace, owner, uid, owner_view=False)
        # Whole seconds: a file's ctime may be taken from a coarser clock than time().
        started = int(time.time()) - 1
        child = os.fork()
        if child == 0:
            _command(spec, call, stdio, ruleset)
        for fd in (*stdio, ruleset):
            os.close(fd)
        pidfd = os.pidfd_open(child)
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        poller.register(call, select.POLLIN)
        until = spec["until"]
        memory = spec.get("memory")
        # Where RLIMIT_NPROC bounds nothing (the command runs as uid 0), the tree's
        # tasks are counted as its memory is, and the tree ends past its bound.
        tasks = spec.get("tasks")
        polled = memory is not None or tasks is not None
        ended = "killed"
        held = 0
        while True:
            left = until - time.monotonic()
            if left <= 0:
                break
            wait = min(left, MEMORY_POLL_S) if polled else left
            ready = dict(poller.poll(min(int(wait * 1000) + 1, 1 << 30)))
            if pidfd in ready:
                ended = "exited"
                break
            if call in ready:
                # ``K`` or EOF (the host is gone): either way the tree ends.
                os.read(call, 1)
                break
            if tasks is not None:
                held = tree_tasks()
                if held > tasks:
                    ended = "tasks"
                    break
            if memory is not None:
                held = tree_memory()
                if held > memory:
                    ended = "memory"
                    break
        reaped: dict[int, int] = {}
        if ended == "exited":
            _, status = os.waitpid(child, 0)
            reaped[child] = status
        as_skill = _as_skill(spec)
        kill_descendants(reaped)
        if identity is not None and workspace:
            hand_over(workspace, identity[0], owner, owner_view=as_skill)
        sweep_sockets(
            spec.get("socket_dirs"), os.geteuid() if identity is None else identity[0], started
        )
        remove_temp_paths(temps)
        if as_skill:
            os.setresuid(-1, os.getuid(), -1)
        waited = reaped.get(child)
        if ended in ("memory", "tasks"):
            _status(call, ended, held)
        elif ended != "exited" or waited is None:
            _status(call, "killed", 0)
        elif os.WIFSIGNALED(waited):
            _status(call, "signal", os.WTERMSIG(waited))
        else:
            _status(call, "exit", os.waitstatus_to_exitcode(waited))
        os.close(pidfd)
    except Unavailable as exc:
        _status(call, "unavailable", 0, f"{exc.feature}: {exc.detail}")
        code = 1
    except TempPathRefused as exc:
        _status(call, "temp", 0, str(exc))
        code = 1
    except BaseException as exc:  # noqa: BLE001 - reported, then this process ends
        _status(call, "internal", 0, f"{type(exc).__name__}: {exc}")
        code = 1
    return code


# -- L: the launcher ---------------------------------------------------------------


def _can_unshare() -> bool:
    """Whether a child can make net and IPC namespaces here (one fork, at start-up)."""
    pid = os.fork()
    if pid == 0:
        os._exit(0 if _libc.unshare(CLONE_NEWNET | CLONE_NEWIPC) == 0 else 1)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def _run_as(uid: int, gid: int) -> None:
    """Become ``uid``/``gid`` keeping only :data:`LAUNCHER_CAPS` (permitted and
    effective; the bounding set is emptied first, by :func:`main`).

    Raises:
        Unavailable: not root, or the kernel refused.
    """
    _check(_prctl(PR_SET_KEEPCAPS, 1), "capabilities", "PR_SET_KEEPCAPS")
    switch_identity(uid, gid)
    _prctl(PR_SET_KEEPCAPS, 0)
    set_capabilities(LAUNCHER_CAPS)


def _reap(calls: set[int]) -> None:
    """Reap ended calls; SIGKILL any other process that became this one's child (an
    orphan of a C that died before its tree)."""
    ended = False
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            break
        ended = True
        calls.discard(pid)
    if ended:
        for pid in _children():
            if pid not in calls:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


def main(ctl_fd: int, run_as: str | None) -> None:
    """L: serve the host's commands until it closes ``ctl_fd``. Never returns."""
    hello: dict[str, Any] = {}
    try:
        _check(_prctl(PR_SET_PDEATHSIG, signal.SIGKILL), "prctl", "PDEATHSIG")
        # L never execs, and what it does needs its permitted and effective sets only:
        # the bounding set goes once here, so no command's process has any to drop
        # (without CAP_SETPCAP it stays as it is, and each G drops what it can).
        drop_bounding_set()
        _bounding_empty[0] = bounding_set() == 0
        if run_as:
            uid, _, gid = run_as.partition(":")
            _run_as(int(uid), int(gid or uid))
            # A change of identity clears the parent-death signal.
            _check(_prctl(PR_SET_PDEATHSIG, signal.SIGKILL), "prctl", "PDEATHSIG")
        _check(_prctl(PR_SET_CHILD_SUBREAPER, 1), "prctl", "PR_SET_CHILD_SUBREAPER")
        hello = {
            "pid": os.getpid(),
            "uid": os.geteuid(),
            "gid": os.getegid(),
            "caps": effective_caps(),
            "namespaces": _can_unshare(),
            "abi": landlock_abi(),
            "seccomp": _load_seccomp(),
        }
    except Unavailable as exc:
        hello = {"error": f"{exc.feature}: {exc.detail}"}
    ctl = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, 0, ctl_fd)
    ctl.sendall(marshal.dumps(hello))
    if "error" in hello:
        os._exit(1)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Every C and G is a fork of this process: with the collector off and what exists
    # now frozen, they do not touch (and so copy) pages of objects they never use.
    gc.disable()
    gc.freeze()
    calls: set[int] = set()
    # Each C's link (L's end of a SOCK_SEQPACKET pair) by fd: its pid and the socket;
    # ``idle`` the links of the Cs waiting for a command (C sends ``I`` when it is).
    links: dict[int, tuple[int, Any]] = {}
    idle: list[int] = []
    poller = select.poll()
    poller.register(ctl_fd, select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    room = socket.CMSG_SPACE(FDS_PER_CALL * 4)
    while True:
        # The links first: a C that said it is idle takes the command that came with it.
        for fd, _ in sorted(poller.poll(), key=lambda ready: ready[0] == ctl_fd):
            if fd == wake_r:
                os.read(wake_r, 512)
                _reap(calls)
                continue
            if fd in links:
                _heard(fd, links, idle, poller)
                continue
            try:
                msg, ancillary, _, _ = ctl.recvmsg(1, room, socket.MSG_CMSG_CLOEXEC)
            except InterruptedError:
                continue
            fds = _descriptors(ancillary)
            if not msg:
                os._exit(0)  # the host is gone: every C sees its call socket close
            if len(fds) == FDS_PER_CALL and not _hand(fds, links, idle):
                pid = _fork_call(fds, (ctl_fd, wake_r, wake_w, *links), links, poller)
                if pid > 0:
                    calls.add(pid)
            for fd in fds:
                os.close(fd)


def _hand(fds: list[int], links: dict[int, tuple[int, Any]], idle: list[int]) -> bool:
    """Give a command's descriptors to an idle C; whether one took them."""
    rights = b"".join(fd.to_bytes(4, sys.byteorder) for fd in fds)
    while idle:
        link = idle.pop()
        try:
            links[link][1].sendmsg([b"R"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)])
        except OSError:
            continue  # that C is gone (its link's EOF drops it)
        return True
    return False


def _fork_call(
    fds: list[int], close: tuple[int, ...], links: dict[int, tuple[int, Any]], poller: Any
) -> int:
    """Fork a C for the command of ``fds`` (its link registered in ``poller``); its pid,
    or -1 when the fork failed (reported on the call socket)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        pid = os.fork()
    except OSError as exc:
        _status(fds[0], "internal", 0, f"fork failed: {exc}")
        ours.close()
        theirs.close()
        return -1
    if pid == 0:
        # Not another C's link: L closes one to end that C, which must then see EOF.
        for fd in (*close, ours.fileno()):
            os.close(fd)
        _serve(theirs.detach(), fds[0], (fds[1], fds[2], fds[3]))
    theirs.close()
    links[ours.fileno()] = (pid, ours)
    poller.register(ours.fileno(), select.POLLIN)
    return pid


def _heard(fd: int, links: dict[int, tuple[int, Any]], idle: list[int], poller: Any) -> None:
    """A C's link spoke: ``I`` (idle: it waits for the next command, unless enough do);
    EOF (it exited). A link that is not kept is closed: its C sees EOF and exits."""
    try:
        msg = links[fd][1].recv(1)
    except OSError:
        msg = b""
    if msg == b"I" and len(idle) < IDLE_MAX:
        idle.append(fd)
        return
    if fd in idle:
        idle.remove(fd)
    poller.unregister(fd)
    links.pop(fd)[1].close()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None)
