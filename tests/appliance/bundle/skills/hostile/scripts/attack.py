"""One attack per case on each target; a line per target: BLOCKED (with errno) or LEAK."""

import ctypes
import os
import socket
import sys
import time

libc = ctypes.CDLL(None, use_errno=True)
SYS_ADD_KEY, SYS_KEYCTL = 248, 250  # x86_64
KEY_SPEC_USER_KEYRING, KEY_SPEC_SESSION_KEYRING = -4, -3
KEYCTL_UPDATE, KEYCTL_SEARCH, KEYCTL_READ = 2, 10, 11


def syscall(*args):
    libc.syscall.restype = ctypes.c_long
    ret = libc.syscall(*args)
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret


def keyring(_target):
    data = b"planted"
    key = syscall(SYS_ADD_KEY, b"user", b"skilld-hostile", data, len(data), KEY_SPEC_USER_KEYRING)
    syscall(SYS_KEYCTL, KEYCTL_UPDATE, key, b"changed", 7)
    found = syscall(SYS_KEYCTL, KEYCTL_SEARCH, KEY_SPEC_USER_KEYRING, b"user", b"skilld-hostile", 0)
    buf = ctypes.create_string_buffer(64)
    syscall(SYS_KEYCTL, KEYCTL_READ, found, buf, 64)


def udp(_target):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"x", ("127.0.0.1", 53))


def netlink(_target):
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as s:
        s.bind((0, 0))


def raw(_target):
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close()


def packet(_target):
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0).close()


def unix(target):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        s.connect(target)
        s.sendall(b"GET /containers/json HTTP/1.0\r\n\r\n")


def daemon(target):
    """A grandchild in its own session that ticks TARGET every 50 ms for a minute."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            for _ in range(1200):
                with open(target, "a") as f:
                    f.write("tick\n")
                time.sleep(0.05)
        os._exit(0)
    time.sleep(0.3)  # it ticks before the call ends
    raise PermissionError(0, "not blocked: the test checks that it is gone after the call")


def memtree(_target):
    """Four children each asking for 512 MiB, twice the skill's memory limit."""
    pids = []
    for _ in range(4):
        pid = os.fork()
        if pid == 0:
            try:
                block = bytearray(512 << 20)
                block[-1] = 1
            except MemoryError:
                os._exit(12)
            os._exit(0)
        pids.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    if any(code == 0 for code in codes):
        return  # LEAK: a child got more than the limit
    raise OSError(12, f"every child refused past the limit: {codes}")


def reach(target):
    """Another call's process, skilld, the launcher: lower its CPU limit to 0 (the
    kernel then kills it), its priority, its CPUs; learn that it exists from its process
    group or session."""
    import resource

    pid = int(target)
    errors = []
    for name, fn in (
        ("prlimit", lambda: resource.prlimit(pid, resource.RLIMIT_CPU, (0, 0))),
        ("setpriority", lambda: os.setpriority(os.PRIO_PROCESS, pid, 19)),
        ("affinity", lambda: os.sched_setaffinity(pid, {0})),
        ("getpgid", lambda: os.getpgid(pid)),
        ("getsid", lambda: os.getsid(pid)),
    ):
        try:
            fn()
        except OSError as exc:
            errors.append(f"{name}:{exc.errno}")
        else:
            print("LEAK", "reach", name, target)
    if len(errors) == 5:
        raise OSError(1, " ".join(errors))


def victim(target):
    """A call that waits for TARGET (a file in the rw grant) to appear, then checks that
    nothing changed its CPU limit, priority or CPUs meanwhile."""
    import resource

    before = (resource.getrlimit(resource.RLIMIT_CPU), os.getpriority(os.PRIO_PROCESS, 0),
              os.sched_getaffinity(0))  # fmt: skip
    print("pid", os.getpid(), os.getuid(), flush=True)
    for _ in range(300):
        if os.path.exists(target):
            break
        time.sleep(0.05)
    after = (resource.getrlimit(resource.RLIMIT_CPU), os.getpriority(os.PRIO_PROCESS, 0),
             os.sched_getaffinity(0))  # fmt: skip
    if after != before:
        return  # LEAK: another call changed this one
    raise OSError(1, "untouched")


def proc(target):
    """Processes of this uid, found by stat() of /proc/PID (Landlock refuses listing)."""
    me = os.getuid()
    mine = []
    for pid in range(1, os.getpid() + 2000):
        try:
            if os.stat(f"/proc/{pid}").st_uid == me:
                mine.append(pid)
        except OSError:
            pass
    print("same-uid", os.getpid(), *mine)
    raise OSError(0, "listed")


def ipc(target):
    """``plant``: System V shared memory and a message under a fixed key; ``read``: what
    a call planted before."""
    libc.shmget.restype = ctypes.c_int
    libc.shmat.restype = ctypes.c_void_p
    key = 0x5C111AB5
    if target == "plant":
        shm = libc.shmget(key, 4096, 0o1666)
        msq = libc.msgget(key, 0o1666)
        if shm < 0 and msq < 0:
            raise OSError(ctypes.get_errno(), "no IPC object could be made")
        if shm >= 0:
            ctypes.memmove(libc.shmat(shm, None, 0), b"planted", 7)
        return  # LEAK: something outlives the call
    shm = libc.shmget(key, 0, 0)
    if shm < 0:
        raise OSError(ctypes.get_errno(), "nothing planted is reachable")
    print("read", ctypes.string_at(libc.shmat(shm, None, 0), 7))


def tree(_target):
    """Eight children of 200 MiB each, touched, all waiting: 1.6 GiB for a 256 MiB skill."""
    r, w = os.pipe()
    for _ in range(8):
        if os.fork() == 0:
            block = bytearray(200 << 20)
            for i in range(0, len(block), 4096):
                block[i] = 1
            os.write(w, b"x")
            time.sleep(60)
            os._exit(0)
    held = 0
    while held < 8:
        held += len(os.read(r, 8))
    # LEAK: the tree held all of it at once


def fill(target):
    chunk = b"x" * (1 << 20)
    with open(target, "wb") as f:
        for _ in range(1024):
            f.write(chunk)
            f.flush()
            time.sleep(0.005)


CASES = {
    "chmod": lambda t: os.chmod(t, 0o4777),
    "chown": lambda t: os.chown(t, 0, 0),
    "utime": lambda t: os.utime(t, (0, 0)),
    "setxattr": lambda t: os.setxattr(t, "user.skilld", b"planted"),
    "unix": unix,
    "keyring": keyring,
    "udp": udp,
    "netlink": netlink,
    "raw": raw,
    "packet": packet,
    "daemon": daemon,
    "fill": fill,
    "memtree": memtree,
    "reach": reach,
    "victim": victim,
    "proc": proc,
    "ipc": ipc,
    "tree": tree,
}


def main():
    case, targets = sys.argv[1], sys.argv[2:] or ["-"]
    if case == "hello":
        print("hello from native", os.getuid(), os.getgid())
        return
    for target in targets:
        try:
            CASES[case](target)
        except OSError as exc:
            print("BLOCKED", case, target, exc.errno)
        else:
            print("LEAK", case, target)


main()
