"""The call is the unit of isolation: a confined call cannot reach another call's
processes, nor skilld's, nor leave IPC objects for the next call, nor hold more memory
with its whole tree than its limit; in every identity mode.

Each scenario runs in a fresh process started as skilld is (``isolation_driver.py``):
as root (a separate identity), as root with ``SKILLD_RUN_AS=10001`` (the image: the
launcher keeps CAP_SETUID/SETGID/CHOWN, the server none; no namespace can be made), and
with a shared identity (the command keeps the launcher's uid, as under ``--user 10001
--cap-drop ALL``). Each also runs its control, the same attack from an unconfined
process, which succeeds: the attack is real, and the walls are what stop it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from skilld.confine._identity import SLOT

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("isolation_driver.py")


def _reachable(path: str) -> bool:
    real = Path(os.path.realpath(path))
    return all(p.stat().st_mode & 0o001 for p in (real, *real.parents))


PYTHON = sys.executable if _reachable(sys.executable) else "/usr/bin/python3"
PREFIX = str(Path(os.path.realpath(PYTHON)).parents[1])

MODES = {
    "root": {},
    "run-as": {"SKILLD_RUN_AS": "10001"},
    "shared": {"SKILLD_CONFINE_IDENTITY": "shared"},
    "shared-no-namespaces": {"SKILLD_CONFINE_IDENTITY": "shared", "SKILLD_CONFINE_NAMESPACES": "0"},
}

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="starts skilld as root")


def drive(mode: str, scenario: str) -> dict[str, Any]:
    """Run ``scenario`` in a fresh skilld stand-in started in ``mode``."""
    paths = ":".join([str(ROOT / "src"), *(p for p in sys.path if p.endswith("site-packages"))])
    done = subprocess.run(
        [PYTHON, "-I", str(DRIVER), paths, PYTHON, PREFIX, scenario],
        capture_output=True,
        env={"PATH": "/usr/bin:/bin", "TMPDIR": "/tmp", **MODES[mode]},
        timeout=180,
        check=False,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr.decode()
    out: dict[str, Any] = json.loads(done.stdout)
    return out


REACH = ("prlimit", "setpriority", "affinity", "scheduler", "ioprio", "ptrace", "status", "pidfd")


@pytest.mark.parametrize("mode", ["root", "run-as", "shared"])
def test_a_call_reaches_neither_another_call_nor_skilld(mode: str) -> None:
    """prlimit(RLIMIT_CPU, 0), setpriority, sched_setaffinity, sched_setscheduler,
    ioprio_set, ptrace, /proc/PID/status and pidfd_open on another call's process (the
    same skill), on skilld and on the launcher are refused, and none of them changed;
    the other call ran on until it was ended. Control: the same calls from an unconfined
    process on a process of its own uid all succeed and change it."""
    out = drive(mode, "reach")
    for i, target in enumerate(out["targets"]):
        got = {name: out["attack"].get(f"{name}{i}") for name in REACH}
        expected = dict.fromkeys(REACH, "EPERM") | {"status": "EACCES", "pidfd": "ENOSYS"}
        assert got == expected, (target, out)
    assert out["unchanged"] == {"victim": True, "skilld": True, "launcher": True}, out
    assert out["victim"]["cancelled"], out
    assert out["skilld_limits_unchanged"], out
    assert out["control"] == {f"{name}0": "ok" for name in REACH}, out
    assert out["control_changed"], out


@pytest.mark.parametrize("mode", ["root", "run-as", "shared"])
def test_a_call_finds_no_other_process_of_its_uid(mode: str) -> None:
    """Every call runs as a uid of its own (from its skill's slot, in the skill's group):
    while another call of the same skill runs, stat() of every /proc/PID finds no
    process of its uid but itself; the uid is given back after the call. Control: with
    a shared identity (no uid to give each call), the same scan finds the other call,
    skilld and the launcher (which the reach test shows it cannot touch)."""
    out = drive(mode, "proc")
    seen = out["seen"]
    if mode == "shared":
        assert {out["victim"], out["skilld"], out["launcher"]} <= set(seen["same_uid"]), out
        return
    assert seen["same_uid"] == [seen["self"]], out
    group = out["group"]
    assert group < seen["uid"] < group + SLOT and group < out["victim_uid"] < group + SLOT
    assert seen["uid"] != out["victim_uid"], out
    # Alone, the next call takes the lowest free uid again: the victim's was given back.
    assert out["next_uid"] == min(seen["uid"], out["victim_uid"]), out


@pytest.mark.parametrize("mode", ["root", "run-as", "shared", "shared-no-namespaces"])
def test_ipc_planted_by_one_call_is_not_read_by_the_next(mode: str) -> None:
    """System V shared memory and a message queue planted by a call of one skill are
    not read by a later call of another: where the call has an IPC namespace of its own
    they die with it (ENOENT), where it has none (the image) the filter refuses every
    IPC call (EPERM). Control: planted and read by two unconfined processes, they are."""
    out = drive(mode, "ipc")
    assert out["control_plant"] == {"shmget": "ok", "msgget": "ok"}, out
    assert out["control_read"] == {"shm": "planted secret", "msg": "planted message"}, out
    if "namespaces ipc" in out["profile"]:
        assert out["plant"] == {"shmget": "ok", "msgget": "ok"}, out
        assert out["read"] == {"shm": "ENOENT", "msg": "ENOENT"}, out
    else:
        assert out["plant"] == {"shmget": "EPERM", "msgget": "EPERM"}, out
        assert out["read"] == {"shm": "EPERM", "msg": "EPERM"}, out


@pytest.mark.parametrize("mode", ["root", "run-as", "shared"])
def test_a_tree_of_processes_is_held_to_the_memory_limit(mode: str) -> None:
    """Eight processes of 200 MiB each under a 256 MiB limit for the tree: the reaper
    measures the tree, kills it soon after it passes the limit (never all eight held)
    and the result says memory. Control: without the tree limit all eight hold theirs
    at once (1.6 GiB, each under its own address-space limit)."""
    out = drive(mode, "memory")
    limited = out["limited"]
    assert limited["held"] is None, out
    assert limited["memory"] > 256 << 20, out
    assert limited["signal"] == 9 and not limited["timed_out"], out
    assert out["unlimited"] == {"exit": 0, "held": "8"}, out


@pytest.mark.parametrize("mode", ["root", "run-as", "shared"])
def test_group_and_session_do_not_tell_which_pids_exist(mode: str) -> None:
    """getpgid and getsid of another call's process, of skilld, of the launcher answer
    exactly as for a pid that is no process (ESRCH); the script's own group, a shell
    pipeline and a child it signals and waits for still work. Control: unconfined, the
    live pids answer and the free one says ESRCH."""
    out = drive(mode, "exists")
    probe, control = out["probe"], out["control"]
    for i in range(4):
        assert probe[f"getpgid{i}"] == probe[f"getsid{i}"] == "ESRCH", out
    assert probe["own-group"] == "ok", out
    assert probe["pipeline"] == "2", out
    assert probe["child"] == str(-signal.SIGTERM), out
    for i in range(3):
        assert control[f"getpgid{i}"] == control[f"getsid{i}"] == "ok", out
    assert control["getpgid3"] == control["getsid3"] == "ESRCH", out


@pytest.mark.parametrize("mode", ["root", "run-as", "shared"])
def test_a_tree_of_threads_and_escaped_sessions_is_held_to_the_process_limit(mode: str) -> None:
    """20 threads, then 20 children that leave their session and fork again (orphans,
    reparented), under a process limit of 8: the tree never starts them all (the
    kernel's RLIMIT_NPROC refuses the rest, or, for a shared identity that is root, the
    launcher's count kills the tree), it ends within its deadline, and no process of it
    outlives the call. Control: unconfined, all 20 and 20 start."""
    out = drive(mode, "tasks")
    assert out["control"] == {"threads": "20", "escaped": "20"}, out
    got = out["confined"]
    threads, escaped = int(got.get("threads", 0)), int(got.get("escaped", 0))
    if mode == "shared":
        # uid 0 is not held by RLIMIT_NPROC: the launcher's count (every 10 ms) ended
        # the tree, over its limit by what started in one interval, long before its end.
        assert out["tasks"] > 8 and out["signal"] == 9 and not out["timed_out"], out
        assert out["tasks"] <= 8 + 40 and out["seconds"] < 10, out
    else:
        # A uid of its own: the kernel refuses the ninth task (the process is one).
        assert not out["tasks"], out
        assert threads + escaped <= 8 and escaped < 20, out
    assert out["survivors"] == [], out
