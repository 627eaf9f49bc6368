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
