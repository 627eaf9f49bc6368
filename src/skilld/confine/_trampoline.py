"""The confined process's first moments: namespaces, Landlock, rlimits, then ``execve``.

This file runs as a script (``python -I -S _trampoline.py SPEC_FD STATUS_FD``), started by
:func:`skilld.confine.run` through ``subprocess`` (fork+exec in C, no Python between
them), because confining a process needs code between fork and exec and ``preexec_fn``
is unsafe in a threaded server. It is also imported by the host for the Landlock
constants and the ABI probe, so it imports nothing but the standard library (``-S``
leaves site-packages out of ``sys.path``).

Three processes, each single-threaded::

    T (this script)   outside the namespaces: joins the pids cgroup (root), unshares
      │               user (not root), PID, IPC and, without network, net namespaces;
      │               SIGTERM from the host makes it SIGKILL C
      └─ C            PID 1 of the new PID namespace; dies with T (PDEATHSIG);
           │          no_new_privs, capabilities dropped, Landlock and seccomp applied;
           │          reaps orphans and reports G's end on the status pipe
           └─ G       rlimits, cwd, default signals, then execve of the command

When C exits the kernel SIGKILLs every process left in its namespace: a grandchild
that called ``setsid()`` escapes a process group, not a PID namespace. Every failure
before ``execve`` is one line on the status pipe (``unavailable`` names a kernel
feature that is missing; ``execve`` or ``chdir`` an errno); the
command never runs without the whole confinement.
"""

from __future__ import annotations

import ctypes
import marshal
import os
import resource
import select
import stat
import sys

# Not ``from typing import TYPE_CHECKING``: every millisecond of imports here is paid
# by every command (``json`` and ``typing`` pull in ``re``, ``signal`` pulls in ``enum``).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal
    from collections.abc import Iterable, Mapping
    from typing import Any
else:
    import _signal as signal
if TYPE_CHECKING or __package__:
    from skilld.confine import _seccomp
else:  # run as a script under -I: its own directory is not on sys.path
    sys.path.insert(0, __file__.rpartition("/")[0])  # not pathlib: start-up time
    import _seccomp

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

# -- prctl, namespaces, capabilities -----------------------------------------
PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
_CAP_VERSION_3 = 0x20080522

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


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
    # prctl is variadic and reads unsigned longs: pass them as such, not as C ints.
    return int(_libc.prctl(option, *(ctypes.c_ulong(a) for a in (arg, 0, 0, 0))))


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


def _add_path(ruleset: int, path: str, access: int, handled: int, follow: bool) -> None:
    try:
        fd = _open_path(path, follow)
    except OSError:
        # A path that does not exist (or is a link, for a grant) gives no access.
        return
    try:
        allowed = access & handled
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            allowed &= FS_FILE_RIGHTS
        if not allowed:
            return
        attr = _PathBeneath(allowed, fd)
        _check(
            int(
                _libc.syscall(
                    SYS_LANDLOCK_ADD_RULE, ruleset, RULE_PATH_BENEATH, ctypes.byref(attr), 0
                )
            ),
            "landlock",
            f"landlock_add_rule({path})",
        )
    finally:
        os.close(fd)


def apply_landlock(spec: Mapping[str, Any]) -> None:
    """Restrict this process (and what it starts) to the spec's paths and ports.

    Raises:
        Unavailable: Landlock is missing or refused the ruleset.
    """
    abi = int(spec["abi"])
    handled = fs_rights(abi)
    attr = _RulesetAttr(handled, 0, 0)
    if abi >= 4 and spec["handle_tcp"]:
        attr.handled_access_net = NET_BIND_TCP | NET_CONNECT_TCP
    if abi >= 6:
        attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
    # The struct as the kernel of that ABI knows it (an older kernel refuses a longer one).
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = _check(
        int(
            _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
        ),
        "landlock",
        "landlock_create_ruleset",
    )
    try:
        for path, access, follow in _path_rules(spec):
            _add_path(ruleset, path, access, handled, follow)
        if attr.handled_access_net:
            for right, key in ((NET_CONNECT_TCP, "tcp_connect"), (NET_BIND_TCP, "tcp_bind")):
                for port in spec[key]:
                    net = _NetPort(right, int(port))
                    _check(
                        int(
                            _libc.syscall(
                                SYS_LANDLOCK_ADD_RULE, ruleset, RULE_NET_PORT, ctypes.byref(net), 0
                            )
                        ),
                        "landlock-tcp",
                        f"landlock_add_rule(port {port})",
                    )
        _check(_prctl(PR_SET_NO_NEW_PRIVS, 1), "no_new_privs", "prctl")
        _check(
            int(_libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0)),
            "landlock",
            "landlock_restrict_self",
        )
    finally:
        os.close(ruleset)


def _path_rules(spec: Mapping[str, Any]) -> Iterable[tuple[str, int, bool]]:
    for path in spec["libraries"]:
        yield path, READ, True
    for path in spec["executables"]:
        yield path, EXEC, True
    for path in spec["devices"]:
        yield path, DEVICE, True
    for path in spec["read_only"]:
        yield path, READ, False
    for path in spec["read_write"]:
        yield path, WRITE, False


def drop_capabilities() -> None:
    """Empty the bounding, ambient, effective, permitted and inheritable sets.

    After this even an ``execve`` as uid 0 gains no capability: the command runs as
    root's files' owner, not as root (reboot, modules, raw sockets, ... are gone).

    Raises:
        Unavailable: the kernel refused to drop them.
    """
    with open("/proc/sys/kernel/cap_last_cap", "rb") as f:
        last = int(f.read())
    for cap in range(last + 1):
        # EINVAL for a capability this kernel does not know; EPERM without CAP_SETPCAP
        # (then the bounding set is already as small as it can be made here).
        _prctl(PR_CAPBSET_DROP, cap)
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capabilities", "capset")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _status(fd: int, kind: str, value: int, text: str = "") -> None:
    """One status line, ``KIND VALUE TEXT``, below PIPE_BUF: written atomically."""
    line = f"{kind} {value} {text}".replace("\n", " ")[:3500]
    os.write(fd, (line + "\n").encode(errors="replace"))


def _limits(spec: Mapping[str, Any]) -> None:
    for name, value in spec["rlimits"].items():
        if value is None:
            continue
        which = getattr(resource, name)
        hard = resource.getrlimit(which)[1]
        # Lowering is always allowed; a host limit already below ours stays.
        limit = int(value) if hard == resource.RLIM_INFINITY else min(int(value), hard)
        resource.setrlimit(which, (limit, limit))


def _command(spec: Mapping[str, Any], status: int) -> None:
    """G: the last steps in the command's own process, then ``execve``. Never returns."""
    try:
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM):
            # Python ignores SIGPIPE and SIGXFSZ, and an ignored signal stays ignored
            # across execve: a command must die of a closed pipe or its file-size limit.
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        try:
            os.chdir(spec["cwd"])
        except OSError as exc:
            _status(status, "chdir", exc.errno or 0, spec["cwd"])
            os._exit(127)
        _limits(spec)
        argv = spec["argv"]
        try:
            os.execve(spec["program"], argv, spec["env"])  # noqa: S606 - argv, never a shell
        except OSError as exc:
            _status(status, "execve", exc.errno or 0, spec["program"])
    except BaseException as exc:  # noqa: BLE001 - reported, then this process ends
        _status(status, "internal", 0, f"{type(exc).__name__}: {exc}")
    os._exit(127)


def _init(spec: Mapping[str, Any], status: int, alive: int) -> None:
    """C: PID 1 of the namespace. Confines itself, starts G, reaps, reports. Never returns."""
    code = 0
    try:
        _check(_prctl(PR_SET_PDEATHSIG, signal.SIGKILL), "prctl", "PDEATHSIG")
        # T may have died before PDEATHSIG was armed; its end of ``alive`` then reads EOF.
        if select.select([alive], [], [], 0)[0]:
            os._exit(1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        drop_capabilities()
        apply_landlock(spec)
        try:
            _seccomp.install(spec["seccomp"])
        except OSError as exc:
            raise Unavailable("seccomp", str(exc)) from exc
        child = os.fork()
        if child == 0:
            os.close(alive)
            _command(spec, status)
        for fd in (0, 1, 2):
            os.close(fd)
        while True:
            pid, wstatus = os.wait()
            if pid == child:
                break
        if os.WIFSIGNALED(wstatus):
            _status(status, "signal", os.WTERMSIG(wstatus))
        else:
            _status(status, "exit", os.waitstatus_to_exitcode(wstatus))
    except Unavailable as exc:
        _status(status, "unavailable", 0, f"{exc.feature}: {exc.detail}")
        code = 1
    except BaseException as exc:  # noqa: BLE001 - reported, then this process ends
        _status(status, "internal", 0, f"{type(exc).__name__}: {exc}")
        code = 1
    os._exit(code)


def _namespaces(spec: Mapping[str, Any]) -> None:
    flags = CLONE_NEWPID | CLONE_NEWIPC
    if not spec["network"] and not spec["tcp_connect"] and not spec["tcp_bind"]:
        flags |= CLONE_NEWNET
    uid, gid = os.getuid(), os.getgid()
    if os.geteuid() != 0:
        flags |= CLONE_NEWUSER
    if _libc.unshare(flags) != 0:
        err = ctypes.get_errno()
        feature = "user namespaces" if flags & CLONE_NEWUSER else "PID/network namespaces"
        raise Unavailable(feature, f"unshare failed: {os.strerror(err)} (errno {err})")
    if flags & CLONE_NEWUSER:
        # The same uid and gid inside: files keep their owners, and the command is not
        # root in its namespace (execve gives it no capabilities).
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")


def main(spec_fd: int, status: int) -> None:
    """T: read the spec, enter the namespaces, start C and wait for it. Never returns."""
    child: list[int] = []

    def _terminate(signum: int, frame: object) -> None:
        # The host's deadline: C's death empties its PID namespace.
        if child:
            os.kill(child[0], signal.SIGKILL)
        else:
            os._exit(128 + signum)

    signal.signal(signal.SIGTERM, _terminate)
    # Closed by execve in G: the command never holds the status pipe.
    os.set_inheritable(status, False)
    try:
        with os.fdopen(spec_fd, "rb") as f:
            # Written by the host on a pipe only it and this process hold.
            spec = marshal.loads(f.read())  # noqa: S302
        _check(_prctl(PR_SET_PDEATHSIG, signal.SIGKILL), "prctl", "PDEATHSIG")
        if os.getppid() != spec["host_pid"]:
            os._exit(1)
        if spec["cgroup"]:
            _write(f"{spec['cgroup']}/cgroup.procs", str(os.getpid()))
        _namespaces(spec)
        alive_r, alive_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(alive_w)
            _init(spec, status, alive_r)
        child.append(pid)
        os.close(alive_r)
        for fd in (0, 1, 2):
            os.close(fd)
        _, wstatus = os.waitpid(pid, 0)
        os._exit(0 if os.WIFEXITED(wstatus) and os.WEXITSTATUS(wstatus) == 0 else 1)
    except Unavailable as exc:
        _status(status, "unavailable", 0, f"{exc.feature}: {exc.detail}")
    except BaseException as exc:  # noqa: BLE001 - reported, then this process ends
        _status(status, "internal", 0, f"{type(exc).__name__}: {exc}")
    os._exit(1)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
