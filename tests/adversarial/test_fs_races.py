"""fs under fire: entries of granted directories change while the guest reads, writes and globs.

The swapper turns each entry of the granted directories, as fast as it can, into a real
file, a real directory, a symlink to a canary file outside every grant or a symlink to a
canary directory. Meanwhile the real prober guest runs one fs operation hundreds of times
per call through the real host functions, under real compiled tables, with openat2 and
with the component-by-component walk. Whatever interleaving happens: no byte of a canary
is read, listed, stat'ed, written or removed, nothing appears outside the grants, and
every refusal is a clean ``not-found``, ``not-permitted`` or ``invalid-argument`` with no
``internal`` error and no traceback in the log. The same holds when the flipping is done by
a second call of the same skill, through a granted ``ln -s`` and ``fs.remove``.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from skilld.errors import HostCallError
from skilld.sandbox import Component
from skilld.sandbox.abi import fs
from support.adversarial import Probe, compile_dir
from support.grants import give_grant

CANARY = "CANARY-" * 191  # 1337 bytes: a stat that followed a link would show this size
ENTRIES = ("e0", "e1", "e2", "e3")
CLEAN = {"not-found", "not-permitted", "invalid-argument"}
ROUNDS = 40

POLICY = """\
fs:
  - id: ro
    path: {R}/grant
  - id: rw
    path: {R}/rw
    mode: rw
shell:
  - id: ln
    program: /bin/ln
    args: ["-s", "*", "{R}/rw/*"]
"""


class Swapper:
    """Turns every entry of the granted directories into one kind after another, until stopped."""

    def __init__(self, root: Path):
        self.dirs = [root / "grant", root / "rw"]
        self.outside = root / "outside"
        self.stop = threading.Event()
        self.swaps = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _make(self, path: Path, kind: int) -> None:
        if kind == 0:
            path.write_text("inside")
        elif kind == 1:
            path.mkdir()
            (path / "f.txt").write_text("inside")
            (path / "d").mkdir()
        elif kind == 2:
            path.symlink_to(self.outside / "canary.txt")
        else:
            path.symlink_to(self.outside / "dir")

    def _clear(self, path: Path) -> None:
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path, ignore_errors=True)

    def _run(self) -> None:
        kind = 0
        while not self.stop.is_set():
            for directory in self.dirs:
                for name in ENTRIES:
                    path = directory / name
                    try:
                        self._clear(path)
                        self._make(path, (kind + ENTRIES.index(name)) % 4)
                    except OSError:
                        continue  # the guest made or removed something here meanwhile
                    self.swaps += 1
            kind += 1

    def __enter__(self) -> Swapper:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


@pytest.fixture
def world(tmp_path: Path) -> Path:
    """Granted directories beside canaries outside every grant."""
    root = Path(os.path.realpath(tmp_path))
    (root / "grant").mkdir()
    (root / "rw").mkdir()
    (root / "outside" / "dir" / "d").mkdir(parents=True)
    (root / "outside" / "canary.txt").write_text(CANARY)
    (root / "outside" / "dir" / "f.txt").write_text(CANARY)
    # A name only the outside directory has: a listing through a link would show it.
    (root / "outside" / "dir" / "canary-marker").write_text("")
    # The rw grant belongs to the skill's group (its shell commands run in that group).
    give_grant([root / "rw"], "prober")
    return root


def _snapshot(outside: Path) -> dict[str, tuple[int, int, str]]:
    out = {}
    for path in sorted(outside.rglob("*")):
        info = path.lstat()
        body = path.read_text() if path.is_file() else ""
        out[str(path.relative_to(outside))] = (info.st_mtime_ns, info.st_size, body)
    return out


@pytest.fixture(params=["openat2", "walk"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways of resolving beneath a grant: the openat2 syscall and the component walk."""
    if request.param == "openat2" and not fs.USE_OPENAT2:
        pytest.fail("this kernel lacks openat2; the suite runs where it has it")
    monkeypatch.setattr(fs, "USE_OPENAT2", request.param == "openat2")
    return str(request.param)


# (id, prober fs_batch op, paths under the tree's root)
OPS: list[tuple[str, str, list[str]]] = [
    ("read-ro", "read", [f"grant/{e}" for e in ENTRIES] + [f"grant/{e}/f.txt" for e in ENTRIES]),
    ("read-rw", "read", [f"rw/{e}" for e in ENTRIES] + [f"rw/{e}/f.txt" for e in ENTRIES]),
    ("list-ro", "list", [f"grant/{e}" for e in ENTRIES] + [f"grant/{e}/d" for e in ENTRIES]),
    ("list-rw", "list", [f"rw/{e}" for e in ENTRIES] + [f"rw/{e}/d" for e in ENTRIES]),
    ("stat-ro", "stat", [f"grant/{e}" for e in ENTRIES] + [f"grant/{e}/f.txt" for e in ENTRIES]),
    ("stat-rw", "stat", [f"rw/{e}" for e in ENTRIES] + [f"rw/{e}/f.txt" for e in ENTRIES]),
    ("glob-ro", "glob", ["grant/**", "grant/*/*", "grant/**/*.txt", "grant/e0/**"]),
    ("glob-rw", "glob", ["rw/**", "rw/*/*", "rw/**/f.txt", "rw/e1/*"]),
    ("write-rw", "write", [f"rw/{e}" for e in ENTRIES] + [f"rw/{e}/f.txt" for e in ENTRIES]),
    ("write-ro", "write", [f"grant/{e}/f.txt" for e in ENTRIES]),
    ("mkdir-rw", "mkdir", [f"rw/{e}/d/new" for e in ENTRIES] + [f"rw/{e}/m" for e in ENTRIES]),
    ("remove-rw", "remove", [f"rw/{e}/f.txt" for e in ENTRIES] + [f"rw/{e}/d" for e in ENTRIES]),
]


def _leaks(op: str, value: Any) -> bool:
    """Whether a successful result shows anything of the canaries."""
    if op == "read":
        return "CANARY" in str(value)
    if op == "stat":
        return value == len(CANARY)
    if op in ("list", "glob"):
        # The canary directory holds f.txt and d, as the swapped-in directories do; its
        # canary file's name is the one thing only the outside has.
        return any("canary" in str(v) for v in value)
    return False


@pytest.mark.parametrize(("name", "op", "paths"), OPS, ids=[o[0] for o in OPS])
def test_swapped_entries_never_lead_outside(
    prober: Component,
    world: Path,
    tmp_path_factory: pytest.TempPathFactory,
    resolver: str,
    caplog: pytest.LogCaptureFixture,
    name: str,
    op: str,
    paths: list[str],
) -> None:
    """Hundreds of fs operations against entries swapped under them: nothing outside is
    touched, every refusal is clean, and the host logs no error."""
    tables = compile_dir(tmp_path_factory.mktemp("policies"), {"prober": fill_root(world)})
    probe = Probe(prober, tables)
    before = _snapshot(world / "outside")
    caplog.set_level(logging.ERROR, logger="skilld")
    full = [f"{world}/{p}" for p in paths]
    with Swapper(world) as swapper:
        outcome = probe("fs_batch", op=op, paths=full, rounds=ROUNDS)
    reports = outcome.report["ok"]
    assert len(reports) == ROUNDS * len(full)
    assert swapper.swaps > 0
    codes = {r.get("error") for r in reports} - {None}
    assert codes <= CLEAN, [r for r in reports if r.get("error") not in CLEAN | {None}][:3]
    # The interleavings reached successes, and refusals too (a glob refuses only when its
    # literal prefix is swapped at the wrong moment, which a loaded machine may never do).
    if name != "write-ro":
        assert any("ok" in r for r in reports)
    if op != "glob":
        assert codes
    leaked = [r for r in reports if "ok" in r and _leaks(op, r["ok"])]
    assert not leaked, leaked[:3]
    assert "CANARY" not in str(reports)
    assert "outside" not in str(reports)
    assert _snapshot(world / "outside") == before
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def fill_root(root: Path) -> str:
    """The race policy for the tree at ``root``."""
    return POLICY.replace("{R}", str(root))


# (id, prober fs_batch op, paths under rw/ read or written while another call flips them)
FLIPPED: list[tuple[str, str, list[str]]] = [
    ("read", "read", ["rw/link", "rw/dlink/f.txt"]),
    ("write", "write", ["rw/link", "rw/dlink/f.txt"]),
    ("stat", "stat", ["rw/link", "rw/dlink/f.txt"]),
    ("list", "list", ["rw/dlink", "rw/dlink/d"]),
    ("glob", "glob", ["rw/dlink/*", "rw/**"]),
    ("mkdir", "mkdir", ["rw/dlink/d/new"]),
    ("remove", "remove", ["rw/dlink/f.txt", "rw/dlink/d"]),
]


@pytest.mark.parametrize(("name", "op", "paths"), FLIPPED, ids=[f[0] for f in FLIPPED])
def test_a_second_call_flipping_links_never_leads_outside(
    prober: Component,
    world: Path,
    tmp_path_factory: pytest.TempPathFactory,
    resolver: str,
    caplog: pytest.LogCaptureFixture,
    name: str,
    op: str,
    paths: list[str],
) -> None:
    """One call of the skill flips links in its own read-write grant between inside and outside
    targets (fs.remove, then a granted ``ln -s``) while another call goes through them."""
    tables = compile_dir(tmp_path_factory.mktemp("policies"), {"prober": fill_root(world)})
    probe = Probe(prober, tables)
    rw = world / "rw"
    (rw / "real-dir" / "d").mkdir(parents=True)
    (rw / "real-dir" / "f.txt").write_text("inside")
    (rw / "real-file").write_text("inside")
    targets = [
        ("link", world / "outside" / "canary.txt"),
        ("dlink", world / "outside" / "dir"),
        ("link", rw / "real-file"),
        ("dlink", rw / "real-dir"),
    ]
    before = _snapshot(world / "outside")
    caplog.set_level(logging.ERROR, logger="skilld")
    stop = threading.Event()
    flips: list[int] = []

    def flip() -> None:
        i = 0
        while not stop.is_set():
            link, target = targets[i % len(targets)]
            probe("fs_remove", path=f"{rw}/{link}")
            made = probe("shell_run", argv=["/bin/ln", "-s", str(target), f"{rw}/{link}"])
            flips.append(made.report.get("ok", {}).get("exit", -1))
            i += 1

    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    try:
        reports = []
        while len(flips) < 8 or len(reports) < 200:
            out = probe("fs_batch", op=op, paths=[f"{world}/{p}" for p in paths], rounds=20)
            reports += out.report["ok"]
    finally:
        stop.set()
        flipper.join()
    assert flips.count(0) >= 4, flips  # the links really flipped, through the granted ln
    codes = {r.get("error") for r in reports} - {None}
    assert codes <= CLEAN, [r for r in reports if r.get("error") not in CLEAN | {None}][:3]
    leaked = [r for r in reports if "ok" in r and _leaks(op, r["ok"])]
    assert not leaked, leaked[:3]
    assert "CANARY" not in str(reports)
    assert "outside" not in str(reports)
    assert _snapshot(world / "outside") == before
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_canonical_under_churn_resolves_or_refuses(world: Path) -> None:
    """shell's path arguments and transfer's paths go through ``fs.canonical``: with links
    swapped for files and removed between its lstat and its readlink, it returns a path or
    refuses with ``not-found``; an ``OSError`` (an ``internal`` error) never comes out."""
    outcomes = {"resolved": 0, "refused": 0}
    codes: set[str] = set()
    # Enough rounds to see the race (the old code raised within 3 s), bounded in time so
    # that a resolver refusing everything fails below instead of looping.
    give_up = time.monotonic() + 60
    with Swapper(world) as swapper:
        while (swapper.swaps < 4000 or outcomes["resolved"] < 4000) and (
            time.monotonic() < give_up
        ):
            for name in ENTRIES:
                for leaf in ("", "/f.txt", "/d/x"):
                    try:
                        fs.canonical(f"{world}/grant/{name}{leaf}")
                    except HostCallError as err:
                        codes.add(err.code)
                        outcomes["refused"] += 1
                    else:
                        outcomes["resolved"] += 1
    assert codes <= {"not-found"}, codes
    assert outcomes["resolved"] >= 4000
