"""The confined-process runner: one call of :func:`run` is one command under the kernel's walls.

The host side. It checks that the kernel has what the :class:`Confinement` needs
(failing closed with :class:`~skilld.errors.ConfinementUnavailable`), starts the
trampoline (``_trampoline.py``, see its docstring for the three processes) through
``subprocess`` with the spec on a pipe, feeds stdin, drains and caps stdout and
stderr, ends the whole process tree at the deadline, and turns the status line the
trampoline wrote into a :class:`ProcessResult` or an error.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import marshal
import math
import os
import select
import shutil
import signal
import stat
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, BinaryIO

from skilld.confine import _seccomp
from skilld.confine import _trampoline as tr
from skilld.errors import ConfinementUnavailable, ProgramNotStarted

# Tests set this to simulate a kernel with an older (or no, ``0``) Landlock. It can
# only lower the ABI the runner believes in, so at worst it makes commands refused.
SIMULATE_ABI_ENV = "SKILLD_CONFINE_LANDLOCK_ABI"
MIN_ABI = 3  # REFER (2) and TRUNCATE (3): without them a write grant leaks outside it
MAX_PORT_RULES = 1024
OUTPUT_CAP = 1 << 20
TRAMPOLINE = str(Path(tr.__file__).resolve())
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
# After SIGTERM to the trampoline, how long it has to empty the namespace.
_KILL_GRACE_S = 2.0
# After the tree is gone, how long the output pipes may take to reach EOF.
_DRAIN_GRACE_S = 1.0
_PIDS_V1 = Path("/sys/fs/cgroup/pids")


@dataclass(frozen=True)
class ResourceLimits:
    """rlimits of the confined command (``None``: the host's own limit).

    ``processes`` bounds the command's whole tree: RLIMIT_NPROC in the command's own
    user namespace (it counts from zero there), or a pids cgroup when skilld runs as
    root (root is exempt from RLIMIT_NPROC). ``cpu_seconds`` of ``None`` is the
    deadline's length rounded up.
    """

    address_space: int | None = 4 << 30
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
    """

    read_only: tuple[str, ...] = ()
    read_write: tuple[str, ...] = ()
    executables: tuple[str, ...] = ()
    libraries: tuple[str, ...] = SYSTEM_LIBRARIES
    devices: tuple[str, ...] = DEVICES
    tcp_connect: tuple[int, ...] = ()
    tcp_bind: tuple[int, ...] = ()
    network: bool = False
    limits: ResourceLimits = field(default_factory=ResourceLimits)

    @property
    def shares_network(self) -> bool:
        """True when the command stays in the host's network namespace."""
        return self.network or bool(self.tcp_connect or self.tcp_bind)


@dataclass(frozen=True)
class ProcessResult:
    """How a confined command ended.

    ``exit_code`` is ``None`` when a signal ended it (``signal``); ``dropped`` counts
    output bytes read past the cap and thrown away; ``timed_out`` says the deadline
    ended the tree, ``cancelled`` that the caller's ``cancelled()`` did.
    """

    exit_code: int | None
    signal: int | None
    stdout: bytes
    stderr: bytes
    dropped: int
    timed_out: bool
    duration: float
    cancelled: bool = False


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
        _abi_cache.append(tr.landlock_abi())
    return _abi_cache[0]


def require(confinement: Confinement) -> int:
    """The Landlock ABI to use for ``confinement``, after checking the kernel has it.

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


def _shebang(path: str, search: str) -> list[str]:
    """The programs a script's ``#!`` line runs: its interpreter and, for
    ``#!/usr/bin/env NAME``, NAME as found in ``search``."""
    try:
        with _open_regular(path) as f:
            line = f.readline(256)
    except OSError:
        return []
    if not line.startswith(b"#!"):
        return []
    words = line[2:].decode(errors="replace").split()
    if not words:
        return []
    out = [words[0]]
    rest = [w for w in words[1:] if not w.startswith("-")]
    if Path(words[0]).name == "env" and rest:
        found = shutil.which(rest[0], path=search)
        if found:
            out.append(found)
    return out


def program_files(program: str, search: str = os.defpath) -> tuple[str, ...]:
    """What the kernel executes to run ``program``: itself, a script's interpreter (and
    the program ``#!/usr/bin/env`` finds in ``search``) and their ELF loaders, as real
    paths (Landlock rules apply where files really are)."""
    out: list[str] = []
    todo: list[str] = [program]
    while todo and len(out) < 8:
        path = _real(todo.pop())
        if path in out:
            continue
        out.append(path)
        found = [elf_interpreter(path), *_shebang(path, search)]
        todo += [f for f in found if f and f.startswith("/")]
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


# -- pids cgroup (root only) ---------------------------------------------------

_cgroup_lock = threading.Lock()
_cgroup_live: set[Path] = set()
_cgroup_count = itertools.count()


def _cgroup_base() -> Path | None:
    if (_PIDS_V1 / "cgroup.procs").exists():
        return _PIDS_V1 / "skilld"
    try:
        own = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in own:
        if line.startswith("0::"):
            v2 = Path("/sys/fs/cgroup") / line[3:].lstrip("/")
            with contextlib.suppress(OSError):
                if "pids" in (v2 / "cgroup.subtree_control").read_text():
                    return v2 / "skilld"
    return None


def _sweep(base: Path) -> None:
    """Remove the cgroups of calls whose tree was still dying when they ended (this
    process's) and of skilld processes that are gone; a busy one stays."""
    mine = f"{os.getpid()}-"
    for stale in base.iterdir():
        owner = stale.name.partition("-")[0]
        if not stale.is_dir() or not owner.isdigit() or stale in _cgroup_live:
            continue
        if stale.name.startswith(mine) or not Path(f"/proc/{owner}").exists():
            with contextlib.suppress(OSError):
                stale.rmdir()


def _cgroup_create(processes: int) -> Path:
    """A fresh pids cgroup allowing ``processes`` more tasks, for one command's tree.

    Raises:
        ConfinementUnavailable: no writable pids controller.
    """
    base = _cgroup_base()
    if base is None:
        raise _no_cgroup("no pids controller is mounted")
    try:
        base.mkdir(parents=True, exist_ok=True)
        with _cgroup_lock:
            _sweep(base)
            path = base / f"{os.getpid()}-{next(_cgroup_count)}"
            path.mkdir()
            _cgroup_live.add(path)
        # The trampoline and PID 1 of the namespace count too.
        (path / "pids.max").write_text(str(processes + 2))
    except OSError as exc:
        raise _no_cgroup(exc.strerror or str(exc)) from exc
    return path


def _no_cgroup(detail: str) -> ConfinementUnavailable:
    return ConfinementUnavailable(
        "cannot bound the command's processes: a pids cgroup is needed when skilld runs "
        f"as root, which RLIMIT_NPROC does not limit ({detail})",
        feature="pids cgroup",
        hint="run skilld as a non-root user (the image uses uid 10001) or give it a "
        "writable pids cgroup",
    )


def _cgroup_remove(path: Path) -> None:
    with _cgroup_lock:
        _cgroup_live.discard(path)
        # EBUSY while a killed tree is still going: the next call's sweep removes it.
        with contextlib.suppress(OSError):
            path.rmdir()


# -- running -----------------------------------------------------------------


def _drain(stream: IO[bytes], cap: int, out: bytearray, dropped: list[int]) -> None:
    while chunk := stream.read1(65536):  # type: ignore[attr-defined]
        room = cap - len(out)
        if room > 0:
            out += chunk[:room]
        dropped[0] += max(0, len(chunk) - max(room, 0))
    stream.close()


def _feed(stream: IO[bytes], data: bytes) -> None:
    # A command that closes its stdin early gets what it read.
    with contextlib.suppress(OSError):
        stream.write(data)
    with contextlib.suppress(OSError):
        stream.close()


def _spec(
    program: str,
    argv: Sequence[str],
    confinement: Confinement,
    *,
    abi: int,
    cwd: str,
    env: Mapping[str, str],
    seconds: float,
    cgroup: Path | None,
) -> dict[str, Any]:
    lim = confinement.limits
    cpu = lim.cpu_seconds if lim.cpu_seconds is not None else math.ceil(seconds) + 1
    return {
        "program": program,
        "argv": list(argv),
        "env": dict(env),
        "cwd": cwd,
        "abi": abi,
        "host_pid": os.getpid(),
        "cgroup": str(cgroup) if cgroup else None,
        "read_only": list(confinement.read_only),
        "read_write": list(confinement.read_write),
        "executables": [
            *program_files(program, env.get("PATH", os.defpath)),
            *confinement.executables,
        ],
        "libraries": [
            *confinement.libraries,
            *(NETWORK_FILES if confinement.shares_network else ()),
        ],
        "devices": list(confinement.devices),
        # Compiled once per argument tuple. metadata: the command runs as skilld's own
        # uid today (a separate identity per skill will pass False).
        "seccomp": _seccomp.compile_filter(
            unix_sockets=_seccomp.names_socket((*confinement.read_only, *confinement.read_write)),
            udp=False,  # no grant type for UDP exists
            metadata=True,
        ),
        "network": confinement.network,
        "handle_tcp": not confinement.network,
        "tcp_connect": sorted(set(confinement.tcp_connect)),
        "tcp_bind": sorted(set(confinement.tcp_bind)),
        "rlimits": {
            "RLIMIT_AS": lim.address_space,
            "RLIMIT_CPU": cpu,
            # Counted in the command's own user namespace, with the trampoline and init.
            "RLIMIT_NPROC": lim.processes + 2,
            "RLIMIT_FSIZE": lim.file_size,
            "RLIMIT_NOFILE": lim.open_files,
            "RLIMIT_CORE": 0,
        },
    }


# How often a command's caller is asked whether it cancelled (the sandbox looks at a
# running guest about as often).
_CANCEL_POLL_S = 0.01


def _wait(
    proc: subprocess.Popen[bytes], deadline: float, cancelled: Callable[[], bool] | None
) -> str:
    """``exited``, ``deadline`` or ``cancelled``: whichever comes first. The trampoline's
    pidfd wakes this the moment it exits (``Popen.wait(timeout)`` polls with sleeps of up
    to 50 ms)."""
    pidfd = os.pidfd_open(proc.pid)
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        while True:
            if cancelled is not None and cancelled():
                return "cancelled"
            left = deadline - time.monotonic()
            if left <= 0:
                return "exited" if proc.poll() is not None else "deadline"
            step = left if cancelled is None else min(left, _CANCEL_POLL_S)
            if poller.poll(math.ceil(step * 1000)):
                return "exited"
    finally:
        os.close(pidfd)


def _end_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM asks the trampoline to SIGKILL the namespace's init (the whole tree goes
    with it); SIGKILL is the fallback, and the init dies with it (PDEATHSIG)."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=_KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _read_status(fd: int) -> list[tuple[str, int, str]]:
    """The trampoline's status lines: ``(kind, value, text)``."""
    with os.fdopen(fd, "rb") as f:
        data = f.read()
    out = []
    for line in data.decode(errors="replace").splitlines():
        kind, _, rest = line.partition(" ")
        value, _, text = rest.partition(" ")
        if value.lstrip("-").isdigit():
            out.append((kind, int(value), text))
    return out


def _outcome(status: Iterable[tuple[str, int, str]], argv0: str) -> tuple[int | None, int | None]:
    """The command's (exit code, signal) from the trampoline's status lines.

    Raises:
        ConfinementUnavailable: the trampoline could not confine the command.
        ProgramNotStarted: ``chdir`` or ``execve`` failed.
    """
    for kind, value, text in status:
        if kind == "unavailable":
            feature, _, detail = text.partition(": ")
            raise ConfinementUnavailable(
                f"cannot confine {argv0}: {feature} unavailable ({detail}); "
                "the command was not run",
                feature=feature,
            )
        if kind == "internal":
            raise ConfinementUnavailable(
                f"cannot confine {argv0}: the trampoline failed ({text}); the command was not run",
                feature="trampoline",
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
    ``cancelled()`` says so (asked every 10 ms).

    ``env`` is the command's whole environment (nothing of the host's leaks in);
    ``stdout`` and ``stderr`` each keep ``output_cap`` bytes and the rest is read and
    dropped. When the program exits, at the deadline or on cancellation, every process
    it started is killed (they live in its PID namespace).

    Raises:
        ConfinementUnavailable: the kernel lacks what ``confinement`` needs; never
            run unconfined.
        ProgramNotStarted: the program is missing, not executable or refused by
            Landlock, or ``cwd`` cannot be entered.
    """
    if not argv or not argv[0] or any("\x00" in a for a in argv):
        raise ProgramNotStarted("argv must name a program, without NUL bytes", errno=errno.EINVAL)
    environment = dict(env or {})
    abi = require(confinement)
    program = resolve_program(argv[0], environment)
    start = time.monotonic()
    if deadline <= start:
        # No time left: nothing is started.
        return ProcessResult(None, None, b"", b"", 0, True, 0.0)
    with _pids_cgroup(confinement.limits.processes) as cgroup:
        spec = _spec(
            program, argv, confinement, abi=abi, cwd=cwd, env=environment,
            seconds=max(deadline - start, 0.0), cgroup=cgroup,
        )  # fmt: skip
        proc, status_r = _start(spec)
        assert proc.stdin is not None
        assert proc.stdout is not None
        assert proc.stderr is not None
        out, err = bytearray(), bytearray()
        dropped = [0]
        workers = [
            threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True),
            threading.Thread(
                target=_drain, args=(proc.stdout, output_cap, out, dropped), daemon=True
            ),
            threading.Thread(
                target=_drain, args=(proc.stderr, output_cap, err, dropped), daemon=True
            ),
        ]
        for worker in workers:
            worker.start()
        ended = "deadline"
        try:
            ended = _wait(proc, deadline, cancelled)
            if ended == "exited":
                proc.wait()
        finally:
            if ended != "exited":
                _end_tree(proc)
            duration = time.monotonic() - start
            status = _read_status(status_r)
            for worker in workers:
                worker.join(_DRAIN_GRACE_S)
    if ended != "exited":
        return ProcessResult(
            None, signal.SIGKILL, bytes(out), bytes(err), dropped[0],
            ended == "deadline", duration, ended == "cancelled",
        )  # fmt: skip
    code, sig = _outcome(status, argv[0])
    if code is None and sig is None:
        raise ConfinementUnavailable(
            f"cannot confine {argv[0]}: the trampoline ended without a status "
            f"(exit {proc.returncode}); the command may not have run",
            feature="trampoline",
        )
    return ProcessResult(code, sig, bytes(out), bytes(err), dropped[0], False, duration)


@contextlib.contextmanager
def _pids_cgroup(processes: int) -> Iterator[Path | None]:
    """A pids cgroup for one command's tree when skilld is root (``None`` otherwise).

    Raises:
        ConfinementUnavailable: root, and no writable pids controller.
    """
    if os.geteuid() != 0:
        yield None
        return
    path = _cgroup_create(processes)
    try:
        yield path
    finally:
        _cgroup_remove(path)


def _start(spec: dict[str, Any]) -> tuple[subprocess.Popen[bytes], int]:
    """Start the trampoline with ``spec`` on a pipe; its process and the status pipe.

    Raises:
        ConfinementUnavailable: the trampoline could not be started.
    """
    spec_r, spec_w = os.pipe()
    status_r, status_w = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", TRAMPOLINE, str(spec_r), str(status_w)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={},
            cwd="/",
            pass_fds=(spec_r, status_w),
            start_new_session=True,
        )
    except OSError as exc:
        for fd in (spec_r, spec_w, status_r, status_w):
            os.close(fd)
        raise ConfinementUnavailable(
            f"cannot start the confinement trampoline: {exc}", feature="trampoline"
        ) from exc
    os.close(spec_r)
    os.close(status_w)
    with contextlib.suppress(BrokenPipeError), os.fdopen(spec_w, "wb") as f:
        f.write(marshal.dumps(spec))
    return proc, status_r
