"""The seccomp layer: system calls that Landlock, namespaces and file modes do not govern.

Two halves, on two sides of ``fork``:

- :func:`compile_filter` runs in the host (the skilld server). It builds the filter with
  libseccomp (through ``pyseccomp``, a ctypes binding with the API of Debian's
  ``python3-seccomp``) and exports the BPF program as bytes, once per argument tuple.
- :func:`install` runs in the confined process, after ``no_new_privs`` and Landlock and
  before ``execve``. That process is ``python -I -S`` (no site-packages), so this module
  imports nothing at its top but the standard library, and the host-only half imports
  libseccomp and skilld's errors inside its functions.

The filter's default action is ALLOW: it refuses, with ``EPERM``, what the other walls
leave open (``clone3`` fails with ``ENOSYS`` so that libc falls back to ``clone``, whose
flags a filter can read):

- kernel keyrings (``add_key``, ``keyctl``, ``request_key``): root's user keyring is
  shared by every process of uid 0;
- every socket but TCP over IPv4/IPv6: ``AF_UNIX`` (pathname sockets are not governed by
  Landlock nor by an empty network namespace) unless a grant names a socket; netlink,
  packet and every other family; ``SOCK_RAW``; UDP unless granted (no grant type exists
  yet); protocols other than 0, TCP and UDP (SCTP and MPTCP bypass Landlock's TCP
  rules). ``socketpair`` stays for stream and seqpacket pairs (Python's
  ``multiprocessing`` needs it), which the kernel never lets reach another socket; a
  datagram pair is refused: ``sendto`` or ``connect`` on one reaches any pathname
  datagram socket (``/dev/log``);
- with ``local_sockets`` (a command that makes its own listening socket, such as
  LibreOffice's single-instance pipe): ``AF_UNIX`` stream and seqpacket sockets, and no
  ``connect`` at all, so that no pathname socket outside the command is reachable (the
  runner gives such a command no network);
- other processes and namespaces: ``ptrace``, ``process_vm_*``, ``process_madvise``,
  ``kcmp``, ``pidfd_getfd``, ``unshare``, ``setns``, ``clone`` with a ``CLONE_NEW*`` flag,
  every mount call (old and new API), ``pivot_root``, ``chroot``;
- every call aimed at a process by its pid, unless the pid is ``0`` (the caller itself):
  ``prlimit64``, ``setpriority``/``getpriority`` (``PRIO_PROCESS`` only), the
  ``sched_*`` calls that take a pid, ``ioprio_set``/``ioprio_get``
  (``IOPRIO_WHO_PROCESS`` only), ``migrate_pages``, ``move_pages``,
  ``get_robust_list``; and the pidfd calls (``pidfd_open``, ``pidfd_send_signal``,
  ``process_mrelease``: ``ENOSYS``, so that asyncio and Go fall back to ``waitpid``).
  The filter cannot know which pids are the caller's own children, so a pid other than
  ``0`` is refused whoever it names: no call of a script reaches another call's
  processes, nor skilld's, in any identity mode (signals: Landlock's scoping);
- ``getpgid`` and ``getsid`` with a pid other than ``0``: ``ESRCH`` for every pid, as if
  none existed, so they no longer tell which pids exist (``getpgrp`` asks for pid ``0``);
- with ``ipc`` (where the command gets no IPC namespace of its own): every System V
  and POSIX message-queue call (``shmget``, ``msgget``, ``semget``, ``mq_open`` and the
  calls on what they return): their objects are the host's and outlive the call
  (POSIX shared memory and named semaphores are files in ``/dev/shm``, which Landlock
  does not grant);
- kernel attack surface: ``bpf``, ``perf_event_open``, ``userfaultfd``, ``io_uring_*``
  (io_uring performs socket and connect without passing through seccomp),
  ``open_by_handle_at``, ``personality`` other than the default and the query, and the
  administrative calls capabilities already refuse (cheap to refuse twice);
- with ``metadata``: changing modes, owners, times, extended attributes and inode flags
  (``chmod`` family, ``chown`` family, ``utime`` family, ``*setxattr*``,
  ``*removexattr*``, ``file_setattr``, the ``FS_IOC_SETFLAGS``/``FS_IOC_FSSETXATTR``
  ioctls), inside the grants too: when the command runs as skilld's own uid, every
  file of that uid is a target.

System calls of another ABI (i386's ``int 0x80`` on x86_64, x32's numbers with bit 30
set, arm32 on aarch64) kill the process: the filter knows the native ABI only.
"""

from __future__ import annotations

import ctypes
import os

TYPE_CHECKING = False  # not ``typing``: every import here is paid by every command
if TYPE_CHECKING:
    from typing import Any

    from skilld.errors import ConfinementUnavailable

# What to install when the binding or the shared library is missing.
PACKAGES = "the Python package pyseccomp and the shared library libseccomp2 (Debian: libseccomp2)"

# -- the kernel's side (include/uapi/linux/seccomp.h, filter.h) -----------------
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_TSYNC = 1
PR_GET_NO_NEW_PRIVS = 39
PR_GET_SECCOMP = 21
BPF_MAXINSNS = 4096
# seccomp(2) by machine; skilld builds filters for these two only (see _RAW).
SYS_SECCOMP = {"x86_64": 317, "aarch64": 277}

AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10
SOCK_STREAM, SOCK_DGRAM, SOCK_SEQPACKET = 1, 2, 5
# Connection-oriented unix sockets: a pair of them is connected to itself for good, and
# ``sendto`` ignores (seqpacket) or refuses (stream) an address.
UNIX_CONNECTED = (SOCK_STREAM, SOCK_SEQPACKET)
SOCK_TYPE_MASK = 0xF
IPPROTO_TCP, IPPROTO_UDP = 6, 17
CLONE_NEW = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
PERSONALITY_QUERY = 0xFFFFFFFF
FS_IOC_SETFLAGS = 0x40086602
FS_IOC32_SETFLAGS = 0x40046602
FS_IOC_FSSETXATTR = 0x401C5820
_U32 = 0xFFFFFFFF
_EPERM, _ESRCH, _ENOSYS = 1, 3, 38

ALWAYS = (
    # keyrings
    "add_key", "keyctl", "request_key",
    # other processes
    "ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "kcmp",
    "pidfd_getfd",
    # namespaces and mounts
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "open_tree",
    "open_tree_attr", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
    "mount_setattr",
    # kernel attack surface
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "open_by_handle_at", "name_to_handle_at", "uselib",
    # administration (capabilities refuse these already)
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "swapon", "swapoff", "reboot", "acct", "quotactl", "quotactl_fd", "syslog",
    "lookup_dcookie", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "iopl", "ioperm", "vhangup", "nfsservctl",
)  # fmt: skip
# Calls aimed at a process by their first argument (a pid; 0 is the caller).
BY_PID = (
    "prlimit64", "sched_setaffinity", "sched_getaffinity", "sched_setscheduler",
    "sched_getscheduler", "sched_setparam", "sched_getparam", "sched_setattr",
    "sched_getattr", "sched_rr_get_interval", "migrate_pages", "move_pages",
    "get_robust_list",
)  # fmt: skip
# Calls aimed at a process, a process group or a user by (which, who): allowed only as
# (the process, 0), the caller itself (a user's "who" of 0 is every process of its uid).
BY_WHICH_WHO = {
    "setpriority": 0, "getpriority": 0,  # PRIO_PROCESS
    "ioprio_set": 1, "ioprio_get": 1,  # IOPRIO_WHO_PROCESS
}  # fmt: skip
# Calls that tell a process's group or session by pid: every pid but 0 (the caller)
# answers ESRCH, "no such process", so they no longer tell which pids exist.
AS_IF_NONE = ("getpgid", "getsid")
PIDFD = ("pidfd_open", "pidfd_send_signal", "process_mrelease")
# System V IPC and POSIX message queues: objects of the host's IPC namespace.
IPC = (
    "shmget", "shmat", "shmdt", "shmctl", "msgget", "msgsnd", "msgrcv", "msgctl",
    "semget", "semop", "semtimedop", "semctl", "mq_open", "mq_unlink", "mq_timedsend",
    "mq_timedreceive", "mq_notify", "mq_getsetattr", "ipc",
)  # fmt: skip
METADATA = (
    "chmod", "fchmod", "fchmodat", "fchmodat2",
    "chown", "fchown", "lchown", "fchownat",
    "utime", "utimes", "futimesat", "utimensat",
    "setxattr", "lsetxattr", "fsetxattr", "setxattrat",
    "removexattr", "lremovexattr", "fremovexattr", "removexattrat",
    "file_setattr",
)  # fmt: skip
# Calls newer than Debian's libseccomp 2.5.4 knows, by number. Both machines use the
# unified table (every call from 424 on has one number everywhere).
_RAW = {
    "open_tree_attr": 467,
    "setxattrat": 463,
    "removexattrat": 466,
    "file_setattr": 469,
    "fchmodat2": 452,
    "mount_setattr": 442,
    "quotactl_fd": 443,
    "process_madvise": 440,
    "pidfd_getfd": 438,
    "pidfd_open": 434,
    "pidfd_send_signal": 424,
    "process_mrelease": 448,
}
_MACHINES = {"x86_64", "aarch64"}


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


_cache: dict[tuple[bool, bool, bool, bool, bool], bytes] = {}


def compile_filter(
    *,
    unix_sockets: bool,
    udp: bool,
    metadata: bool,
    local_sockets: bool = False,
    ipc: bool = True,
) -> bytes:
    """The BPF program (``struct sock_filter[]``, native byte order) of the filter.

    ``unix_sockets`` lets ``socket(AF_UNIX)`` and ``socketpair`` of every type through
    (a grant names a socket path); ``local_sockets`` lets stream and seqpacket
    ``socket(AF_UNIX)`` through and refuses ``connect`` (the command listens on its
    own socket and reaches none); ``udp`` lets UDP over IPv4/IPv6 through; ``metadata``
    refuses changes of modes, owners, times and extended attributes (the command runs
    as skilld's own uid); ``ipc`` refuses System V IPC and POSIX message queues (the
    command has no IPC namespace of its own). Compiled once per argument tuple, in the
    host.

    Raises:
        ConfinementUnavailable: ``feature="seccomp"``: the binding or libseccomp is
            missing, or the machine is not one the filter is written for.
    """
    key = (unix_sockets, udp, metadata, local_sockets, ipc)
    if key not in _cache:
        _cache[key] = _compile(*key)
    return _cache[key]


def _unavailable(detail: str, hint: str | None = None) -> ConfinementUnavailable:
    from skilld.errors import ConfinementUnavailable  # host only: see the module docstring

    return ConfinementUnavailable(
        f"the seccomp filter cannot be built: {detail}; commands are refused rather than "
        "run without it",
        feature="seccomp",
        hint=hint or f"install {PACKAGES}",
    )


def _binding() -> Any:
    """The ``pyseccomp`` module (it loads libseccomp when imported)."""
    try:
        import pyseccomp  # host only: see the module docstring
    except (ImportError, RuntimeError, OSError) as exc:
        # RuntimeError: pyseccomp found no libseccomp; OSError: it could not load it.
        raise _unavailable(f"{type(exc).__name__}: {exc}") from exc
    return pyseccomp


def _compile(
    unix_sockets: bool, udp: bool, metadata: bool, local_sockets: bool, ipc: bool
) -> bytes:
    machine = os.uname().machine
    if machine not in _MACHINES:
        raise _unavailable(
            f"no filter is written for machine {machine}",
            hint=f"run skilld on {' or '.join(sorted(_MACHINES))}",
        )
    sc = _binding()
    try:
        filt = sc.SyscallFilter(sc.ALLOW)
        # A call of another ABI (i386, x32, arm32) would be judged by the wrong table.
        filt.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
        eperm, arg = sc.ERRNO(_EPERM), sc.Arg

        def refuse(name: str, *args: Any, action: int = eperm) -> None:
            number = sc.resolve_syscall(sc.Arch.NATIVE, name)
            if number < 0:
                number = _RAW.get(name, -1)
            if number < 0:
                # Not a call of this machine (aarch64 has no chmod, only fchmodat).
                return
            filt.add_rule(action, number, *args)

        for name in ALWAYS:
            refuse(name)
        refuse("clone3", action=sc.ERRNO(_ENOSYS))
        for bit in CLONE_NEW.values():
            refuse("clone", arg(0, sc.MASKED_EQ, bit, bit))
        # The kernel reads these pids as C ints; the filter compares all 64 bits, so a
        # value whose low word is 0 but not its high word is refused, never let through.
        for name in BY_PID:
            refuse(name, arg(0, sc.NE, 0))
        for name, which in BY_WHICH_WHO.items():
            refuse(name, arg(0, sc.NE, which))
            refuse(name, arg(1, sc.NE, 0))
        for name in AS_IF_NONE:
            refuse(name, arg(0, sc.NE, 0), action=sc.ERRNO(_ESRCH))
        for name in PIDFD:
            refuse(name, action=sc.ERRNO(_ENOSYS))
        if ipc:
            for name in IPC:
                refuse(name)
        _personality(refuse, sc)
        _sockets(refuse, sc, unix_sockets=unix_sockets, udp=udp, local=local_sockets)
        if metadata:
            for name in METADATA:
                refuse(name)
            for cmd in (FS_IOC_SETFLAGS, FS_IOC32_SETFLAGS, FS_IOC_FSSETXATTR):
                refuse("ioctl", arg(1, sc.MASKED_EQ, _U32, cmd))
        fd = os.memfd_create("skilld-seccomp", os.MFD_CLOEXEC)
        try:
            with os.fdopen(os.dup(fd), "wb") as out:
                filt.export_bpf(out)
            size = os.lseek(fd, 0, os.SEEK_END)
            return os.pread(fd, size, 0)
        finally:
            os.close(fd)
    except OSError as exc:
        raise _unavailable(f"libseccomp refused the filter: {exc}") from exc


def _personality(refuse: Any, sc: Any) -> None:
    """Allow ``personality(0)`` and the query ``personality(0xffffffff)`` only.

    The kernel reads the low 32 bits (``unsigned int``) and libseccomp cannot put two
    comparisons on one argument. A low word that is neither all zeros nor all ones
    has, somewhere around the circle of its 32 bits, a bit set whose next bit is
    clear: one masked rule per position refuses them all, and the high word (which
    the kernel drops) plays no part.
    """
    for i in range(32):
        here, after = 1 << i, 1 << ((i + 1) % 32)
        refuse("personality", sc.Arg(0, sc.MASKED_EQ, here | after, here))


def _sockets(refuse: Any, sc: Any, *, unix_sockets: bool, udp: bool, local: bool) -> None:
    """``socket(domain, type, protocol)``: what stays is TCP (and UDP, and AF_UNIX, when
    granted) over IPv4/IPv6; ``socketpair``: stream and seqpacket pairs (every type when
    AF_UNIX is granted); with ``local``, AF_UNIX stream and seqpacket sockets and no
    ``connect``.

    The kernel reads each argument as a 32-bit int; the filter compares all 64 bits.
    Refusals therefore cover whole ranges (``GT``), so a value with high bits set is
    refused rather than slipping past a comparison with the small value the kernel
    would see. The allowed sets are exact 64-bit values: domain {AF_INET, AF_INET6}
    (+ AF_UNIX), protocol {0, TCP, UDP}; the type is read through the kernel's own
    mask (its low 4 bits), so SOCK_CLOEXEC/SOCK_NONBLOCK change nothing.
    """
    arg = sc.Arg
    refuse("socket", arg(0, sc.GT, AF_INET6))
    for domain in range(AF_INET6):
        if domain in (AF_INET,) or (domain == AF_UNIX and (unix_sockets or local)):
            continue
        refuse("socket", arg(0, sc.EQ, domain))
    if not unix_sockets:
        # The kernel reads the type's low 4 bits (SOCK_TYPE_MASK); the flags above them
        # are checked by the kernel itself.
        for kind in range(SOCK_TYPE_MASK + 1):
            if kind in UNIX_CONNECTED:
                continue
            refuse("socketpair", arg(1, sc.MASKED_EQ, SOCK_TYPE_MASK, kind))
            if local:
                refuse("socket", arg(0, sc.EQ, AF_UNIX), arg(1, sc.MASKED_EQ, SOCK_TYPE_MASK, kind))
        if local:
            # The only way a stream or seqpacket socket reaches another is connect().
            refuse("connect")
    types = {SOCK_STREAM, SOCK_DGRAM} if udp else {SOCK_STREAM}
    for domain in (AF_INET, AF_INET6):
        inet = arg(0, sc.EQ, domain)
        for kind in range(SOCK_TYPE_MASK + 1):
            if kind not in types:
                refuse("socket", inet, arg(1, sc.MASKED_EQ, SOCK_TYPE_MASK, kind))
        refuse("socket", inet, arg(2, sc.GT, IPPROTO_UDP))
        for protocol in range(1, IPPROTO_UDP):
            if protocol != IPPROTO_TCP:
                refuse("socket", inet, arg(2, sc.EQ, protocol))


def names_socket(paths: Any) -> bool:
    """True when one of ``paths`` (grants) is a unix socket on disk (not through a link)."""
    import stat  # host only: see the module docstring

    for path in paths:
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                return True
        except OSError:
            continue
    return False


def available() -> tuple[bool, str]:
    """Whether the seccomp layer can be built and installed here, and what says so.

    For the active profile: ``(True, "libseccomp 2.5.4 (pyseccomp 0.1.2), x86_64")``,
    or ``(False, why)`` naming what to install.
    """
    try:
        compile_filter(unix_sockets=False, udp=False, metadata=True)
    except Exception as exc:  # noqa: BLE001 - ConfinementUnavailable, reported as text
        return False, str(exc)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_GET_SECCOMP, 0, 0, 0, 0) < 0:
        err = ctypes.get_errno()
        return False, f"the kernel has no seccomp filters (prctl: {os.strerror(err)})"
    return True, f"{_versions()}, {os.uname().machine}"


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version  # host only

    try:
        binding = f"pyseccomp {version('pyseccomp')}"
    except PackageNotFoundError:  # imported from a bare file, not installed
        binding = "pyseccomp"

    class _Version(ctypes.Structure):
        _fields_ = (
            ("major", ctypes.c_uint),
            ("minor", ctypes.c_uint),
            ("micro", ctypes.c_uint),
        )

    lib = _binding()._libseccomp  # the library it loaded, for its version
    lib.seccomp_version.restype = ctypes.POINTER(_Version)
    v = lib.seccomp_version().contents
    return f"libseccomp {v.major}.{v.minor}.{v.micro} ({binding})"


_MACHINE = os.uname().machine
_loaded: list[ctypes.CDLL] = []


def _libc() -> ctypes.CDLL:
    """The C library with ``prctl`` and ``syscall`` looked up, once per process tree:
    the launcher calls it at start-up, so a command's process (a fork of it) finds
    both ready instead of paying ``dlopen`` and two symbol lookups on every command."""
    if not _loaded:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        libc.prctl.restype = ctypes.c_int
        _loaded.append(libc)
    return _loaded[0]


def install(bpf: bytes) -> None:
    """Load ``bpf`` as this process's seccomp filter (inherited by what it starts).

    ``no_new_privs`` must be set already (the kernel refuses a filter from an
    unprivileged process without it, and this refuses to rely on privilege).

    Raises:
        OSError: no_new_privs is not set, the machine is unknown, the program is
            malformed, or the kernel refused it; the caller must run nothing.
    """
    if not bpf or len(bpf) % 8 or len(bpf) // 8 > BPF_MAXINSNS:
        raise OSError(22, f"not a BPF program ({len(bpf)} bytes)")
    libc = _libc()
    if libc.prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1:
        raise OSError(1, "no_new_privs is not set")
    number = SYS_SECCOMP.get(_MACHINE)
    if number is None:
        raise OSError(38, f"seccomp(2) of machine {_MACHINE} is not known")
    program = ctypes.create_string_buffer(bpf, len(bpf))
    prog = _SockFprog(len(bpf) // 8, ctypes.addressof(program))
    # TSYNC: every thread of this process, or the call fails (the launcher forks
    # single-threaded children; this keeps a stray thread from staying unfiltered).
    result = libc.syscall(
        number, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, ctypes.byref(prog)
    )
    if result != 0:
        err = ctypes.get_errno() if result < 0 else 0
        raise OSError(err, f"seccomp(SET_MODE_FILTER) failed: {os.strerror(err)} ({result})")
