"""The SQLite backend of key-value state."""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from skilld import paths
from skilld.errors import QuotaExceeded, StateError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (
    skill TEXT NOT NULL,
    key   TEXT NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (skill, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS usage (
    skill TEXT PRIMARY KEY,
    bytes INTEGER NOT NULL
) WITHOUT ROWID;
"""

# An entry uses the UTF-8 bytes of its key plus its value's bytes. Writes measure
# the key in Python (the stored key is the same string); where SQL must measure it,
# the key is cast to BLOB, since ``length()`` of TEXT counts characters.
#
# Databases before version 1 counted stored keys in characters, so their usage
# drifted upward with non-ASCII keys; it is recounted from the rows once.
_SCHEMA_VERSION = 1
# How long an operation waits for another connection's write lock (SQLite's busy wait),
# unless the call it serves has less time left (``SkillStore.within``).
_BUSY_S = 30.0
_RECOUNT = """
DELETE FROM usage;
INSERT INTO usage (skill, bytes)
    SELECT skill, sum(length(CAST(key AS BLOB)) + length(value)) FROM kv GROUP BY skill;
"""


class SqliteState:
    """One SQLite database holding every skill's namespace.

    Connections are per thread (SQLite objects must stay on their thread);
    writes are serialised by SQLite's own lock.

    Raises:
        StateError: the database cannot be opened (names the file).
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[sqlite3.Connection] = []
        self._closed = False
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._make_private()
        conn = self._conn()
        try:
            conn.executescript(_SCHEMA)
            if conn.execute("PRAGMA user_version").fetchone()[0] < _SCHEMA_VERSION:
                conn.executescript(
                    f"BEGIN IMMEDIATE; {_RECOUNT} PRAGMA user_version = {_SCHEMA_VERSION}; COMMIT;"
                )
        except sqlite3.Error as exc:
            self.close()  # also ends a half-done recount: nothing of it was committed
            raise StateError(
                f"cannot prepare state database: {exc}", location=str(self.path)
            ) from exc

    def _make_private(self) -> None:
        """Create the database file 0600 before SQLite opens it (SQLite gives its WAL
        and shared-memory files the database's mode), and narrow a wider mode found on
        it or on them (said in the log).

        Raises:
            StateError: the file cannot be created.
        """
        for suffix in ("", "-wal", "-shm"):
            target = Path(f"{self.path}{suffix}")
            flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_CREAT if not suffix else 0)
            try:
                fd = os.open(target, flags, 0o600)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise StateError(
                    f"cannot create the state database: {exc.strerror}", location=str(target)
                ) from exc
            try:
                paths.private_file(fd, target, "state database")
            finally:
                os.close(fd)

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            if self._closed:
                # Never reopened behind the owner's back: a write after close would
                # land in a database nobody flushes or closes again.
                raise StateError("the state database is closed", location=str(self.path))
            try:
                conn = sqlite3.connect(
                    self.path, timeout=_BUSY_S, isolation_level=None, check_same_thread=False
                )
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=FULL")
            except sqlite3.Error as exc:
                raise StateError(
                    f"cannot open state database: {exc}", location=str(self.path)
                ) from exc
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def store(
        self, skill_id: str, *, value_limit: int = 1 << 20, total_limit: int = 64 << 20
    ) -> SkillStore:
        """The namespace of one skill, with its size limits."""
        return SkillStore(self, skill_id, value_limit, total_limit)

    def close(self) -> None:
        """Close every connection; later use raises :class:`StateError` (a second close: no-op)."""
        with self._lock:
            self._closed = True
            for conn in self._all:
                conn.close()
            self._all.clear()
        self._local = threading.local()


class SkillStore:
    """One skill's keys; implements :class:`skilld.types.KeyValueStore`."""

    @contextmanager
    def within(self, seconds: float) -> Iterator[None]:
        """Wait at most ``seconds`` for another writer's lock in the operations inside.

        SQLite waits up to 30 s for a lock held by another connection; a call with less
        time left waits only that long, and the operation fails (``StateError``).
        """
        if seconds >= _BUSY_S:
            yield
            return
        conn = self._state._conn()
        conn.execute(f"PRAGMA busy_timeout = {max(1, int(seconds * 1000))}")
        try:
            yield
        finally:
            conn.execute(f"PRAGMA busy_timeout = {int(_BUSY_S * 1000)}")

    def __init__(self, state: SqliteState, skill_id: str, value_limit: int, total_limit: int):
        self._state = state
        self.skill_id = skill_id
        self.value_limit = value_limit
        self.total_limit = total_limit

    def get(self, key: str) -> bytes | None:
        """The value under ``key`` or None.

        Raises:
            StateError: the database failed.
        """
        try:
            row = (
                self._state._conn()
                .execute("SELECT value FROM kv WHERE skill = ? AND key = ?", (self.skill_id, key))
                .fetchone()
            )
        except sqlite3.Error as exc:
            raise StateError(f"reading {key!r} failed: {exc}", location=self.skill_id) from exc
        return None if row is None else bytes(row[0])

    def set(self, key: str, value: bytes) -> None:
        """Store ``value``; committed to disk (fsync) before returning.

        Raises:
            QuotaExceeded: the value, or the skill's total, is over its limit.
            StateError: the database failed.
        """
        key_bytes = len(key.encode())
        size = key_bytes + len(value)
        if len(value) > self.value_limit:
            raise QuotaExceeded(
                f"value of {len(value)} bytes exceeds the {self.value_limit}-byte limit per value",
                location=self.skill_id,
            )
        with self._writing(f"writing {key!r}") as conn:
            old = conn.execute(
                "SELECT length(value) FROM kv WHERE skill = ? AND key = ?",
                (self.skill_id, key),
            ).fetchone()
            used = conn.execute(
                "SELECT bytes FROM usage WHERE skill = ?", (self.skill_id,)
            ).fetchone()
            freed = key_bytes + old[0] if old else 0
            total = (used[0] if used else 0) - freed + size
            if total > self.total_limit:
                raise QuotaExceeded(  # rolled back by _writing
                    f"storing {key!r} would use {total} bytes, over the "
                    f"{self.total_limit}-byte quota",
                    location=self.skill_id,
                )
            conn.execute(
                "INSERT INTO kv (skill, key, value) VALUES (?, ?, ?) "
                "ON CONFLICT (skill, key) DO UPDATE SET value = excluded.value",
                (self.skill_id, key, value),
            )
            conn.execute(
                "INSERT INTO usage (skill, bytes) VALUES (?, ?) "
                "ON CONFLICT (skill) DO UPDATE SET bytes = excluded.bytes",
                (self.skill_id, total),
            )

    @contextmanager
    def _writing(self, what: str) -> Iterator[sqlite3.Connection]:
        """One write transaction of this skill's rows: ``BEGIN IMMEDIATE`` (the usage row
        is read and updated under the write lock), committed when the block ends, rolled
        back when it raises.

        Raises:
            StateError: the database failed (the message says ``what`` failed).
        """
        conn = self._state._conn()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StateError(f"{what} failed: {exc}", location=self.skill_id) from exc

    def delete(self, key: str) -> bool:
        """Remove ``key``; True when it existed.

        Raises:
            StateError: the database failed.
        """
        with self._writing(f"deleting {key!r}") as conn:
            old = conn.execute(
                "SELECT length(value) FROM kv WHERE skill = ? AND key = ?",
                (self.skill_id, key),
            ).fetchone()
            if old is not None:
                conn.execute("DELETE FROM kv WHERE skill = ? AND key = ?", (self.skill_id, key))
                conn.execute(
                    "UPDATE usage SET bytes = bytes - ? WHERE skill = ?",
                    (len(key.encode()) + old[0], self.skill_id),
                )
        return old is not None

    def keys(self, prefix: str, limit: int) -> list[str]:
        """Keys starting with ``prefix``, in order, at most ``limit``.

        Raises:
            StateError: the database failed.
        """
        # A range scan, not LIKE: '%' and '_' in a prefix are data, not patterns.
        try:
            if prefix:
                rows = (
                    self._state._conn()
                    .execute(
                        "SELECT key FROM kv WHERE skill = ? AND key >= ? "
                        "AND substr(key, 1, length(?)) = ? ORDER BY key LIMIT ?",
                        (self.skill_id, prefix, prefix, prefix, max(0, limit)),
                    )
                    .fetchall()
                )
            else:
                rows = (
                    self._state._conn()
                    .execute(
                        "SELECT key FROM kv WHERE skill = ? ORDER BY key LIMIT ?",
                        (self.skill_id, max(0, limit)),
                    )
                    .fetchall()
                )
        except sqlite3.Error as exc:
            raise StateError(f"listing keys failed: {exc}", location=self.skill_id) from exc
        return [r[0] for r in rows]
