"""Commands that race their own argv check: symlinks flipped between the check and the open.

The argv check sees ``canonical(arg)``; the program opens the text later. Here a link
under the skill's rw grant is flipped between a file inside and a canary outside,
by a second call of the same skill through a granted ``ln -sfn`` or by a thread of
the host, while commands read or write through it. The kernel (Landlock, from the
skill's fs grants) is the second wall: zero bytes of a canary read, its bytes and
mtime unchanged, nothing created outside, and never an ``internal`` error.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from skilld import confine
from skilld.policy import Tables
from skilld.sandbox import Component
from support.adversarial import Outcome, Probe, compile_dir
from support.grants import give_grant_tree

SECRET = "CANARY-8f3a-outside-every-grant"
ROUNDS = 10

POLICY = """\
fs:
  - id: work
    path: {R}/a
    mode: rw
  - id: docs
    path: {R}/ro
shell:
  - id: ln
    program: /bin/ln
    args: ["-sfn", "*", "{R}/a/*"]
  - id: cat
    program: /bin/cat
    args: ["{R}/a/*"]
  - id: head
    program: /usr/bin/head
    args: ["-c", "200", "{R}/a/*"]
  - id: cp
    program: /bin/cp
    args: ["{R}/a/*", "{R}/a/*"]
  - id: cp-into
    program: /bin/cp
    args: ["{R}/a/inside.txt", "{R}/a/*/*"]
  - id: tee
    program: /usr/bin/tee
    args: ["{R}/a/*"]
  - id: dd
    program: /bin/dd
    args: ["of={R}/a/*", "status=none"]
  - id: truncate
    program: /usr/bin/truncate
    args: ["-s", "0", "{R}/a/*"]
  - id: rm
    program: /bin/rm
    args: ["-rf", "{R}/a/*"]
  - id: tee-ro
    program: /usr/bin/tee
    args: ["{R}/ro/*"]
"""


@pytest.fixture
def world(tmp_path: Path) -> Path:
    """a/ (rw grant) with a file and a real dir, ro/ (ro grant), out/ with canaries."""
    root = Path(os.path.realpath(tmp_path))
    for d in ("a/real", "ro", "out/dir"):
        (root / d).mkdir(parents=True)
    (root / "a/inside.txt").write_text("inside\n")
    (root / "ro/file").write_text("read-only\n")
    (root / "out/secret").write_text(SECRET)
    (root / "out/dir/keep").write_text(SECRET)
    (root / "a/link").symlink_to(root / "a/inside.txt")
    (root / "a/d").symlink_to(root / "a/real")
    (root / "ro/link").symlink_to(root / "out/secret")
    # The rw grant belongs to the skill's group, as an operator sets it up.
    give_grant_tree(root / "a", "prober")
    return root


@pytest.fixture
def tables(world: Path, tmp_path_factory: pytest.TempPathFactory) -> Tables:
    """The racing skill's policy, compiled."""
    return compile_dir(
        tmp_path_factory.mktemp("policies"), {"prober": POLICY.replace("{R}", str(world))}
    )


@pytest.fixture
def probe(prober: Component, tables: Tables) -> Probe:
    """The prober under the racing policy."""
    return Probe(prober, tables)


def snapshot(world: Path) -> dict[str, tuple[bytes, int]]:
    """Bytes and mtime of everything outside the grants (and of out/ itself)."""
    out: dict[str, tuple[bytes, int]] = {}
    for path in [*sorted((world / "out").rglob("*")), world / "out", world / "ro/file"]:
        data = (
            path.read_bytes()
            if path.is_file()
            else b"\n".join(p.name.encode() for p in sorted(path.iterdir()))
        )
        out[str(path)] = (data, path.stat().st_mtime_ns)
    return out


# (id, victim argv ({L}: the link it goes through), stdin, the kind of link: to a file
# ("link") or to a directory ("d"))
Victim = tuple[str, list[str], str | None, str]
VICTIMS: list[Victim] = [
    ("cat", ["/bin/cat", "{L}"], None, "link"),
    ("head", ["/usr/bin/head", "-c", "200", "{L}"], None, "link"),
    ("cp-from", ["/bin/cp", "{L}", "{R}/a/copy"], None, "link"),
    ("cp-into-dir", ["/bin/cp", "{R}/a/inside.txt", "{L}/new"], None, "d"),
    ("tee-write", ["/usr/bin/tee", "{L}"], "PWNED\n", "link"),
    ("dd-write", ["/bin/dd", "of={L}", "status=none"], "PWNED\n", "link"),
    ("truncate", ["/usr/bin/truncate", "-s", "0", "{L}"], None, "link"),
]
TARGETS = {"link": ("{R}/a/inside.txt", "{R}/out/secret"), "d": ("{R}/a/real", "{R}/out/dir")}


def fill(text: str, world: Path) -> str:
    """``text`` with {R} as the world's root."""
    return text.replace("{R}", str(world))


def run_victim(probe: Probe, world: Path, victim: Victim, name: str | None = None) -> Outcome:
    """One call of the victim command through shell.run, going through ``a/<name>``."""
    _, argv, stdin, kind = victim
    link = str(world / "a" / (name or kind))
    return probe(
        "shell_run_timed",
        argv=[fill(a, world).replace("{L}", link) for a in argv],
        timeout_ms=5000,
        stdin=stdin,
    )


def check(out: Outcome, world: Path, seen: dict[str, int]) -> None:
    """Allowed and ran, or refused by the argv check; never a canary byte or ``internal``."""
    report = out.report
    assert report.get("error") in (None, "not-permitted"), report
    if "ok" in report:
        assert SECRET not in report["ok"]["stdout"], report
        seen["ran"] += 1
    else:
        seen["refused"] += 1
    for copy in (world / "a/copy", world / "a/real/new"):
        if copy.is_file():
            assert SECRET not in copy.read_text(errors="replace")


def assert_untouched(world: Path, before: dict[str, tuple[bytes, int]]) -> None:
    """Nothing outside the grants was read into a grant, written, created or removed."""
    assert snapshot(world) == before
    assert not (world / "out/dir/new").exists()


@pytest.fixture
def flipping(world: Path) -> Iterator[Callable[[str], None]]:
    """Start a host thread that swaps a link between inside and outside until the test ends."""
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def start(which: str) -> None:
        inside, outside = (Path(fill(t, world)) for t in TARGETS[which])
        link = world / "a" / which
        tmp = world / "a" / f".{which}.tmp"

        def flip() -> None:
            n = 0
            while not stop.is_set():
                n += 1
                tmp.unlink(missing_ok=True)
                tmp.symlink_to(outside if n % 2 else inside)
                tmp.replace(link)

        thread = threading.Thread(target=flip, daemon=True)
        thread.start()
        threads.append(thread)

    yield start
    stop.set()
    for thread in threads:
        thread.join()


@pytest.mark.parametrize("victim", VICTIMS, ids=[v[0] for v in VICTIMS])
def test_host_thread_flips_links_under_the_grant(
    probe: Probe, world: Path, flipping: Callable[[str], None], victim: Victim
) -> None:
    """A host thread flips the link the command goes through; run many times, nothing
    outside the grants is read, written or created."""
    before = snapshot(world)
    seen = {"ran": 0, "refused": 0}
    flipping(victim[3])
    for _ in range(ROUNDS):
        check(run_victim(probe, world, victim), world, seen)
    assert_untouched(world, before)
    assert seen["ran"] + seen["refused"] == ROUNDS


@pytest.mark.parametrize("victim", VICTIMS, ids=[v[0] for v in VICTIMS])
def test_second_call_of_the_skill_flips_links_with_ln(
    probe: Probe, world: Path, victim: Victim
) -> None:
    """Two concurrent calls of one skill: one flips a link from inside to outside with the
    granted ``ln -sfn`` while the other reads or writes through it; each round a fresh
    link (the argv check refuses to name a link that already points out), many rounds:
    nothing leaks."""
    before = snapshot(world)
    inside, outside = (fill(t, world) for t in TARGETS[victim[3]])
    seen = {"ran": 0, "refused": 0}
    for i in range(ROUNDS):
        link = str(world / "a" / f"{victim[3]}{i}")
        made = probe("shell_run", argv=["/bin/ln", "-sfn", inside, link]).report
        assert made["ok"]["exit"] == 0, made
        start = threading.Barrier(2)
        flipped: list[Outcome] = []

        def flip(
            link: str = link, start: threading.Barrier = start, flipped: list[Outcome] = flipped
        ) -> None:
            start.wait()
            flipped.append(probe("shell_run", argv=["/bin/ln", "-sfn", outside, link]))

        thread = threading.Thread(target=flip)
        thread.start()
        start.wait()
        try:
            check(run_victim(probe, world, victim, f"{victim[3]}{i}"), world, seen)
        finally:
            thread.join()
        assert flipped[0].report["ok"]["exit"] == 0, flipped[0].report
    assert_untouched(world, before)


@pytest.fixture
def flip_after_check(world: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """Make every command start with its link already flipped out: the argv check saw the
    inside target, the program gets the outside one (the race, won every time)."""
    armed: list[str] = []
    real = confine.run

    def late(*args: Any, **kwargs: Any) -> confine.ProcessResult:
        for which in armed:
            link = world / "a" / which
            link.unlink()
            link.symlink_to(Path(fill(TARGETS[which][1], world)))
        return real(*args, **kwargs)

    monkeypatch.setattr(confine, "run", late)
    return armed.append


@pytest.mark.parametrize("victim", VICTIMS, ids=[v[0] for v in VICTIMS])
def test_race_won_every_time_still_reaches_nothing(
    probe: Probe, world: Path, flip_after_check: Callable[[str], None], victim: Victim
) -> None:
    """With the link flipped between the check and the run every time, the kernel alone
    refuses: the command fails with EACCES and every canary is untouched."""
    before = snapshot(world)
    flip_after_check(victim[3])
    out = run_victim(probe, world, victim)
    assert "ok" in out.report, out.report
    assert out.report["ok"]["exit"] != 0, out.report
    assert SECRET not in out.report["ok"]["stdout"]
    assert_untouched(world, before)


# The entry a/x cycles through a real file, a real directory, a link to the outside
# file and a link to the outside directory while these run on it.
SWAPPED: list[Victim] = [
    ("cat", ["/bin/cat", "{L}"], None, "x"),
    ("tee-write", ["/usr/bin/tee", "{L}"], "PWNED\n", "x"),
    ("cp-into", ["/bin/cp", "{R}/a/inside.txt", "{L}"], None, "x"),
    ("rm-rf-trailing-slash", ["/bin/rm", "-rf", "{L}/"], None, "x"),
]


@pytest.fixture
def swapping(world: Path) -> Iterator[None]:
    """A host thread swapping a/x between a file, a directory and links out."""
    stop = threading.Event()
    entry = world / "a/x"

    def make(step: int) -> None:
        kind = step % 4
        if kind == 0:
            entry.write_text("inside\n")
        elif kind == 1:
            entry.mkdir()
        else:
            entry.symlink_to(world / ("out/secret" if kind == 2 else "out/dir"))

    def swap() -> None:
        step = 0
        while not stop.is_set():
            if entry.is_symlink() or entry.is_file():
                entry.unlink(missing_ok=True)
            elif entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            try:
                make(step)
            except OSError:  # a command made something there meanwhile
                continue
            step += 1

    thread = threading.Thread(target=swap, daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join()


@pytest.mark.parametrize("victim", SWAPPED, ids=[v[0] for v in SWAPPED])
@pytest.mark.usefixtures("swapping")
def test_entry_swapped_between_file_dir_and_links_out(
    probe: Probe, world: Path, victim: Victim
) -> None:
    """An entry of a granted directory turning into a file, a directory and links out
    while commands read, write, copy into and remove through it: nothing outside moves."""
    before = snapshot(world)
    seen = {"ran": 0, "refused": 0}
    for _ in range(ROUNDS):
        check(run_victim(probe, world, victim), world, seen)
    assert_untouched(world, before)


def test_read_only_grant_is_not_writable_even_through_its_own_link(
    probe: Probe, world: Path
) -> None:
    """A granted tee into ro/ fails (the grant is read-only), and ro/link (planted by the
    operator's tree, pointing out) is refused by the argv check, never followed."""
    before = snapshot(world)
    wrote = probe(
        "shell_run_timed", argv=["/usr/bin/tee", f"{world}/ro/file"], timeout_ms=5000, stdin="x"
    )
    through = probe(
        "shell_run_timed", argv=["/usr/bin/tee", f"{world}/ro/link"], timeout_ms=5000, stdin="x"
    )
    assert wrote.report["ok"]["exit"] != 0
    assert through.report.get("error") == "not-permitted"
    assert_untouched(world, before)


def test_command_refused_when_the_kernel_cannot_confine(
    probe: Probe, world: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without Landlock (simulated) shell.run refuses with ``unavailable`` naming it; the
    command did not run."""
    monkeypatch.setenv(confine.SIMULATE_ABI_ENV, "0")
    out = probe(
        "shell_run_timed", argv=["/usr/bin/tee", f"{world}/a/made"], timeout_ms=5000, stdin="x"
    )
    assert out.report.get("error") == "unavailable", out.report
    assert "Landlock" in out.report["message"]
    assert not (world / "a/made").exists()
