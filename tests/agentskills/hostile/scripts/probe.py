"""Try one escape from the native executor; print LEAK when it worked, BLOCKED when not."""

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time

CASE = sys.argv[1]
CTX = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
LIBC = ctypes.CDLL(None, use_errno=True)


def read(path):
    with open(path, "rb") as fh:
        return fh.read(64)


def write(path, data=b"x"):
    with open(path, "wb") as fh:
        fh.write(data)


def connect(host, port, kind=socket.SOCK_STREAM):
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, kind)
    s.settimeout(2)
    s.connect((host, port))
    if kind == socket.SOCK_DGRAM:
        s.send(b"x")
        s.recv(1)
    return True


def run(*argv):
    return subprocess.run(argv, capture_output=True, timeout=5, check=True).stdout


def libc_call(name, *args):
    result = getattr(LIBC, name)(*args)
    if result == -1:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return result


def planted(target, then):
    os.symlink(target, "planted")
    return then("planted")


def double_fork_survivor():
    token = CTX["token"]
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(
                sys.executable,
                [
                    sys.executable,
                    "-I",
                    "-S",
                    "-c",
                    "import time\nwhile True: time.sleep(0.05)",
                    token,
                ],
            )
        os._exit(0)
    os.wait()
    raise PermissionError("the grandchild was started; the test checks it is gone")


def fork_bomb():
    children = 0
    try:
        while True:
            if os.fork() == 0:
                time.sleep(30)
                os._exit(0)
            children += 1
    except OSError:
        raise PermissionError(f"fork refused after {children} children") from None


def memory_bomb():
    blocks = [bytearray(256 << 20) for _ in range(32)]
    return len(blocks)


def cap_eff():
    for line in read_text("/proc/self/status").splitlines():
        if line.startswith("CapEff:") and int(line.split()[1], 16) != 0:
            return True
    raise PermissionError("no effective capabilities")


def read_text(path):
    with open(path) as fh:
        return fh.read()


def host_env():
    leaked = [
        k
        for k in os.environ
        if k not in ("PATH", "HOME", "TMPDIR", "XDG_CACHE_HOME", "LANG", "LC_ALL", "SKILL_DIR")
        and k != "LC_CTYPE"
    ]
    if leaked or CTX["secret_name"] in os.environ:
        return leaked
    raise PermissionError("environment holds only the allowlist")


def self_environ():
    if CTX["secret_value"].encode() in read("/proc/self/environ") + read_all("/proc/self/environ"):
        return True
    raise PermissionError("no secret in /proc/self/environ")


def read_all(path):
    with open(path, "rb") as fh:
        return fh.read()


def big_file():
    with open("big.bin", "wb") as fh:
        for _ in range(100):
            fh.write(b"\0" * (1 << 20))
    return True


def many_files():
    handles = [open("/dev/null") for _ in range(4096)]
    return len(handles)


def ptrace(pid):
    return libc_call("ptrace", 16, pid, None, None)  # PTRACE_ATTACH


def unshare_then_read():
    try:
        libc_call("unshare", 0x10000000)  # CLONE_NEWUSER
    except OSError:
        pass
    return read("/etc/shadow")


def spin():
    while True:
        pass


def flood(stream):
    chunk = "x" * 65536
    for _ in range(800):
        stream.write(chunk)
    stream.flush()
    raise PermissionError("flooded; the host caps it")


SKILL = CTX.get("skill", "/nonexistent")
WORK = os.getcwd()
CASES = {
    "ping": lambda: print("pong") or (_ for _ in ()).throw(PermissionError("not an attack")),
    # reads outside the grants
    "read-etc-shadow": lambda: read("/etc/shadow"),
    "read-etc-passwd": lambda: read("/etc/passwd"),
    "read-etc-hostname": lambda: read("/etc/hostname"),
    "read-root-home": lambda: os.listdir("/root"),
    "read-root-bashrc": lambda: read("/root/.bashrc"),
    "read-root-ssh": lambda: os.listdir("/root/.ssh"),
    "list-home": lambda: os.listdir("/home"),
    "read-proc-1-environ": lambda: read("/proc/1/environ"),
    "read-proc-1-cmdline": lambda: read("/proc/1/cmdline"),
    "read-parent-environ": lambda: read(f"/proc/{CTX['host_pid']}/environ"),
    # the server's process by pid (issue 27: prlimit(RLIMIT_CPU, 0) on it killed it); what
    # would leak only rereads or rewrites what is there
    "prlimit-read-host": lambda: __import__("resource").prlimit(
        CTX["host_pid"], __import__("resource").RLIMIT_CPU
    ),
    "setpriority-host": lambda: os.setpriority(os.PRIO_PROCESS, CTX["host_pid"], 0),
    "affinity-host": lambda: os.sched_setaffinity(
        CTX["host_pid"], os.sched_getaffinity(CTX["host_pid"])
    ),
    "prlimit-read-parent": lambda: __import__("resource").prlimit(
        os.getppid(), __import__("resource").RLIMIT_CPU
    ),
    "pidfd-host": lambda: os.pidfd_open(CTX["host_pid"]),
    "list-root": lambda: os.listdir("/"),
    "list-tmp": lambda: os.listdir("/tmp"),
    "list-var-log": lambda: os.listdir("/var/log"),
    "list-sys": lambda: os.listdir("/sys/kernel"),
    "list-work": lambda: os.listdir("/work"),
    "read-bundle-lock": lambda: read(CTX["outside_file"]),
    "list-skill-parent": lambda: os.listdir(os.path.dirname(SKILL)),
    "read-state-dir": lambda: os.listdir(CTX["outside_dir"]),
    "read-proc-root-escape": lambda: read("/proc/self/root/etc/shadow"),
    # The workspace's parent is the call's own directory (work/ and home/); above it is
    # the node's work directory, where every call has its directory.
    "read-cwd-escape": lambda: os.listdir(os.path.join(WORK, "..", "..")),
    "read-dev-mem": lambda: read("/dev/mem"),
    "read-docker-sock": lambda: os.stat("/var/run/docker.sock") and read("/var/run/docker.sock"),
    # links planted in the workspace
    "symlink-to-shadow": lambda: planted("/etc/shadow", read),
    "symlink-to-etc": lambda: planted("/etc", lambda p: read(p + "/passwd")),
    "symlink-to-outside": lambda: planted(CTX["outside_file"], read),
    "symlink-to-skill-write": lambda: planted(SKILL + "/SKILL.md", lambda p: write(p)),
    "hardlink-passwd": lambda: os.link("/etc/passwd", "passwd") or read("passwd"),
    "hardlink-skill-file": lambda: os.link(SKILL + "/SKILL.md", "copy") or write("copy"),
    # writes outside the workspace
    "write-skill-script": lambda: write(SKILL + "/scripts/probe.py"),
    "write-skill-md": lambda: write(SKILL + "/SKILL.md"),
    "create-in-skill-dir": lambda: write(SKILL + "/new.txt"),
    "mkdir-in-skill-dir": lambda: os.mkdir(SKILL + "/newdir"),
    "chmod-skill-file": lambda: os.chmod(SKILL + "/SKILL.md", 0o777),
    "rename-skill-file": lambda: os.rename(SKILL + "/SKILL.md", SKILL + "/gone.md"),
    "unlink-skill-file": lambda: os.unlink(SKILL + "/scripts/probe.py"),
    "truncate-skill-file": lambda: os.truncate(SKILL + "/SKILL.md", 0),
    "utime-skill-file": lambda: os.utime(SKILL + "/SKILL.md", (0, 0)),
    "rename-into-skill-dir": lambda: write("w.txt") or os.rename("w.txt", SKILL + "/w.txt"),
    "write-host-tmp": lambda: write("/tmp/skilld-hostile-probe"),
    "write-etc": lambda: write("/etc/skilld-hostile-probe"),
    "write-dev-shm": lambda: write("/dev/shm/skilld-hostile-probe"),
    "write-outside-dir": lambda: write(CTX["outside_dir"] + "/planted"),
    "mkfifo-tmp": lambda: os.mkfifo("/tmp/skilld-hostile-fifo"),
    "write-sysrq": lambda: write("/proc/sysrq-trigger", b"h"),
    # network without a grant
    "tcp-loopback-listener": lambda: connect("127.0.0.1", CTX["port"]),
    "tcp-loopback-ssh": lambda: connect("127.0.0.1", 22),
    "tcp-ipv6-loopback": lambda: connect("::1", CTX["port"]),
    "tcp-metadata": lambda: connect("169.254.169.254", 80),
    "tcp-public": lambda: connect("1.1.1.1", 443),
    "udp-dns": lambda: connect("127.0.0.53", 53, socket.SOCK_DGRAM),
    "dns-lookup": lambda: socket.getaddrinfo("pypi.org", 443),
    "abstract-unix-socket": lambda: socket.socket(socket.AF_UNIX).connect("\0" + CTX["abstract"]),
    "raw-socket": lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
    # processes, privileges and the host
    "exec-ls": lambda: run("/bin/ls", "/"),
    "exec-sh": lambda: run("/bin/sh", "-c", "id"),
    "exec-curl": lambda: run("/usr/bin/curl", "-s", "http://127.0.0.1"),
    "exec-skill-script": lambda: run(SKILL + "/scripts/probe.py", "ping"),
    "exec-from-workspace": lambda: (
        write("tool", b"#!/bin/sh\necho hi\n"),
        os.chmod("tool", 0o755),
        run("./tool"),
    )[2],
    "ptrace-seize-host-pid": lambda: libc_call("ptrace", 0x4206, CTX["host_pid"], None, None),
    "ptrace-host-pid": lambda: ptrace(CTX["host_pid"]),
    "kill-host-pid": lambda: os.kill(CTX["host_pid"], signal.SIGTERM),
    "kill-everything": lambda: os.kill(-1, signal.SIGKILL),
    "capabilities": cap_eff,
    "mount-tmpfs": lambda: libc_call("mount", b"none", b"/mnt", b"tmpfs", 0, None),
    "chroot": lambda: os.chroot("/"),
    "unshare-userns-then-read": unshare_then_read,
    "setuid-nobody-back": lambda: (os.setuid(65534), os.setuid(0)),
    "host-environment": host_env,
    "self-environ-secret": self_environ,
    # resource exhaustion: refused or cut short, the next call still answered
    "fork-bomb": fork_bomb,
    "memory-bomb": memory_bomb,
    "file-size": big_file,
    "open-files": many_files,
    "grandchild-outlives": double_fork_survivor,
    "cpu-spin": spin,
    "stdout-flood": lambda: flood(sys.stdout),
    "stderr-flood": lambda: flood(sys.stderr),
}

if __name__ == "__main__":
    try:
        got = CASES[CASE]()
    except Exception as exc:  # every refusal, whatever its type
        print(f"BLOCKED {type(exc).__name__}: {exc}"[:300])
    else:
        print(f"LEAK {got!r}"[:300])
