"""The confined-process runner with real processes, real files, real sockets and signals."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skilld.confine import (
    SIMULATE_ABI_ENV,
    Confinement,
    ConfinementUnavailable,
    ProcessResult,
    ProgramNotStarted,
    ResourceLimits,
    from_grants,
    landlock_abi,
    profile,
    run,
    uid_for,
)
from skilld.confine._identity import SLOT
from support.grants import give_grant

PATH = {"PATH": "/usr/bin:/bin"}
SH = "/bin/sh"


def _reachable(path: str) -> bool:
    """Whether a user other than the file's owner can execute ``path`` (every directory
    on the way searchable by others)."""
    real = Path(os.path.realpath(path))
    return all(p.stat().st_mode & 0o001 for p in (real, *real.parents))


# Confined commands run as a skill's own uid: the test's interpreter may live where only
# its owner reaches (a pyenv under /root); the system's then stands in for the probes.
PYTHON = sys.executable if _reachable(sys.executable) else "/usr/bin/python3"
PREFIX = str(Path(os.path.realpath(PYTHON)).parents[1])
# The uid commands run for no particular skill (the tests' Confinement() has none).
ANON = uid_for(None)


def go(
    argv: Sequence[str],
    confinement: Confinement | None = None,
    *,
    seconds: float = 10.0,
    **kwargs: object,
) -> ProcessResult:
    """Run ``argv`` confined with ``PATH`` set and a deadline ``seconds`` away."""
    return run(
        argv,
        confinement=confinement or Confinement(),
        deadline=time.monotonic() + seconds,
        env=PATH,
        **kwargs,  # type: ignore[arg-type]
    )


def tools(*names: str) -> tuple[str, ...]:
    """Absolute paths of system programs a shell script may execute."""
    found = [shutil.which(n, path=PATH["PATH"]) for n in names]
    assert all(found), found
    return tuple(str(f) for f in found)


@pytest.fixture
def world(tmp_path: Path) -> Path:
    """ro/ and rw/ (to be granted) and out/ (never granted) with a canary in each."""
    root = Path(os.path.realpath(tmp_path))
    for name in ("ro", "rw", "out"):
        (root / name).mkdir()
        (root / name / "canary").write_text(f"{name}-secret")
    # A rw grant belongs to the skill's group (the operator chowns it so, group-writable:
    # each call runs as a uid of its own in that group); an ro grant and out/ stay the
    # host's.
    give_grant((root / "rw", root / "rw" / "canary"), None)
    return root


def canary_state(path: Path) -> tuple[bytes, int]:
    """A file's bytes and mtime, to prove nothing touched it."""
    return path.read_bytes(), path.stat().st_mtime_ns


def grants(world: Path, **kwargs: object) -> Confinement:
    """ro/ read-only and rw/ read-write, nothing else of the tree."""
    return Confinement(
        read_only=(str(world / "ro"),),
        read_write=(str(world / "rw"),),
        **kwargs,  # type: ignore[arg-type]
    )


def host_processes(marker: str) -> list[int]:
    """Pids of live (not zombie) host processes whose command line contains ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


# -- running and reporting -----------------------------------------------------


def test_runs_a_program_and_captures_its_output() -> None:
    """A granted program runs; its stdout, stderr and exit code come back."""
    result = go([SH, "-c", "echo out; echo err >&2; exit 3"])
    assert (result.exit_code, result.stdout, result.stderr) == (3, b"out\n", b"err\n")
    assert result.signal is None
    assert not result.timed_out


def test_reports_the_signal_that_ended_it() -> None:
    """A command killed by a signal reports the signal, not an exit code."""
    result = go([SH, "-c", "kill -SEGV $$"])
    assert result.exit_code is None
    assert result.signal == signal.SIGSEGV


def test_stdin_is_fed_and_output_capped() -> None:
    """stdin reaches the program; output past the cap is read, dropped and counted."""
    result = go(["/bin/cat"], stdin=b"x" * 5000, output_cap=1000)
    assert result.stdout == b"x" * 1000
    assert result.dropped == 4000
    assert result.exit_code == 0


def test_environment_is_exactly_what_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's environment does not leak in: the command sees only ``env``."""
    monkeypatch.setenv("SKILLD_CONFINE_SECRET", "leak")
    result = go(["/usr/bin/env"])
    assert result.stdout == b"PATH=/usr/bin:/bin\n"


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40),
        max_size=5,
    )
)
def test_argv_reaches_the_program_as_data(args: list[str]) -> None:
    """Any argv (metacharacters, newlines, unicode) reaches the program word for word."""
    result = go(["/usr/bin/printf", r"%s\0", *args])
    words = [a.encode() for a in args] or [b""]
    assert result.stdout == b"".join(w + b"\0" for w in words)


def test_missing_program_is_not_started() -> None:
    """A program that does not exist is ProgramNotStarted (ENOENT), not a crash."""
    with pytest.raises(ProgramNotStarted) as caught:
        go(["/nonexistent/program"])
    assert caught.value.errno == errno.ENOENT


def test_missing_cwd_is_not_started(tmp_path: Path) -> None:
    """A working directory that does not exist stops the command before it runs."""
    with pytest.raises(ProgramNotStarted) as caught:
        go(["/bin/true"], cwd=str(tmp_path / "gone"))
    assert caught.value.errno == errno.ENOENT


# -- files -------------------------------------------------------------------


def test_reads_inside_read_grants(world: Path) -> None:
    """Files under read-only and read-write grants can be read."""
    result = go(["/bin/cat", str(world / "ro/canary"), str(world / "rw/canary")], grants(world))
    assert result.stdout == b"ro-secretrw-secret"


def test_reads_outside_the_grants_are_refused_by_the_kernel(world: Path) -> None:
    """A file outside every grant cannot be read: EACCES from the kernel, no bytes."""
    result = go(["/bin/cat", str(world / "out/canary")], grants(world))
    assert result.exit_code != 0
    assert b"Permission denied" in result.stderr
    assert b"out-secret" not in result.stdout


def test_system_files_outside_grants_are_refused() -> None:
    """/etc/passwd is not part of a program's runtime: unreadable without a grant."""
    result = go(["/bin/cat", "/etc/passwd"])
    assert result.exit_code != 0
    assert not result.stdout


def test_writes_only_inside_read_write_grants(world: Path) -> None:
    """Writing works in rw/, and fails in ro/ and out/ with their canaries untouched."""
    before = {n: canary_state(world / n / "canary") for n in ("ro", "out")}
    script = " ; ".join(
        f"echo pwned > {world}/{n}/canary; echo new > {world}/{n}/new" for n in ("ro", "rw", "out")
    )
    result = go([SH, "-c", script], grants(world))
    assert b"Permission denied" in result.stderr
    assert (world / "rw/canary").read_text() == "pwned\n"
    assert (world / "rw/new").read_text() == "new\n"
    for name, state in before.items():
        assert canary_state(world / name / "canary") == state
        assert not (world / name / "new").exists()


def test_truncation_and_removal_outside_are_refused(world: Path) -> None:
    """truncate, rm and mv of an outside file fail; the canary keeps bytes and mtime."""
    canary = world / "out/canary"
    before = canary_state(canary)
    for argv in (
        ["/usr/bin/truncate", "-s", "0", str(canary)],
        ["/bin/rm", "-f", str(canary)],
        ["/bin/mv", str(canary), str(world / "rw/stolen")],
    ):
        assert go(argv, grants(world)).exit_code != 0
    assert canary_state(canary) == before
    assert not (world / "rw/stolen").exists()


def test_symlink_inside_a_grant_leads_nowhere_outside(world: Path) -> None:
    """A link in rw/ to out/ gives no access: the kernel checks where the file is."""
    (world / "rw/link").symlink_to(world / "out/canary")
    (world / "rw/dirlink").symlink_to(world / "out")
    before = canary_state(world / "out/canary")
    read = go(["/bin/cat", str(world / "rw/link")], grants(world))
    write = go(
        [SH, "-c", f"echo x > {world}/rw/link; echo y > {world}/rw/dirlink/new"], grants(world)
    )
    assert b"out-secret" not in read.stdout
    assert read.exit_code != 0
    assert write.stderr.count(b"Permission denied") == 2
    assert canary_state(world / "out/canary") == before
    assert not (world / "out/new").exists()


def test_a_grant_that_is_a_symlink_gives_no_access(world: Path) -> None:
    """A grant path that is (or became) a link is not followed when the ruleset is made."""
    (world / "swapped").symlink_to(world / "out")
    confinement = Confinement(read_only=(str(world / "swapped"),))
    result = go(["/bin/cat", str(world / "swapped/canary")], confinement)
    assert b"out-secret" not in result.stdout
    assert result.exit_code != 0


def test_hardlink_out_of_a_grant_cannot_be_made(world: Path) -> None:
    """``ln`` of an outside file into rw/ is refused (Landlock REFER), so is ``cp``."""
    link = go(["/bin/ln", str(world / "out/canary"), str(world / "rw/hard")], grants(world))
    copy = go(["/bin/cp", str(world / "out/canary"), str(world / "rw/copy")], grants(world))
    assert link.exit_code != 0
    assert copy.exit_code != 0
    assert not (world / "rw/hard").exists()
    assert not (world / "rw/copy").exists()


def test_only_the_program_itself_is_executable(world: Path) -> None:
    """The command cannot start other programs unless they are granted executables."""
    denied = go([SH, "-c", "/usr/bin/id"])
    allowed = go([SH, "-c", "/usr/bin/id -u"], Confinement(executables=tools("id")))
    assert denied.exit_code == 126
    assert b"Permission denied" in denied.stderr
    assert ANON < int(allowed.stdout) < ANON + SLOT


@pytest.mark.parametrize("shebang", ["#!/bin/sh", "#!/usr/bin/env sh"])
def test_script_runs_with_its_interpreter(world: Path, shebang: str) -> None:
    """A script's #! interpreter (also through /usr/bin/env) is executable for it."""
    script = world / "ro/script"
    script.write_text(f"{shebang}\necho from-script\n")
    script.chmod(0o755)
    result = go([str(script)], grants(world))
    assert result.stdout == b"from-script\n", result.stderr


def test_no_privileges_remain() -> None:
    """The command has no capabilities at all and no_new_privs, even when skilld is root."""
    result = go(["/bin/cat", "/proc/self/status"], Confinement(read_only=("/proc",)))
    status = dict(line.split(":", 1) for line in result.stdout.decode().splitlines() if ":" in line)
    for field in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[field].strip(), 16) == 0, field
    assert status["NoNewPrivs"].strip() == "1"


def test_nested_namespaces_give_no_way_out(world: Path) -> None:
    """A command can neither make its own user and mount namespaces (the seccomp layer
    refuses ``unshare``; without it, it may, and is root there) nor mount anything:
    Landlock's rules cannot be covered over."""
    code = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.unshare(0x10000000 | 0x00020000), ctypes.get_errno())\n"
        f"print(libc.mount(b'/', b'{world}/rw', b'', 0x1000, None), ctypes.get_errno())\n"
    )
    result = go(
        [PYTHON, "-I", "-S", "-c", code],
        Confinement(read_only=(PREFIX,), read_write=(str(world / "rw"),)),
    )
    first = b"-1 %d" % errno.EPERM if profile().seccomp else b"0 0"
    assert result.stdout.splitlines() == [first, b"-1 %d" % errno.EPERM], result.stderr


def test_file_size_limit(world: Path) -> None:
    """RLIMIT_FSIZE stops a file from growing past the limit (SIGXFSZ)."""
    limits = ResourceLimits(file_size=100_000)
    target = world / "rw/big"
    result = go(
        [SH, "-c", f"/usr/bin/head -c 1000000 /dev/zero > {target}"],
        grants(world, executables=tools("head"), limits=limits),
    )
    assert result.exit_code != 0 or result.signal is not None
    assert target.stat().st_size <= 100_000


def test_address_space_limit() -> None:
    """RLIMIT_AS makes a large allocation fail inside the command, not in the host."""
    limits = ResourceLimits(address_space=256 << 20)
    result = go(
        [PYTHON, "-I", "-S", "-c", "bytearray(600 << 20)"],
        Confinement(read_only=(PREFIX,), limits=limits),
    )
    assert b"MemoryError" in result.stderr


# -- processes ---------------------------------------------------------------


def test_setsid_grandchild_is_gone_at_the_deadline() -> None:
    """A grandchild that calls setsid and sleeps dies with the tree at the deadline."""
    marker = "86399.123"
    script = f"/usr/bin/setsid /bin/sleep {marker} & /bin/sleep 86398"
    result = go([SH, "-c", script], Confinement(executables=tools("setsid", "sleep")), seconds=1.0)
    assert result.timed_out
    assert result.duration < 1.0 + 2.0  # the tree asked for a day
    assert host_processes(marker) == []


def test_background_grandchild_is_gone_when_the_program_exits() -> None:
    """A daemon left behind (setsid, stdio closed) dies when the program exits."""
    marker = "86397.5"
    script = f"/usr/bin/setsid /bin/sleep {marker} </dev/null >/dev/null 2>&1 & echo started"
    result = go([SH, "-c", script], Confinement(executables=tools("setsid", "sleep")))
    assert result.stdout == b"started\n"
    assert host_processes(marker) == []


def test_no_time_left_starts_nothing(world: Path) -> None:
    """A deadline already passed times out at once, without starting the program."""
    marker = world / "rw/ran"
    result = go(["/usr/bin/touch", str(marker)], grants(world), seconds=-1)
    assert result.timed_out
    assert not marker.exists()


def test_cancelled_ends_the_tree(world: Path) -> None:
    """When the caller cancels, the command's whole tree ends and the result says so."""
    started = world / "rw/started"
    marker = "86395.25"
    result = go(
        [SH, "-c", f"echo > {started}; exec /bin/sleep {marker}"],
        grants(world, executables=tools("sleep")),
        seconds=30,
        cancelled=started.exists,
    )
    assert result.cancelled
    assert not result.timed_out
    assert result.duration < 5
    assert host_processes(marker) == []


def test_fork_bomb_is_contained_and_the_next_call_answers() -> None:
    """A fork bomb stays under its process limit, ends at the deadline, and the runner
    answers the next call at once."""
    marker = "skilld-fork-bomb-4711"  # the bomb's $0: every forked shell carries it
    peak = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], len(host_processes(marker)))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        bomb = go(
            # The bomb in a subshell; the main shell only spins (a fork failing in it
            # would end it early).
            [SH, "-c", "(f() { f | f & }; f); while :; do :; done", marker],
            Confinement(limits=ResourceLimits(processes=16)),
            seconds=1.5,
        )
    finally:
        done.set()
        watcher.join()
    assert bomb.timed_out
    assert b"Cannot fork" in bomb.stderr  # the limit was reached ...
    assert peak[0] <= 16  # ... and held
    assert host_processes(marker) == []
    assert go(["/bin/echo", "next"]).stdout == b"next\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="a shared identity that is uid 0 needs root")
def test_a_shared_root_identity_asks_the_launcher_to_count_tasks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where commands share skilld's identity and it is root, RLIMIT_NPROC may bound
    nothing (the kernel exempts uid 0 of the initial user namespace): the spec then asks
    the launcher to count the tree's tasks against the process limit."""
    from skilld.confine import _runner

    specs: list[dict[str, object]] = []
    made = _runner._spec

    def spy(*args: object, **kwargs: object) -> dict[str, object]:
        spec = made(*args, **kwargs)  # type: ignore[arg-type]
        specs.append(spec)
        return spec

    monkeypatch.setattr(_runner, "_spec", spy)
    go(["/bin/true"], Confinement(limits=ResourceLimits(processes=16)))
    monkeypatch.setenv("SKILLD_CONFINE_IDENTITY", "shared")
    go(["/bin/true"], Confinement(limits=ResourceLimits(processes=16)))
    assert [spec["tasks"] for spec in specs] == [None, 16]  # a uid of its own: the kernel's


def test_the_launcher_ends_a_tree_over_its_task_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher's own bound, as a host where RLIMIT_NPROC does not bind has it (the
    spec's ``tasks`` below the rlimit): a tree that starts more processes than it may
    is killed whole at once, not at its deadline, the result says how many it ran, and
    the next call answers."""
    from skilld.confine import _runner

    made = _runner._spec

    def unbound(*args: object, **kwargs: object) -> dict[str, object]:
        spec = made(*args, **kwargs)  # type: ignore[arg-type]
        spec["tasks"] = 6
        return spec

    monkeypatch.setattr(_runner, "_spec", unbound)
    marker = "skilld-task-count-4713"
    result = go(
        [SH, "-c", "for i in 1 2 3 4 5 6 7 8 9 10 11 12; do sleep 30.4713 & done; wait", marker],
        grants_for_sleep(),
        seconds=20,
    )
    assert result.tasks > 6, result
    assert result.signal == signal.SIGKILL
    assert not result.timed_out
    assert result.duration < 10
    assert host_processes(marker) == []
    assert host_processes("30.4713") == []
    monkeypatch.setattr(_runner, "_spec", made)
    assert go(["/bin/echo", "next"]).stdout == b"next\n"


def grants_for_sleep() -> Confinement:
    return Confinement(executables=tools("sleep"), limits=ResourceLimits(processes=64))


# -- network -----------------------------------------------------------------


def connect(port: int, confinement: Confinement) -> ProcessResult:
    """Have bash open a TCP connection to 127.0.0.1:port; exit 0 when it connected."""
    return go(
        ["/bin/bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected"], confinement
    )


def test_no_network_without_a_grant(listener: int) -> None:
    """Without a tcp grant the command has an empty network namespace: no loopback."""
    result = connect(listener, Confinement())
    assert result.exit_code != 0
    assert b"connected" not in result.stdout


def test_granted_port_connects_and_others_do_not(listener: int) -> None:
    """A tcp_connect grant opens its port only (Landlock TCP rules in the host's network)."""
    assert connect(listener, Confinement(tcp_connect=(listener,))).stdout == b"connected\n"
    other = connect(listener, Confinement(tcp_connect=(listener + 1 if listener < 65535 else 1,)))
    assert other.exit_code != 0
    assert b"Permission denied" in other.stderr


def test_name_resolution_files_come_with_the_network() -> None:
    """A command with a tcp grant can read /etc/hosts (to resolve names); one without cannot."""
    assert go(["/bin/cat", "/etc/hosts"], Confinement(tcp_connect=(443,))).exit_code == 0
    assert go(["/bin/cat", "/etc/hosts"]).exit_code != 0


def test_abstract_unix_socket_of_the_host_is_out_of_reach() -> None:
    """An abstract unix socket of the host cannot be reached, with or without network."""
    name = f"\0skilld-confine-test-{os.getpid()}"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(name)
    srv.listen(1)
    code = (
        "import socket,sys\n"
        "try:\n s=socket.socket(socket.AF_UNIX)\n"
        f" s.connect({name!r}); print('reached')\nexcept OSError as e: print(e.errno)"
    )
    try:
        for confinement in (Confinement(), Confinement(tcp_connect=(9,))):
            result = go(
                [PYTHON, "-I", "-S", "-c", code],
                Confinement(
                    read_only=(PREFIX,),
                    tcp_connect=confinement.tcp_connect,
                ),
            )
            # EPERM from the seccomp layer (no AF_UNIX without a socket grant); without
            # it, ECONNREFUSED in an empty network namespace, EPERM from Landlock's scope.
            assert result.stdout in (b"%d\n" % errno.ECONNREFUSED, b"%d\n" % errno.EPERM)
    finally:
        srv.close()


def test_host_processes_cannot_be_signalled() -> None:
    """kill of a host process fails from inside (own PID namespace, Landlock signal scope)."""
    victim = subprocess.Popen(["/bin/sleep", "86396"])
    try:
        for confinement in (Confinement(), Confinement(tcp_connect=(9,))):
            result = go([SH, "-c", f"kill -9 {victim.pid}"], confinement)
            assert result.exit_code != 0
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_host_processes_cannot_be_traced() -> None:
    """ptrace(ATTACH) of a host process fails from inside: it is not even visible."""
    victim = subprocess.Popen(["/bin/sleep", "86394"])
    code = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"print(libc.ptrace(16, {victim.pid}, None, None), ctypes.get_errno())\n"
    )
    try:
        for tcp in ((), (9,)):
            result = go(
                [PYTHON, "-I", "-S", "-c", code],
                Confinement(read_only=(PREFIX,), tcp_connect=tcp),
            )
            assert result.stdout.split()[0] == b"-1", result.stderr
            assert int(result.stdout.split()[1]) in (errno.ESRCH, errno.EPERM)
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


# -- failing closed ------------------------------------------------------------


def test_kernel_has_what_the_runner_needs() -> None:
    """This machine's kernel has Landlock ABI 6 or later (so no test here is vacuous)."""
    assert landlock_abi() >= 6


@pytest.mark.parametrize(
    ("abi", "confinement", "feature"),
    [
        (0, Confinement(), "landlock"),
        (2, Confinement(), "landlock"),
        (3, Confinement(tcp_connect=(443,)), "landlock-tcp"),
        (5, Confinement(tcp_connect=(443,)), "landlock-scope"),
        (5, Confinement(network=True), "landlock-scope"),
    ],
    ids=["no-landlock", "abi-2", "abi-3-tcp", "abi-5-tcp", "abi-5-network"],
)
def test_refused_not_run_unconfined(
    monkeypatch: pytest.MonkeyPatch,
    world: Path,
    abi: int,
    confinement: Confinement,
    feature: str,
) -> None:
    """Where the (simulated) kernel lacks a feature the ruleset needs, the command is
    refused naming it, and it never ran (its marker file does not exist)."""
    monkeypatch.setenv(SIMULATE_ABI_ENV, str(abi))
    marker = world / "rw/ran"
    with_rw = Confinement(
        read_write=(str(world / "rw"),),
        tcp_connect=confinement.tcp_connect,
        network=confinement.network,
    )
    with pytest.raises(ConfinementUnavailable) as caught:
        go(["/usr/bin/touch", str(marker)], with_rw)
    assert caught.value.feature == feature
    assert feature.split("-")[0] in str(caught.value).lower()
    assert not marker.exists()


def test_older_abi_still_confines_what_it_can(monkeypatch: pytest.MonkeyPatch, world: Path) -> None:
    """With a simulated ABI 3 (enough for files, no network needed) commands run confined."""
    monkeypatch.setenv(SIMULATE_ABI_ENV, "3")
    result = go(["/bin/cat", str(world / "out/canary")], grants(world))
    assert result.exit_code != 0
    assert b"out-secret" not in result.stdout


# -- grants -------------------------------------------------------------------


def test_from_grants_maps_fs_and_tcp_rules() -> None:
    """fs rules become ro/rw directories (a glob: its literal prefix), tcp rules ports."""
    confinement = from_grants(
        [
            {"id": "a", "path": "/data/in", "mode": "ro"},
            {"id": "b", "path": "/data/out/**/*.txt", "mode": "rw"},
            {"id": "c", "path": "/srv/*/logs", "mode": "ro"},
        ],
        [{"id": "t", "host": "db.test", "ports": [[5432, 5432], [8080, 8082]]}],
    )
    assert confinement.read_only == ("/data/in", "/srv")
    assert confinement.read_write == ("/data/out",)
    assert confinement.tcp_connect == (5432, 8080, 8081, 8082)
    assert confinement.shares_network


def test_from_grants_refuses_port_ranges_too_wide() -> None:
    """A tcp grant of thousands of ports is refused rather than widened to the network."""
    with pytest.raises(ConfinementUnavailable, match="port"):
        from_grants([], [{"id": "t", "host": "*", "ports": [[1, 65535]]}])


def test_a_fifo_where_a_program_was_expected_never_blocks_the_host(tmp_path: Path) -> None:
    """The host reads a program's head (ELF loader, ``#!`` line) to know what to allow: a
    FIFO or a device planted there is not opened for a read that would wait forever."""
    from skilld.confine._runner import program_files

    fifo = tmp_path / "tool"
    os.mkfifo(fifo)
    started = time.monotonic()
    assert program_files(str(fifo)) == (str(fifo),)
    assert program_files("/dev/zero") == ("/dev/zero",)
    assert time.monotonic() - started < 5


def test_the_programs_files_are_read_again_when_a_file_or_link_on_the_way_changes(
    tmp_path: Path,
) -> None:
    """``program_files`` is kept per program, but a script replaced or rewritten with
    another ``#!`` line, or a link moved to another program, gives the new program's
    files at once."""
    from skilld.confine._runner import program_files

    sh, python = os.path.realpath("/bin/sh"), os.path.realpath(sys.executable)
    script = tmp_path / "tool"
    script.write_text("#!/bin/sh\necho\n")
    assert sh in program_files(str(script))
    assert program_files(str(script)) == program_files(str(script))
    replacement = tmp_path / "new"
    replacement.write_text(f"#!{python}\necho\n")
    replacement.replace(script)
    files = program_files(str(script))
    assert python in files, files
    assert sh not in files, files
    script.write_text("#!/bin/sh\n")  # in place: the same inode, another size
    assert sh in program_files(str(script))
    link = tmp_path / "link"
    link.symlink_to("/bin/sh")
    assert sh in program_files(str(link))
    link.unlink()
    link.symlink_to(sys.executable)
    files = program_files(str(link))
    assert python in files, files
    assert sh not in files, files


# -- the launcher ----------------------------------------------------------------


REUSE_PROBE = """
import fcntl, os
fds = []
for fd in range(3, 256):
    try:
        fcntl.fcntl(fd, fcntl.F_GETFD)
    except OSError:
        continue
    fds.append(fd)
print(os.getppid(), os.getresuid()[0], os.geteuid(), fds)
"""


def test_a_reused_call_process_hands_the_next_command_nothing_of_the_last() -> None:
    """The per-call process C runs one command after another: the next command of the
    same C (the same parent) gets no descriptor beyond stdio and its own call's uid,
    whatever the one before it left (a command whose tree is still running when it
    exits, and a daemon)."""
    confinement = Confinement(read_only=(PREFIX,), executables=tools("sleep"))
    seen: list[list[str]] = []
    for _ in range(4):
        first = go([SH, "-c", "/bin/sleep 30 & exec 7</dev/null; echo left"], confinement)
        assert first.exit_code == 0, first
        probe = go([PYTHON, "-I", "-S", "-c", REUSE_PROBE], confinement)
        assert probe.exit_code == 0, probe
        parent, real, effective, fds = probe.stdout.decode().split(" ", 3)
        assert fds.strip() == "[]", probe
        assert real == effective, probe
        assert int(real) not in (0, os.getuid()), probe
        seen.append([parent, real])
    # One C served them (it says it is idle before the host sees the end; a C that
    # reaches its 500th command on the way hands over to one other): what the test
    # claims is about a reused C. Without reuse, every probe has a parent of its own.
    assert len({parent for parent, _ in seen}) <= 2, seen


def test_concurrent_calls_each_get_their_own_output() -> None:
    """Sixteen calls from eight threads at once: each gets its own stdin back, exit code
    and nothing of another call's output (only the hand-over is shared)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int) -> tuple[int, ProcessResult]:
        return i, go([SH, "-c", f'read line; echo "$line"; exit {i % 7}'], stdin=b"call %d\n" % i)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(16)))
    for i, result in results:
        assert result.stdout == b"call %d\n" % i
        assert result.exit_code == i % 7


def test_a_launcher_that_died_is_restarted_by_the_next_call() -> None:
    """SIGKILL the launcher: the next call starts a new one and is answered, confined."""
    from skilld.confine import _client

    old = _client.launcher()
    old.proc.kill()
    old.proc.wait()
    result = go(["/usr/bin/id", "-u"], Confinement(executables=tools("id")))
    assert ANON < int(result.stdout) < ANON + SLOT
    assert _client.launcher().proc.pid != old.proc.pid


def test_the_profile_names_every_layer() -> None:
    """The profile says which identity mode, Landlock ABI, seccomp, namespaces and
    reaper commands get here, in one line."""
    prof = profile()
    line = prof.describe()
    assert prof.runnable, line
    assert prof.identity == ("separate" if os.geteuid() == 0 else "shared")  # as started
    for word in ("identity", f"landlock ABI {landlock_abi()}", "seccomp", "namespaces", "reaper"):
        assert word in line
