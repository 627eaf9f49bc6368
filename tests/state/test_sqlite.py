"""SQLite key-value state: namespaces, quotas, prefix listing, durability under kill -9."""

from __future__ import annotations

import itertools
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skilld.errors import QuotaExceeded
from skilld.state import SqliteState


@pytest.fixture
def state(tmp_path: Path) -> Iterator[SqliteState]:
    """A fresh database."""
    s = SqliteState(tmp_path / "state.sqlite3")
    yield s
    s.close()


@pytest.fixture(scope="module")
def shared_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqliteState]:
    """One database for a property test's examples (each example takes a fresh namespace)."""
    s = SqliteState(tmp_path_factory.mktemp("kv") / "state.sqlite3")
    yield s
    s.close()


def test_roundtrip(state: SqliteState) -> None:
    """set, get, delete and keys behave like a dictionary."""
    kv = state.store("a")
    assert kv.get("x") is None
    kv.set("x", b"1")
    assert kv.get("x") == b"1"
    kv.set("x", b"2")
    assert kv.get("x") == b"2"
    assert kv.delete("x") is True
    assert kv.delete("x") is False


def test_namespaces_are_separate(state: SqliteState) -> None:
    """One skill never sees another's keys, even with the same key name."""
    a, b = state.store("a"), state.store("b")
    a.set("secret", b"a's")
    assert b.get("secret") is None
    assert b.keys("", 100) == []
    assert b.delete("secret") is False
    assert a.get("secret") == b"a's"


def test_prefix_is_literal(state: SqliteState) -> None:
    """Prefix listing treats % and _ as data and returns keys in order."""
    kv = state.store("a")
    for key in ["a_1", "a%2", "ab", "a_0", "b"]:
        kv.set(key, b"")
    assert kv.keys("a_", 10) == ["a_0", "a_1"]
    assert kv.keys("a%", 10) == ["a%2"]
    assert kv.keys("", 2) == ["a%2", "a_0"]


def test_value_limit(state: SqliteState) -> None:
    """A value over the per-value limit is refused and nothing is stored."""
    kv = state.store("a", value_limit=10)
    with pytest.raises(QuotaExceeded, match="10-byte"):
        kv.set("k", b"x" * 11)
    assert kv.get("k") is None


def test_total_quota_counts_replacements(state: SqliteState) -> None:
    """The per-skill quota counts current sizes: replacing and deleting free space."""
    kv = state.store("a", total_limit=100)
    kv.set("k", b"x" * 90)
    kv.set("k", b"y" * 90)  # replaces, does not add up
    with pytest.raises(QuotaExceeded, match="quota"):
        kv.set("j", b"z" * 20)
    kv.delete("k")
    kv.set("j", b"z" * 20)
    assert kv.get("j") == b"z" * 20


def _usage(state: SqliteState, skill: str) -> int:
    """The bytes the store has booked for ``skill`` (0 when it has no row)."""
    row = state._conn().execute("SELECT bytes FROM usage WHERE skill = ?", (skill,)).fetchone()
    return 0 if row is None else int(row[0])


def test_usage_counts_key_bytes_not_characters(state: SqliteState) -> None:
    """Overwriting then deleting a non-ASCII key returns usage to zero (no drift)."""
    kv = state.store("a")
    key = "é" * 10  # 10 characters, 20 bytes
    for i in range(5):
        kv.set(key, b"v%d" % i)
    assert _usage(state, "a") == 20 + 2
    kv.delete(key)
    assert _usage(state, "a") == 0


_OPS = st.lists(
    st.tuples(st.sampled_from(["set", "delete"]), st.text(max_size=8), st.binary(max_size=40)),
    max_size=25,
)


_NAMESPACES = itertools.count()


@settings(max_examples=100, deadline=None)
@given(ops=_OPS)
def test_usage_equals_true_byte_total(
    shared_state: SqliteState, ops: list[tuple[str, str, bytes]]
) -> None:
    """Any set/delete sequence over unicode keys leaves usage at the stored bytes, and the
    quota refuses exactly the writes that would exceed it."""
    limit = 120
    skill = f"p{next(_NAMESPACES)}"  # hypothesis replays examples: each needs an empty one
    kv = shared_state.store(skill, total_limit=limit)
    model: dict[str, bytes] = {}
    for op, key, value in ops:
        if op == "delete":
            assert kv.delete(key) is (model.pop(key, None) is not None)
            continue
        used = sum(len(k.encode()) + len(v) for k, v in model.items())
        old = len(key.encode()) + len(model[key]) if key in model else 0
        if used - old + len(key.encode()) + len(value) > limit:
            with pytest.raises(QuotaExceeded):
                kv.set(key, value)
        else:
            kv.set(key, value)
            model[key] = value
        assert _usage(shared_state, skill) == sum(
            len(k.encode()) + len(v) for k, v in model.items()
        )
    assert _usage(shared_state, skill) == sum(len(k.encode()) + len(v) for k, v in model.items())


def test_drifted_usage_is_recounted_on_open(tmp_path: Path) -> None:
    """A database from before byte counting has its usage recounted once, when opened."""
    db = tmp_path / "old.sqlite3"
    s = SqliteState(db)
    s.store("a").set("ééé", b"xy")
    s.close()
    conn = sqlite3.connect(db)
    conn.execute("UPDATE usage SET bytes = 50 WHERE skill = 'a'")  # the old drift
    conn.execute("PRAGMA user_version = 0")
    conn.commit()
    conn.close()
    s = SqliteState(db)
    assert _usage(s, "a") == 6 + 2
    s.close()


def test_connection_is_wal_and_synchronous_full(state: SqliteState) -> None:
    """The store's connection runs in WAL mode with synchronous=FULL (fsync per commit)."""
    conn = state._conn()
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(st.text(min_size=1, max_size=20), st.binary(max_size=64), max_size=20),
    st.text(max_size=3),
)
def test_keys_match_model(
    tmp_path_factory: pytest.TempPathFactory, data: dict[str, bytes], prefix: str
) -> None:
    """Listing by any prefix agrees with a sorted-dict model."""
    s = SqliteState(tmp_path_factory.mktemp("kv") / "db")
    kv = s.store("p")
    for k, v in data.items():
        kv.set(k, v)
    expected = sorted(k for k in data if k.startswith(prefix))
    assert kv.keys(prefix, 1000) == sorted(expected, key=lambda k: k.encode())
    s.close()


_WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from support.env import SKILLS, cache_dir
    from skilld.package.build import build_component
    from skilld.registry import NullChannel
    from skilld.sandbox import CallContext, Sandbox
    from skilld.state import SqliteState
    from skilld.types import Limits

    state = SqliteState(Path(sys.argv[1]))
    store = state.store("hostile")
    real_set = store.set

    def acked_set(key, value):
        real_set(key, value)
        sys.stdout.write(key + "\\n")
        sys.stdout.flush()

    store.set = acked_set
    sandbox = Sandbox(cache_dir())
    comp = sandbox.load(build_component(SKILLS["hostile"], cache_dir=cache_dir()).read_bytes(),
                        name="hostile")
    sys.stdout.write("ready\\n")
    sys.stdout.flush()
    ctx = CallContext("hostile", Limits(timeout_ms=600_000), NullChannel(), kv=store)
    comp.call("write_keys", '{{"count": 1000000, "prefix": "' + sys.argv[2] + '"}}', ctx)
""")


@pytest.mark.slow
def test_acknowledged_writes_survive_sigkill(
    tmp_path: Path, component_path: Callable[[str], Path]
) -> None:
    """SIGKILL while a guest writes keys in a loop loses no acknowledged write (50 rounds)."""
    component_path("hostile")  # build once, outside the rounds
    db = tmp_path / "state.sqlite3"
    script = tmp_path / "writer.py"
    script.write_text(_WRITER.format(tests=str(Path(__file__).resolve().parent.parent)))
    rng = random.Random(7)
    acked: list[str] = []
    for round_no in range(50):
        proc = subprocess.Popen(
            [sys.executable, str(script), str(db), f"r{round_no:02d}-"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        for _ in range(rng.randint(1, 60)):
            line = proc.stdout.readline().strip()
            if not line:
                break
            acked.append(line)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    conn = sqlite3.connect(db)
    stored = {row[0] for row in conn.execute("SELECT key FROM kv WHERE skill = 'hostile'")}
    conn.close()
    missing = [k for k in acked if k not in stored]
    assert len(acked) >= 50
    assert missing == []
