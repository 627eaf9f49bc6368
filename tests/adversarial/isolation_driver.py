"""A small skilld stand-in for tests/adversarial/test_call_isolation.py: one process per
identity mode (as root, as root with ``SKILLD_RUN_AS``, a shared identity), started as
the server would be, that runs attacks as confined calls and their controls unconfined,
and prints what happened as one JSON object.

``python -I isolation_driver.py PATHS PYTHON PREFIX SCENARIO``; ``PATHS`` is the
``sys.path`` to add (skilld's sources and site-packages), joined by ``:``.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path[:0] = sys.argv.pop(1).split(":")

from skilld import confine  # noqa: E402 - after the path is set
from skilld.confine import Confinement, ResourceLimits  # noqa: E402

PYTHON, PREFIX, SCENARIO = sys.argv[1:4]

# Prints ``name result`` per attempt (``ok`` or the errno's name).
PRELUDE = """\
import ctypes, errno, os, resource, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def attempt(name, fn, *args):
    try:
        fn(*args)
        print(name, "ok", flush=True)
    except OSError as exc:
        print(name, errno.errorcode.get(exc.errno, exc.errno), flush=True)
def call(name, nr, *args):
    r = libc.syscall(nr, *[ctypes.c_long(a) for a in args])
    print(name, "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno()), flush=True)
"""

# Every call that changes or reads another process by its pid, tried on each pid of argv.
REACH = (
    PRELUDE
    + """\
SYS_IOPRIO_SET, SYS_PTRACE = 251, 101
for i, pid in enumerate(int(p) for p in sys.argv[1:]):
    attempt(f"prlimit{i}", resource.prlimit, pid, resource.RLIMIT_CPU, (0, 0))
    attempt(f"setpriority{i}", os.setpriority, os.PRIO_PROCESS, pid, 19)
    attempt(f"affinity{i}", os.sched_setaffinity, pid, {0})
    attempt(f"scheduler{i}", os.sched_setscheduler, pid, os.SCHED_IDLE, os.sched_param(0))
    call(f"ioprio{i}", SYS_IOPRIO_SET, 1, pid, 3 << 13)
    call(f"ptrace{i}", SYS_PTRACE, 16, pid, 0, 0)  # PTRACE_ATTACH
    attempt(f"status{i}", lambda p: open(f"/proc/{p}/status").read(), pid)
    attempt(f"pidfd{i}", os.pidfd_open, pid)
"""
)

# Which processes share this one's uid, by stat() of /proc/PID for every pid up to a
# little past its own (Landlock refuses listing /proc, not stat): the first step of the
# attack, finding another call's processes (started before this one).
PROC = """\
import json, os
me, mine = os.getuid(), []
for pid in range(1, os.getpid() + 2000):
    try:
        if os.stat(f"/proc/{pid}").st_uid == me:
            mine.append(pid)
    except OSError:
        pass
print(json.dumps({"uid": me, "self": os.getpid(), "same_uid": mine}))
"""

# Plants System V shared memory and a message for whoever comes next.
PLANT = (
    PRELUDE
    + """\
key = int(sys.argv[1])
shm = libc.shmget(key, 4096, 0o1666)
print("shmget", "ok" if shm >= 0 else errno.errorcode.get(ctypes.get_errno()), flush=True)
if shm >= 0:
    libc.shmat.restype = ctypes.c_void_p
    at = libc.shmat(shm, None, 0)
    ctypes.memmove(at, b"planted secret", 14)
msq = libc.msgget(key, 0o1666)
print("msgget", "ok" if msq >= 0 else errno.errorcode.get(ctypes.get_errno()), flush=True)
if msq >= 0:
    buf = ctypes.create_string_buffer(ctypes.sizeof(ctypes.c_long) + 16)
    ctypes.memmove(ctypes.addressof(buf), ctypes.byref(ctypes.c_long(1)), 8)
    ctypes.memmove(ctypes.addressof(buf) + 8, b"planted message", 15)
    libc.msgsnd(msq, buf, 15, 0)
"""
)

# Reads what PLANT left, and removes it (a control must leave the host clean).
READ = (
    PRELUDE
    + """\
key = int(sys.argv[1])
shm = libc.shmget(key, 0, 0)
got = {}
if shm >= 0:
    libc.shmat.restype = ctypes.c_void_p
    at = libc.shmat(shm, None, 0)
    got["shm"] = ctypes.string_at(at, 14).decode()
    libc.shmctl(shm, 0, None)  # IPC_RMID
else:
    got["shm"] = errno.errorcode.get(ctypes.get_errno())
msq = libc.msgget(key, 0)
if msq >= 0:
    buf = ctypes.create_string_buffer(ctypes.sizeof(ctypes.c_long) + 16)
    n = libc.msgrcv(msq, buf, 16, 0, 0o4000)  # IPC_NOWAIT
    got["msg"] = buf.raw[8 : 8 + n].decode() if n > 0 else "empty"
    libc.msgctl(msq, 0, None)
else:
    got["msg"] = errno.errorcode.get(ctypes.get_errno())
for k, v in got.items():
    print(k, v, flush=True)
"""
)

# Eight children of 200 MiB each, touched page by page; each says so on a pipe and
# waits; the parent prints "held 8" once all eight hold theirs at once, and exits (the
# reaper ends the children).
TREE = """\
import os, time
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
print("held", held, flush=True)
"""


def answers(out: bytes | str) -> dict[str, str]:
    """``name result`` lines as a dict."""
    text = out.decode() if isinstance(out, bytes) else out
    return dict(line.split(" ", 1) for line in text.splitlines() if " " in line)


def confined(
    code: str,
    *args: str,
    skill: str | None = None,
    seconds: float = 30.0,
    limits: ResourceLimits | None = None,
    cancelled: Any = None,
) -> confine.ProcessResult:
    """``code`` run as a confined call (Python's own files readable)."""
    return confine.run(
        [PYTHON, "-I", "-S", "-c", code, *args],
        confinement=Confinement(
            read_only=(PREFIX,), skill=skill, limits=limits or ResourceLimits()
        ),
        deadline=time.monotonic() + seconds,
        env={"PATH": "/usr/bin:/bin"},
        cancelled=cancelled,
    )


def unconfined(code: str, *args: str) -> dict[str, str]:
    """``code`` run as a plain process of this one's uid: the control."""
    done = subprocess.run(
        [PYTHON, "-I", "-S", "-c", code, *args],
        capture_output=True,
        timeout=30,
        check=False,
    )
    return answers(done.stdout)


def state(pid: int | str) -> dict[str, Any]:
    """What REACH would change: CPU limit, nice, affinity, scheduling policy."""
    with open(f"/proc/{pid}/limits") as f:
        cpu = next(line for line in f if line.startswith("Max cpu time")).split()[3:5]
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    with open(f"/proc/{pid}/status") as f:
        allowed = next(line for line in f if line.startswith("Cpus_allowed_list")).split()[1]
    return {"cpu": cpu, "nice": fields[16], "policy": fields[38], "cpus": allowed}


def find(marker: str, deadline: float) -> int:
    """The pid of the confined process whose argv carries ``marker``."""
    me = str(os.getpid())
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            name = entry.name
            if not name.isdigit() or name == me:
                continue
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if marker.encode() in argv and argv[0] != b"":
                return int(name)
        time.sleep(0.01)
    raise TimeoutError(f"no process with {marker} in its argv appeared")


def reach() -> dict[str, Any]:
    """A call tries to change another call's process, skilld and the launcher."""
    marker = f"victim-{os.getpid()}"
    stop = threading.Event()
    victim: dict[str, Any] = {}

    def run_victim() -> None:
        r = confined(
            "import time\ntime.sleep(120)", marker, skill="s", seconds=60, cancelled=stop.is_set
        )
        victim.update(signal=r.signal, cancelled=r.cancelled, exit=r.exit_code)

    thread = threading.Thread(target=run_victim)
    thread.start()
    try:
        pid = find(marker, time.monotonic() + 20)
        launcher = confine.start().proc.pid
        targets = {"victim": pid, "skilld": os.getpid(), "launcher": launcher}
        before = {k: state(v) for k, v in targets.items()}
        attack = confined(REACH, *map(str, targets.values()), skill="s")
        after = {k: state(v) for k, v in targets.items()}
    finally:
        stop.set()
        thread.join()
    # The control: the same calls, unconfined, on a process of the attacker's own uid.
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        sleeper_before = state(sleeper.pid)
        control = unconfined(REACH, str(sleeper.pid))
        sleeper_after = state(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()
    return {
        "attack": answers(attack.stdout),
        "stderr": attack.stderr.decode(errors="replace")[-2000:],
        "targets": list(targets),
        "unchanged": {k: before[k] == after[k] for k in targets},
        "victim": victim,
        "control": control,
        "control_changed": sleeper_before != sleeper_after,
        "profile": confine.profile().describe(),
    }


def proc() -> dict[str, Any]:
    """While a call of a skill runs, another call of the same skill looks for processes
    of its own uid in /proc."""
    marker = f"victim-{os.getpid()}"
    stop = threading.Event()
    victim: dict[str, Any] = {}

    def run_victim() -> None:
        code = "import os, time\nprint(os.getuid(), flush=True)\ntime.sleep(120)"
        r = confined(code, marker, skill="s", seconds=60, cancelled=stop.is_set)
        victim.update(uid=int(r.stdout or 0))

    thread = threading.Thread(target=run_victim)
    thread.start()
    try:
        pid = find(marker, time.monotonic() + 20)
        seen = json.loads(confined(PROC, skill="s").stdout)
    finally:
        stop.set()
        thread.join()
    again = json.loads(confined(PROC, skill="s").stdout)
    return {
        "seen": seen,
        "victim": pid,
        "victim_uid": victim["uid"],
        "skilld": os.getpid(),
        "launcher": confine.start().proc.pid,
        "group": confine.uid_for("s") if confine.profile().identity == "separate" else None,
        "next_uid": again["uid"],
        "profile": confine.profile().describe(),
    }


def ipc() -> dict[str, Any]:
    """One call plants System V IPC objects; a later call of another skill reads."""
    key = str(0x5C000000 + os.getpid())
    planted = confined(PLANT, key, skill="planter")
    read = confined(READ, key, skill="reader")
    control_key = str(0x5D000000 + os.getpid())
    return {
        "plant": answers(planted.stdout),
        "read": answers(read.stdout),
        "control_plant": unconfined(PLANT, control_key),
        "control_read": unconfined(READ, control_key),
        "profile": confine.profile().describe(),
    }


# Whether each pid of argv exists, asked as a script would: its group, its session.
# Then the script's own children: a shell pipeline and a Python subprocess it waits for
# and signals must still work.
EXISTS = (
    PRELUDE
    + """\
import signal, subprocess
for i, pid in enumerate(int(p) for p in sys.argv[1:]):
    attempt(f"getpgid{i}", os.getpgid, pid)
    attempt(f"getsid{i}", os.getsid, pid)
attempt("own-group", os.getpgid, 0)
pipe = subprocess.run(["/bin/sh", "-c", "echo one two | wc -w"], capture_output=True)
print("pipeline", pipe.stdout.decode().strip() or pipe.returncode, flush=True)
child = subprocess.Popen(["/bin/sleep", "60"])
child.send_signal(signal.SIGTERM)
print("child", child.wait(), flush=True)
"""
)


def exists() -> dict[str, Any]:
    """A call asks whether another call's process, skilld, the launcher and a pid that
    is no process exist; the control asks the same unconfined."""
    marker = f"victim-{os.getpid()}"
    stop = threading.Event()

    def run_victim() -> None:
        confined(
            "import time\ntime.sleep(120)", marker, skill="s", seconds=60, cancelled=stop.is_set
        )

    thread = threading.Thread(target=run_victim)
    thread.start()
    try:
        pid = find(marker, time.monotonic() + 20)
        launcher = confine.start().proc.pid
        # Above the largest pid_max (2^22): never a process.
        targets = [str(pid), str(os.getpid()), str(launcher), "4000000"]
        probe = confine.run(
            [PYTHON, "-I", "-S", "-c", EXISTS, *targets],
            confinement=Confinement(
                read_only=(PREFIX,),
                skill="s",
                executables=tuple(
                    os.path.realpath(p) for p in ("/bin/sh", "/usr/bin/wc", "/bin/sleep")
                ),
            ),
            deadline=time.monotonic() + 30,
            env={"PATH": "/usr/bin:/bin"},
        )
        control = unconfined(EXISTS, *targets)
    finally:
        stop.set()
        thread.join()
    return {
        "probe": answers(probe.stdout),
        "stderr": probe.stderr.decode(errors="replace")[-2000:],
        "control": control,
        "profile": confine.profile().describe(),
    }


def memory() -> dict[str, Any]:
    """A tree of 8 x 200 MiB under a 256 MiB limit for the tree; and with none."""
    start = time.monotonic()
    limited = confined(TREE, limits=ResourceLimits(memory=256 << 20), seconds=30)
    took = time.monotonic() - start
    # The control: no limit for the tree (each process stays under its own).
    unlimited = confined(TREE, seconds=30)
    return {
        "limited": {
            "memory": limited.memory,
            "signal": limited.signal,
            "timed_out": limited.timed_out,
            "held": answers(limited.stdout).get("held"),
            "seconds": took,
        },
        "unlimited": {"exit": unlimited.exit_code, "held": answers(unlimited.stdout).get("held")},
        "profile": confine.profile().describe(),
    }


# Threads, then children that leave their session and fork again (the grandchild is an
# orphan, reparented): what a tree may start beyond its process limit, and whether any of
# it outlives the call. argv: the marker (every process carries it), how long each sleeps.
TASKS = """\
import os, sys, threading, time
nap = float(sys.argv[2])
threads = 0
try:
    for _ in range(20):
        threading.Thread(target=time.sleep, args=(nap,), daemon=True).start()
        threads += 1
except RuntimeError:
    pass
print("threads", threads, flush=True)
escaped = 0
for _ in range(20):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.setsid()
        try:
            if os.fork() == 0:
                time.sleep(nap)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    escaped += 1
print("escaped", escaped, flush=True)
time.sleep(nap)
"""


def survivors(marker: str) -> list[int]:
    """Pids of live processes whose argv carries ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                zombie = f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
        except OSError:
            continue
        if marker.encode() in argv and not zombie:
            found.append(int(entry.name))
    return found


def tasks() -> dict[str, Any]:
    """A tree starting 20 threads and 20 double-forked session leaders under a process
    limit of 8; the control starts them all unconfined."""
    marker = f"tasks-{os.getpid()}"
    start = time.monotonic()
    done = confined(TASKS, marker, "20", limits=ResourceLimits(processes=8), seconds=15)
    took = time.monotonic() - start
    left = survivors(marker)
    control = unconfined(TASKS, marker + "-control", "0.5")
    return {
        "confined": answers(done.stdout),
        "tasks": done.tasks,
        "signal": done.signal,
        "timed_out": done.timed_out,
        "seconds": took,
        "survivors": left,
        "control": control,
        "profile": confine.profile().describe(),
    }


def main() -> None:
    """Start as ``skilld serve`` does, run the scenario, print its JSON."""
    confine.start_from_env()
    limits = resource.getrlimit(resource.RLIMIT_CPU)
    scenarios = {"reach": reach, "proc": proc, "ipc": ipc, "memory": memory}
    scenarios.update(exists=exists, tasks=tasks)
    out = scenarios[SCENARIO]()
    out["skilld_limits_unchanged"] = resource.getrlimit(resource.RLIMIT_CPU) == limits
    print(json.dumps(out))
    confine.shutdown()


main()
