"""The confined-process runner: one call of :func:`run` is one command under the kernel's walls.

The host side. It checks that the kernel and the launcher have what the
:class:`Confinement` needs (failing closed with
:class:`~skilld.errors.ConfinementUnavailable`), builds the spec (Landlock rules, the
skill's identity, rlimits, the seccomp program), hands it with the command's pipes to
the launcher (``_launcher.py``, see its docstring for the processes), then in the
calling thread alone feeds stdin, drains and caps stdout and stderr, asks the launcher
to end the whole tree at the deadline or on cancellation, and turns the status line it
wrote into a :class:`ProcessResult` or an error.
"""

from __future__ import annotations

import array
import contextlib
import errno
import logging
import marshal
import math
import os
import select
import shutil
import signal
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from skilld import telemetry
from skilld.confine import _client, _filters, _identity
from skilld.confine import _launcher as la
from skilld.errors import ConfinementUnavailable, ProgramNotStarted

# Tests set this to simulate a kernel with an older (or no, ``0``) Landlock. It can
# only lower the ABI the runner believes in, so at worst it makes commands refused.
SIMULATE_ABI_ENV = "SKILLD_CONFINE_LANDLOCK_ABI"
MIN_ABI = 3  # REFER (2) and TRUNCATE (3): without them a write grant leaks outside it
MAX_PORT_RULES = 1024
OUTPUT_CAP = 1 << 20
# What the program itself needs to run, read-only (following the system's own links).
SYSTEM_LIBRARIES = (
    "/lib",
    "/lib32",
    "/lib64",
    "/usr/lib",
    "/usr/lib32",
    "/usr/lib64",
    "/usr/local/lib",
    "/etc/ld.so.cache",
    "/usr/share/locale",
    "/usr/share/zoneinfo",
    "/etc/localtime",
    "/nix/store",
)
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
# What resolving names and checking TLS certificates read, read-only, for a command that
# shares the host's network (public data: no secret lives in these).
NETWORK_FILES = (
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/nsswitch.conf",
    "/etc/host.conf",
    "/etc/gai.conf",
    "/etc/services",
    "/etc/protocols",
    "/etc/ssl/certs",
    "/etc/ssl/cert.pem",
    "/etc/ca-certificates",
    "/etc/pki/tls/certs",
    "/usr/share/ca-certificates",
)
# After the kill request, how long the launcher has to end the tree and report.
_KILL_GRACE_S = 5.0
# After the tree is gone, how long the output pipes may take to reach EOF.
_DRAIN_GRACE_S = 1.0
# How often a command's caller is asked whether it cancelled (the sandbox looks at a
# running guest about as often).
_CANCEL_POLL_S = 0.01


@dataclass(frozen=True)
class ResourceLimits:
    """rlimits of the confined command (``None``: the host's own limit).

    ``processes`` bounds the command's whole tree: RLIMIT_NPROC, counted per uid (the
    call's own, which is never root and no other running call has; with a shared
    identity, on top of what skilld's uid already runs). ``cpu_seconds`` of ``None`` is
    the deadline's length rounded up. ``memory`` bounds the whole tree together (bytes
    of anonymous and shared memory its processes hold, measured by the launcher's
    per-call reaper every 10 ms; over it, the tree is killed and the result says so).
    """

    address_space: int | None = 4 << 30
    memory: int | None = None
    cpu_seconds: int | None = None
    processes: int = 64
    file_size: int | None = 1 << 30
    open_files: int = 256


@dataclass(frozen=True)
class Confinement:
    """What a confined command may reach; everything else is refused by the kernel.

    Paths in ``read_only`` and ``read_write`` are grants: opened without following
    symlinks (a grant path through a link gives no access). ``executables`` (besides
    the program and its ELF interpreter, which :func:`run` adds), ``libraries`` and
    ``devices`` are the system's and follow its links. ``tcp_connect``/``tcp_bind``
    are Landlock port rules in the host's network; with neither and ``network`` off,
    the command gets an empty network namespace. ``network`` on is the host's whole
    network (no TCP rules).

    ``temp_paths`` (``/tmp/NAME``, declared by the operator) are made fresh for each
    call as directories of the command's uid, granted read-write beneath, removed after;
    calls naming one run one at a time (docs/confinement.md).
    """

    read_only: tuple[str, ...] = ()
    read_write: tuple[str, ...] = ()
    executables: tuple[str, ...] = ()
    libraries: tuple[str, ...] = SYSTEM_LIBRARIES
    devices: tuple[str, ...] = DEVICES
    tcp_connect: tuple[int, ...] = ()
    tcp_bind: tuple[int, ...] = ()
    network: bool = False
    socket_dirs: tuple[str, ...] = ()
    temp_paths: tuple[str, ...] = ()
    limits: ResourceLimits = field(default_factory=ResourceLimits)
    skill: str | None = None
    workspace: str | None = None

    @property
    def shares_network(self) -> bool:
        """True when the command stays in the host's network namespace."""
        return self.network or bool(self.tcp_connect or self.tcp_bind)


@dataclass(frozen=True)
class ProcessResult:
    """How a confined command ended.

    ``exit_code`` is ``None`` when a signal ended it (``signal``); ``dropped`` counts
    output bytes read past the cap and thrown away; ``timed_out`` says the deadline
    ended the tree, ``cancelled`` that the caller's ``cancelled()`` did, ``memory`` (the
    bytes measured, else 0) that the tree went over its ``ResourceLimits.memory``,
    ``tasks`` (the tasks counted, else 0) that it went over ``ResourceLimits.processes``
    where the kernel does not bound them (a shared identity that is uid 0).
    """

    exit_code: int | None
    signal: int | None
    stdout: bytes
    stderr: bytes
    dropped: int
    timed_out: bool
    duration: float
    cancelled: bool = False
    memory: int = 0
    tasks: int = 0


def landlock_abi() -> int:
    """The Landlock ABI this runner may use: the kernel's, or less when simulated.

    ``SKILLD_CONFINE_LANDLOCK_ABI=N`` makes the runner act as if the kernel had ABI
    ``N`` (``0``: no Landlock); it is read at each call, so a test can set it with
    ``monkeypatch.setenv``. It never raises the ABI above the kernel's.
    """
    abi = _kernel_abi()
    simulated = os.environ.get(SIMULATE_ABI_ENV)
    if simulated is not None and simulated.strip().isdigit():
        abi = min(abi, int(simulated))
    return abi


_abi_cache: list[int] = []


def _kernel_abi() -> int:
    if not _abi_cache:
        _abi_cache.append(la.landlock_abi())
    return _abi_cache[0]


def require(confinement: Confinement) -> int:
    """The Landlock ABI to use for ``confinement``, after checking the kernel and the
    launcher have every layer it needs.

    Raises:
        ConfinementUnavailable: naming the missing feature; nothing is run.
    """
    abi = landlock_abi()
    hint = (
        "run skilld on Linux 6.7 or later with Landlock enabled (boot parameter lsm= with landlock)"
    )
    if abi == 0:
        raise ConfinementUnavailable(
            "Landlock is not available in this kernel; commands are refused rather than "
            "run unconfined",
            feature="landlock",
            hint=hint,
        )
    if abi < MIN_ABI:
        raise ConfinementUnavailable(
            f"Landlock ABI {abi} cannot confine file truncation and cross-directory links "
            f"(ABI {MIN_ABI} needed)",
            feature="landlock",
            hint=hint,
        )
    if confinement.shares_network and abi < 6:
        need = "TCP port rules (ABI 4)" if abi < 4 else "scoping of abstract unix sockets (ABI 6)"
        raise ConfinementUnavailable(
            f"Landlock ABI {abi} lacks {need}, needed for a command that shares the host's network",
            feature="landlock-tcp" if abi < 4 else "landlock-scope",
            hint=hint,
        )
    if confinement.socket_dirs and confinement.shares_network:
        raise ConfinementUnavailable(
            "a command that makes its own unix sockets gets no connect() at all, so that "
            "no pathname socket outside it is reachable; it cannot also have network",
            feature="local-sockets",
            hint="do not grant tcp or http to a skill whose programs listen on a local socket",
        )
    walls = _client.profile()
    if confinement.temp_paths and walls.identity == "shared":
        raise ConfinementUnavailable(
            "a command with declared temporary paths needs its own uid: the directories "
            "are made for it, and sharing skilld's uid it could reach skilld's files in /tmp",
            feature="temp-paths",
            hint="run skilld where it can give each skill its own uid (as root, or with "
            "SKILLD_RUN_AS as the image does)",
        )
    if confinement.socket_dirs and walls.identity == "shared":
        raise ConfinementUnavailable(
            "a command that makes its own unix sockets must remove them (LibreOffice "
            "removes its pipe before it restarts), and sharing skilld's uid it could then "
            "remove skilld's own files there",
            feature="local-sockets",
            hint="run skilld where it can give each skill its own uid (as root, or with "
            "SKILLD_RUN_AS as the image does)",
        )
    if not walls.seccomp:
        # Pathname unix sockets (a 0666 one answers any uid), keyrings, and metadata
        # where the identity is shared: no other wall governs them.
        raise ConfinementUnavailable(
            "no seccomp filter to refuse what Landlock and file modes do not govern "
            "(pathname unix sockets, keyrings"
            + (", metadata changes" if walls.identity == "shared" else "")
            + "); commands are refused",
            feature="seccomp",
            hint=f"make the seccomp filter available: {_filters.why_not()}",
        )
    if not confinement.shares_network and "net" not in walls.namespaces:
        if not walls.seccomp:
            raise ConfinementUnavailable(
                "no network namespace can be made here and no seccomp filter refuses UDP, "
                "raw and netlink sockets; commands are refused",
                feature="seccomp",
                hint=f"make the seccomp filter available: {_filters.why_not()}",
            )
        if abi < 4:
            raise ConfinementUnavailable(
                f"no network namespace can be made here and Landlock ABI {abi} has no TCP "
                "rules (ABI 4) to keep the command off the network",
                feature="landlock-tcp",
                hint=hint,
            )
    if abi < 6 and walls.identity == "shared":
        raise ConfinementUnavailable(
            f"the command would share skilld's uid, and Landlock ABI {abi} cannot keep it "
            "from signalling skilld's processes (ABI 6 scopes signals)",
            feature="landlock-scope",
            hint=hint,
        )
    ports = len(confinement.tcp_connect) + len(confinement.tcp_bind)
    if ports > MAX_PORT_RULES:
        raise ConfinementUnavailable(
            f"{ports} TCP ports granted; the runner adds at most {MAX_PORT_RULES} port rules",
            feature="landlock-tcp",
            hint="grant the ports the command needs, not a wide range",
        )
    return abi


def _open_regular(path: str) -> BinaryIO:
    """``path`` opened for reading, if it is a regular file: never blocks on a FIFO or a
    device planted where a program was expected.

    Raises:
        OSError: it cannot be opened, or is not a regular file.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", path)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def elf_interpreter(path: str) -> str | None:
    """The dynamic loader an ELF file names (``PT_INTERP``), or ``None`` (static, not ELF)."""
    try:
        with _open_regular(path) as f:
            head = f.read(64)
            if len(head) < 52 or head[:4] != b"\x7fELF":
                return None
            wide, order = head[4] == 2, "<" if head[5] == 1 else ">"
            if wide:
                (phoff,) = struct.unpack_from(order + "Q", head, 0x20)
                phentsize, phnum = struct.unpack_from(order + "HH", head, 0x36)
            else:
                (phoff,) = struct.unpack_from(order + "I", head, 0x1C)
                phentsize, phnum = struct.unpack_from(order + "HH", head, 0x2A)
            for i in range(min(phnum, 256)):
                f.seek(phoff + i * phentsize)
                ph = f.read(phentsize)
                if len(ph) < (56 if wide else 32) or struct.unpack_from(order + "I", ph)[0] != 3:
                    continue
                if wide:
                    offset, size = (
                        struct.unpack_from(order + "Q", ph, 8)[0],
                        struct.unpack_from(order + "Q", ph, 32)[0],
                    )
                else:
                    offset, size = (
                        struct.unpack_from(order + "I", ph, 4)[0],
                        struct.unpack_from(order + "I", ph, 16)[0],
                    )
                f.seek(offset)
                return f.read(min(size, 4096)).rstrip(b"\x00").decode()
    except (OSError, struct.error, UnicodeDecodeError):
        return None
    return None


def _shebang(path: str, search: str) -> tuple[list[str], bool]:
    """The programs a script's ``#!`` line runs: its interpreter and, for
    ``#!/usr/bin/env NAME``, NAME as found in ``search``; and whether ``search`` was
    looked in (then the answer depends on more than this file)."""
    try:
        with _open_regular(path) as f:
            line = f.readline(256)
    except OSError:
        return [], False
    if not line.startswith(b"#!"):
        return [], False
    words = line[2:].decode(errors="replace").split()
    if not words:
        return [], False
    out = [words[0]]
    rest = [w for w in words[1:] if not w.startswith("-")]
    if Path(words[0]).name == "env" and rest:
        found = shutil.which(rest[0], path=search)
        if found:
            out.append(found)
        return out, True
    return out, False


# A file as :func:`program_files` read it: replaced, rewritten or changed in any way, it
# has another key (inode, modification and change times, size).
_FileKey = tuple[int, int, int, int, int]
# (program, search) -> (the answer, each path it followed with the key of its file).
_programs: dict[tuple[str, str], tuple[tuple[str, ...], tuple[tuple[str, _FileKey], ...]]] = {}
_PROGRAMS_KEPT = 256


def _file_key(path: str) -> _FileKey | None:
    """The key of the file ``path`` names, through its links."""
    try:
        st = os.stat(path)  # noqa: PTH116 - per command: pathlib's parsing costs more
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size


def program_files(program: str, search: str = os.defpath) -> tuple[str, ...]:
    """What the kernel executes to run ``program``: itself, a script's interpreter (and
    the program ``#!/usr/bin/env`` finds in ``search``) and their ELF loaders, as real
    paths (Landlock rules apply where files really are).

    Kept per ``(program, search)`` and used again only while every path followed
    still names a file of the same key (:data:`_FileKey`, through links: Landlock's
    rules hold inodes, so the same inode by another real path is the same rule): a link
    moved or a file replaced or rewritten reads the files again. An answer that
    looked ``#!/usr/bin/env NAME`` up in ``search`` is not kept (a new NAME earlier in
    ``search`` changes it)."""
    kept = _programs.get((program, search))
    if kept is not None and all(_file_key(name) == key for name, key in kept[1]):
        return kept[0]
    out: list[str] = []
    followed: list[tuple[str, _FileKey | None]] = []
    searched = False
    todo: list[str] = [program]
    while todo and len(out) < 8:
        name = todo.pop()
        path = _real(name)
        followed.append((name, _file_key(path)))
        if path in out:
            continue
        out.append(path)
        interpreters, looked = _shebang(path, search)
        searched = searched or looked
        todo += [f for f in (elf_interpreter(path), *interpreters) if f and f.startswith("/")]
    steps = tuple((n, k) for n, k in followed if k is not None)
    if not searched and len(steps) == len(followed):
        if len(_programs) >= _PROGRAMS_KEPT:
            _programs.clear()
        _programs[(program, search)] = (tuple(out), steps)
    return tuple(out)


def _real(path: str) -> str:
    """``os.path.realpath``, retried when a link changes under it (it lstat()s, then
    readlink()s); a program path that keeps changing is not started.

    Raises:
        ProgramNotStarted: ``ENOENT``, the path kept changing.
    """
    for _ in range(8):
        try:
            return os.path.realpath(path)
        except OSError:
            continue
    raise ProgramNotStarted(
        f"program {path!r} kept changing while it was resolved", errno=errno.ENOENT, location=path
    )


def resolve_program(name: str, env: Mapping[str, str]) -> str:
    """The path ``execve`` will run for ``name`` (searched in the command's ``PATH``).

    Raises:
        ProgramNotStarted: ``ENOENT`` when no such program is found.
    """
    found = name if "/" in name else shutil.which(name, path=env.get("PATH", os.defpath))
    if found is None or not Path(found).exists():
        raise ProgramNotStarted(f"program {name!r} not found", errno=errno.ENOENT, location=name)
    return found


_log = logging.getLogger("skilld.confine")

# -- the spec ------------------------------------------------------------------


def _landlock(
    abi: int, confinement: Confinement, program: str, env: Mapping[str, str]
) -> tuple[int, int, int, int, list[tuple[str, int, bool]], list[int], list[int]]:
    """The ruleset as the launcher applies it: handled fs and net rights, scopes, the
    struct's size for this ABI, and the (path, rights, follow links) and port rules.

    In ``socket_dirs`` the command may make sockets and remove files: it runs as its
    skill's own uid (``require``), so the sticky ``/tmp`` lets it remove only what that
    uid owns."""
    handled = la.fs_rights(abi)
    net = la.NET_BIND_TCP | la.NET_CONNECT_TCP if abi >= 4 and not confinement.network else 0
    scoped = la.SCOPE_ABSTRACT_UNIX_SOCKET | la.SCOPE_SIGNAL if abi >= 6 else 0
    # The struct as the kernel of that ABI knows it (an older kernel refuses a longer one).
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    rules: list[tuple[str, int, bool]] = []
    libraries = [*confinement.libraries, *(NETWORK_FILES if confinement.shares_network else ())]
    executables = [*program_files(program, env.get("PATH", os.defpath)), *confinement.executables]
    sockets = la.FS_MAKE_SOCK | la.FS_REMOVE_FILE
    # Declared temporary paths are not here: the call's process makes them, then adds
    # their rules (``late_paths`` of the spec).
    for paths, access, follow in (
        (libraries, la.READ, True),
        (executables, la.EXEC, True),
        (confinement.devices, la.DEVICE, True),
        (confinement.read_only, la.READ, False),
        (confinement.read_write, la.WRITE, False),
        (confinement.socket_dirs, sockets, False),
    ):
        rules += [(path, access & handled, follow) for path in paths]
    connect = sorted(set(confinement.tcp_connect)) if net else []
    bind = sorted(set(confinement.tcp_bind)) if net else []
    return handled, net, scoped, size, rules, connect, bind


_tasks_seen: list[tuple[float, int]] = []


def _shared_tasks(uid: int) -> int:
    """How many tasks ``uid`` runs (RLIMIT_NPROC counts them all, skilld's included),
    counted at most once a second: a scan of ``/proc`` costs milliseconds on a busy host,
    and the bound it gives is approximate anyway."""
    now = time.monotonic()
    if _tasks_seen and now - _tasks_seen[0][0] < 1.0:
        return _tasks_seen[0][1]
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            if entry.stat().st_uid == uid:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    count += int(f.read().rsplit(b")", 1)[1].split()[17])
    _tasks_seen[:] = [(now, count)]
    return count


_warned: set[tuple[str, int]] = set()


def _warn_unwritable(confinement: Confinement, uid: int) -> None:
    """Log, once per grant and skill, a read-write grant the calls of the skill numbered
    ``uid`` cannot write to (the operator has to ``chown`` and ``chmod g+w`` it; the
    command runs and gets "Permission denied")."""
    for path in confinement.read_write:
        if path == confinement.workspace or (path, uid) in _warned:
            continue
        problem = _identity.unwritable(path, uid)
        if problem is not None:
            _warned.add((path, uid))
            _log.warning("%s (skill %s)", problem, confinement.skill)


def _spec(
    program: str,
    argv: Sequence[str],
    confinement: Confinement,
    *,
    abi: int,
    cwd: str,
    env: Mapping[str, str],
    deadline: float,
    identity: tuple[int, int] | None,
) -> dict[str, Any]:
    hello = _client.launcher().hello
    separate = identity is not None
    lim = confinement.limits
    processes = lim.processes
    if identity is not None:
        _warn_unwritable(confinement, identity[1])
    else:
        processes += _shared_tasks(int(hello["uid"]))
    seconds = max(deadline - time.monotonic(), 0.0)
    cpu = lim.cpu_seconds if lim.cpu_seconds is not None else math.ceil(seconds) + 1
    spaces = _client.namespaces(hello, _filters.available(), abi)
    bpf = _filters.program(
        unix_sockets=_filters.names_socket((*confinement.read_only, *confinement.read_write)),
        udp=confinement.network,
        metadata=not separate,
        local_sockets=bool(confinement.socket_dirs),
        # Without an IPC namespace of its own, System V IPC and message queues are the
        # host's: one call could plant what a later call of another client reads.
        ipc="ipc" not in spaces,
    )
    unshare = la.CLONE_NEWIPC if "ipc" in spaces else 0
    if "net" in spaces and not confinement.shares_network:
        unshare |= la.CLONE_NEWNET
    return {
        "program": program,
        "argv": list(argv),
        "env": dict(env),
        "cwd": cwd,
        "landlock": _landlock(abi, confinement, program, env),
        "late_paths": [(p, la.WRITE & la.fs_rights(abi), False) for p in confinement.temp_paths],
        "unshare": unshare,
        "identity": identity,
        # The uids of the skill's slot: what a leftover temporary path may belong to.
        "slot": (identity[1], identity[1] + _identity.SLOT - 1) if identity else None,
        "owner": int(hello["uid"]),
        "workspace": confinement.workspace if separate else None,
        "socket_dirs": list(confinement.socket_dirs),
        "temp_paths": list(confinement.temp_paths),
        "seccomp": bpf,
        "until": deadline + _KILL_GRACE_S,
        "memory": lim.memory,
        # RLIMIT_NPROC never bounds uid 0 (whatever its capabilities): a shared identity
        # that is root has its tree's tasks counted by the launcher instead.
        "tasks": lim.processes if identity is None and int(hello["uid"]) == 0 else None,
        "rlimits": {
            "RLIMIT_AS": lim.address_space,
            "RLIMIT_CPU": cpu,
            "RLIMIT_NPROC": processes,
            "RLIMIT_FSIZE": lim.file_size,
            "RLIMIT_NOFILE": lim.open_files,
            "RLIMIT_CORE": 0,
        },
    }


# -- running -----------------------------------------------------------------


def _parse_status(data: bytes) -> list[tuple[str, int, str]]:
    """The launcher's status lines: ``(kind, value, text)``."""
    out = []
    for line in data.decode(errors="replace").splitlines():
        kind, _, rest = line.partition(" ")
        value, _, text = rest.partition(" ")
        if value.lstrip("-").isdigit():
            out.append((kind, int(value), text))
    return out


def _unavailable(argv0: str, feature: str, detail: str) -> ConfinementUnavailable:
    return ConfinementUnavailable(
        f"cannot confine {argv0}: {feature} unavailable ({detail}); the command was not run",
        feature=feature,
    )


def _ruleset(rules: Sequence[Any], argv0: str) -> int:
    """The command's Landlock ruleset, built here (skilld's uid opens the same paths the
    launcher's would) while the launcher forks the call's process, and sent with the spec.

    Raises:
        ConfinementUnavailable: Landlock refused the ruleset or a rule.
    """
    try:
        return la.landlock_ruleset(rules)
    except la.Unavailable as exc:
        raise _unavailable(argv0, exc.feature, exc.detail) from exc


def _outcome(status: Iterable[tuple[str, int, str]], argv0: str) -> tuple[int | None, int | None]:
    """The command's (exit code, signal) from the launcher's status lines.

    Raises:
        ConfinementUnavailable: the launcher could not confine the command.
        ProgramNotStarted: ``chdir`` or ``execve`` failed.
    """
    for kind, value, text in status:
        if kind == "unavailable":
            feature, _, detail = text.partition(": ")
            raise _unavailable(argv0, feature, detail)
        if kind == "temp":
            raise ConfinementUnavailable(
                f"cannot run {argv0}: {text}; the command was not run", feature="temp-paths"
            )
        if kind == "internal":
            raise ConfinementUnavailable(
                f"cannot confine {argv0}: the launcher failed ({text}); the command was not run",
                feature="launcher",
            )
        if kind in ("execve", "chdir"):
            what = "start" if kind == "execve" else "enter directory"
            raise ProgramNotStarted(
                f"cannot {what} {text}: {os.strerror(value)}", errno=value, location=text
            )
        if kind == "exit":
            return value, None
        if kind == "signal":
            return None, value
    return None, None


class _Call:
    """One command's descriptors on the host's side, pumped by the calling thread."""

    def __init__(self, stdin: bytes, cap: int):
        self.sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        stdin_r, self.stdin_w = os.pipe()
        self.out_r, out_w = os.pipe()
        self.err_r, err_w = os.pipe()
        self.child_fds: tuple[int, ...] = (child_sock.detach(), stdin_r, out_w, err_w)
        self.data = memoryview(stdin)
        self.cap = cap
        self.out, self.err, self.status = bytearray(), bytearray(), bytearray()
        self.dropped = 0
        # The spec went to the launcher (the command may run), and it reported the end.
        self.sent = self.reported = False

    def close_child_side(self) -> None:
        # The launcher holds its own copies once they are sent; once only, as above.
        for fd in self.child_fds:
            os.close(fd)
        self.child_fds = ()

    def close(self) -> None:
        self.close_child_side()
        self.sock.close()
        self._close_stdin()
        for fd in (self.out_r, self.err_r):
            os.close(fd)

    def _close_stdin(self) -> None:
        # Once only: another thread's call may get the number next.
        if self.stdin_w >= 0:
            os.close(self.stdin_w)
            self.stdin_w = -1

    def launch(self) -> None:
        """Send the descriptors to the launcher (restarted once if gone): it forks the
        call's process, which waits for the spec (:meth:`send_spec`) and ends when the
        call socket closes without one.

        Raises:
            ConfinementUnavailable: no launcher could take the command.
        """
        try:
            current = _client.launcher()
            try:
                current.send(self.child_fds)
            except OSError:
                current = _client.restart_if(current)
                current.send(self.child_fds)
        except OSError as exc:
            raise ConfinementUnavailable(
                f"the confinement launcher is gone ({exc}); the command was not run",
                feature="launcher",
            ) from exc
        finally:
            self.close_child_side()

    def send_spec(self, spec: dict[str, Any], ruleset: int) -> None:
        """Send the command's spec and its Landlock ``ruleset`` to the call's process
        (after :meth:`launch`).

        Raises:
            ConfinementUnavailable: the call's process is gone.
        """
        self.sent = True
        body = marshal.dumps(spec)
        data = memoryview(len(body).to_bytes(4, "little") + body)
        rights = (socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", (ruleset,)))
        try:
            # The descriptor travels with the first byte; the rest after it if the socket
            # took only part (never an empty send: the command may have ended by now).
            sent = self.sock.sendmsg([data], [rights])
            if sent < len(data):
                self.sock.sendall(data[sent:])
        except OSError as exc:
            raise ConfinementUnavailable(
                f"the confinement launcher dropped the command ({exc}); it was not run",
                feature="launcher",
            ) from exc

    def pump(self, deadline: float, cancelled: Callable[[], bool] | None) -> str:
        """Feed, drain and wait until the launcher reports the end: ``exited``,
        ``deadline`` or ``cancelled`` (then the tree was ended on request)."""
        poller = select.poll()
        sock = self.sock.fileno()
        pipes = {self.out_r, self.err_r}
        for fd in (sock, *pipes):
            poller.register(fd, select.POLLIN)
        if self.data:
            os.set_blocking(self.stdin_w, False)
            poller.register(self.stdin_w, select.POLLOUT)
        else:
            self._close_stdin()
        ended = "exited"
        killed_at = reported_at = None
        while True:
            now = time.monotonic()
            if reported_at is None and killed_at is None:
                if cancelled is not None and cancelled():
                    ended = "cancelled"
                elif now >= deadline:
                    ended = "deadline"
                if ended != "exited":
                    killed_at = now
                    with contextlib.suppress(OSError):
                        self.sock.send(b"K")
            if reported_at is not None:
                # The tree is gone: the pipes reach EOF at once (or a moment later).
                if not pipes or now >= reported_at + _DRAIN_GRACE_S:
                    break
                until = reported_at + _DRAIN_GRACE_S
            elif killed_at is not None:
                if now >= killed_at + _KILL_GRACE_S:
                    break  # the launcher did not answer: give up on this call
                until = killed_at + _KILL_GRACE_S
            else:
                until = deadline if cancelled is None else min(deadline, now + _CANCEL_POLL_S)
            for fd, _ in poller.poll(max(math.ceil((until - now) * 1000), 0)):
                if fd == self.stdin_w >= 0:
                    self._feed(poller)
                    continue
                try:
                    chunk = self.sock.recv(4096) if fd == sock else os.read(fd, 65536)
                except ConnectionResetError:
                    # The per-command process closed its end with our kill request
                    # unread (it had already ended the tree): that is its report's end.
                    chunk = b""
                if not chunk:
                    poller.unregister(fd)
                    pipes.discard(fd)
                    if fd == sock:
                        reported_at = time.monotonic()
                        self.reported = True
                elif fd == sock:
                    self.status += chunk
                else:
                    self._keep(self.out if fd == self.out_r else self.err, chunk)
        return ended

    def _feed(self, poller: select.poll) -> None:
        try:
            sent = os.write(self.stdin_w, self.data[:65536])
            self.data = self.data[sent:]
        except BlockingIOError:
            return
        except OSError:
            # A command that closes its stdin early gets what it read.
            self.data = self.data[:0]
        if not self.data:
            poller.unregister(self.stdin_w)
            self._close_stdin()

    def _keep(self, into: bytearray, chunk: bytes) -> None:
        room = self.cap - len(into)
        if room > 0:
            into += chunk[:room]
        self.dropped += max(0, len(chunk) - max(room, 0))


_temp_locks: dict[str, threading.Lock] = {}
_temp_locks_guard = threading.Lock()
_LOCK_POLL_S = 0.05


def _hold_temp_paths(
    paths: Sequence[str], deadline: float, cancelled: Callable[[], bool] | None
) -> list[threading.Lock] | None:
    """Take the lock of each of ``paths`` (sorted: no deadlock between two calls), waiting
    for the calls holding them, until ``deadline`` or ``cancelled()``; ``None`` then,
    with nothing held."""
    with _temp_locks_guard:
        locks = [_temp_locks.setdefault(p, threading.Lock()) for p in sorted(set(paths))]
    held: list[threading.Lock] = []
    for lock in locks:
        while True:
            left = deadline - time.monotonic()
            if left > 0 and lock.acquire(timeout=min(left, _LOCK_POLL_S)):
                held.append(lock)
                break
            if left <= 0 or (cancelled is not None and cancelled()):
                for taken in held:
                    taken.release()
                return None
    return held


def run(
    argv: Sequence[str],
    *,
    confinement: Confinement,
    deadline: float,
    cwd: str = "/",
    env: Mapping[str, str] | None = None,
    stdin: bytes = b"",
    output_cap: int = OUTPUT_CAP,
    cancelled: Callable[[], bool] | None = None,
) -> ProcessResult:
    """Run ``argv`` confined, to its end, to ``deadline`` (``time.monotonic()``) or until
    ``cancelled()`` says so (asked every 10 ms). Safe to call from many threads at once.

    ``env`` is the command's whole environment (nothing of the host's leaks in);
    ``stdout`` and ``stderr`` each keep ``output_cap`` bytes and the rest is read and
    dropped. When the program exits, at the deadline or on cancellation, every process
    it started is killed (the launcher's per-command subreaper ends the tree).

    A command with ``temp_paths`` waits for the commands holding any of them (in this
    process) within its deadline; a deadline or cancellation met while waiting ends it
    as such, not started.

    Raises:
        ConfinementUnavailable: the kernel or the launcher lacks what ``confinement``
            needs; never run unconfined.
        ProgramNotStarted: the program is missing, not executable or refused by
            Landlock, or ``cwd`` cannot be entered.
    """
    held: list[threading.Lock] = []
    if confinement.temp_paths:
        taken = _hold_temp_paths(confinement.temp_paths, deadline, cancelled)
        if taken is None:
            cancelled_now = cancelled is not None and cancelled()
            return ProcessResult(None, None, b"", b"", 0, not cancelled_now, 0.0, cancelled_now)
        held = taken
    try:
        with telemetry.span("skilld.process", {"process.executable.name": Path(argv[0]).name}):
            return _run(
                argv, confinement=confinement, deadline=deadline, cwd=cwd, env=env,
                stdin=stdin, output_cap=output_cap, cancelled=cancelled,
            )  # fmt: skip
    finally:
        for lock in held:
            lock.release()


def _run(
    argv: Sequence[str],
    *,
    confinement: Confinement,
    deadline: float,
    cwd: str,
    env: Mapping[str, str] | None,
    stdin: bytes,
    output_cap: int,
    cancelled: Callable[[], bool] | None,
) -> ProcessResult:
    if not argv or not argv[0] or any("\x00" in a for a in argv):
        raise ProgramNotStarted("argv must name a program, without NUL bytes", errno=errno.EINVAL)
    environment = telemetry.environ(dict(env or {}))  # TRACEPARENT: the script joins the trace
    abi = require(confinement)
    program = resolve_program(argv[0], environment)
    start = time.monotonic()
    if deadline <= start:
        # No time left: nothing is started.
        return ProcessResult(None, None, b"", b"", 0, True, 0.0)
    hello = _client.launcher().hello
    identity: tuple[int, int] | None = None
    if _client.identity_mode(hello) == "separate":
        group = _identity.uid_for(confinement.skill, _client.forbidden_uids(hello))
        uid = _identity.take(group, deadline, cancelled)
        if uid is None:
            # Every uid of the skill's slot is running a call until the deadline.
            cancelled_now = cancelled is not None and cancelled()
            return ProcessResult(None, None, b"", b"", 0, not cancelled_now, 0.0, cancelled_now)
        identity = (uid, group)
    call = _Call(stdin, output_cap)
    try:
        with telemetry.span("skilld.process.launch"):
            # The descriptors first: the launcher forks the call's process while this
            # thread builds the spec (on two cores, the fork costs the command nothing).
            call.launch()
            spec = _spec(
                program, argv, confinement, abi=abi, cwd=cwd, env=environment,
                deadline=deadline, identity=identity,
            )  # fmt: skip
            ruleset = _ruleset(spec.pop("landlock"), argv[0])
            try:
                call.send_spec(spec, ruleset)
            finally:
                os.close(ruleset)
        with telemetry.span("skilld.process.run"):
            ended = call.pump(deadline, cancelled)
    finally:
        call.close()
        # The uid is free once its call reported (the launcher ends the tree before it
        # does) or never got it; a call that did not report keeps it out of use.
        if identity is not None and (call.reported or not call.sent):
            _identity.give_back(identity[1], identity[0])
        elif identity is not None:
            _log.warning(
                "the launcher never reported the end of %s (skill %s): uid %d stays out of "
                "use until skilld restarts",
                argv[0], confinement.skill, identity[0],
            )  # fmt: skip
    duration = time.monotonic() - start
    status = _parse_status(bytes(call.status))
    out, err = bytes(call.out), bytes(call.err)
    for kind, value, _ in status:
        if kind == "memory":
            # The reaper ended the tree: over its memory limit, whatever came after.
            return ProcessResult(
                None, signal.SIGKILL, out, err, call.dropped, False, duration, memory=value
            )
        if kind == "tasks":
            # The reaper ended the tree: over its process limit (uid 0, unbounded else).
            return ProcessResult(
                None, signal.SIGKILL, out, err, call.dropped, False, duration, tasks=value
            )
    if any(kind == "killed" for kind, _, _ in status):
        # On request, or (``exited``) by the launcher's own deadline backstop.
        return ProcessResult(
            None, signal.SIGKILL, out, err, call.dropped,
            ended != "cancelled", duration, ended == "cancelled",
        )  # fmt: skip
    code, sig = _outcome(status, argv[0])
    if code is None and sig is None:
        if ended != "exited":
            return ProcessResult(
                None, signal.SIGKILL, out, err, call.dropped,
                ended != "cancelled", duration, ended == "cancelled",
            )  # fmt: skip
        raise ConfinementUnavailable(
            f"cannot confine {argv[0]}: the launcher ended the command without a status; "
            "it may not have run",
            feature="launcher",
        )
    return ProcessResult(code, sig, out, err, call.dropped, False, duration)
