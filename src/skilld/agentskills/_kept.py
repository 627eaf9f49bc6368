"""Outputs kept for their callers: ``skill://NAME/runs/RUN/FILE``, on disk, each the caller's.

A script's output too large to embed in its answer is kept for :data:`KEPT_SECONDS` as
a resource of the run, for the client to read or hand to its next run. What is kept is
its caller's (``Caller.key``, the principal, never a header's text): for another caller
a kept URI answers exactly what a URI that was never kept answers (:meth:`open` gives
``None`` for both), so nothing tells mallory that alice's run exists.

Kept bytes are files in a private directory of the node's work directory (mode 0700,
removed at exit, swept by the next start if the process died), never the server's
memory: collecting a run's outputs copies them there by descriptor (holes stay holes)
and a read loads one file. They are counted by size under two caps: each caller's
(:attr:`caller_bytes`; past it a caller's own oldest outputs go first) and the node's
(:attr:`total_bytes`). A caller's runs never evict another caller's kept output before
its time: when the node is full, the new output is not kept (the answer counts it in
``files_omitted``) and what others keep stays. A run reserves its room before it copies
anything (:meth:`reserve`), so concurrent runs never overshoot the caps together.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from skilld.paths import remove_tree, scratch_prefix
from skilld.types import Caller

# Kept outputs live this long: a client reads them soon after the call, or not at all.
KEPT_SECONDS = 900.0
# What one caller, and the whole node, may keep at once (by size).
CALLER_KEPT_BYTES = 256 << 20
TOTAL_KEPT_BYTES = 1 << 30


class TooLarge(Exception):
    """A kept output is larger than its reader has room for (:meth:`KeptOutputs.open`)."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


@dataclass(frozen=True, slots=True)
class _Entry:
    owner: str
    until: float
    mime: str
    file: str
    size: int


@dataclass(slots=True)
class Reservation:
    """Room one run may fill with kept outputs (bytes), held from :meth:`KeptOutputs.reserve`
    until :meth:`KeptOutputs.commit` or :meth:`KeptOutputs.release`."""

    owner: str
    room: int
    open: bool = True


@dataclass(frozen=True, slots=True)
class Spooled:
    """One output copied into the store, not yet kept: its path in the run, its MIME type,
    its file in the store and its size."""

    rel: str
    mime: str
    file: str
    size: int


class KeptOutputs:
    """The kept outputs of one node's Agent Skills (one store for all of them).

    Args:
        work: the node's work directory (``skilld.paths.make_work_dir``); the store is a
            private directory inside it.
        caller_bytes: what one caller may keep at once.
        total_bytes: what the node keeps at once.
        seconds: how long an output is kept.
    """

    def __init__(
        self,
        work: Path,
        *,
        caller_bytes: int = CALLER_KEPT_BYTES,
        total_bytes: int = TOTAL_KEPT_BYTES,
        seconds: float = KEPT_SECONDS,
    ):
        self.caller_bytes = caller_bytes
        self.total_bytes = total_bytes
        self.seconds = seconds
        self.directory = Path(work) / (scratch_prefix("kept", "node") + secrets.token_hex(4))
        self.directory.mkdir(mode=0o700)
        atexit.register(remove_tree, self.directory)
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._used: dict[str, int] = {}
        self._reserved: dict[str, int] = {}
        self._lock = threading.Lock()

    # -- a run's outputs in ----------------------------------------------------

    def reserve(self, caller: Caller) -> Reservation:
        """The room ``caller``'s run may fill: its own cap less what its other runs hold
        reserved, and what the node has left once every other caller's outputs and
        reservations are counted (its own older outputs make room by going first)."""
        owner = caller.key
        with self._lock:
            self._expire(time.monotonic())
            others = sum(v for k, v in self._used.items() if k != owner)
            reserved = sum(self._reserved.values())
            room = max(
                0,
                min(
                    self.caller_bytes - self._reserved.get(owner, 0),
                    self.total_bytes - others - reserved,
                ),
            )
            self._reserved[owner] = self._reserved.get(owner, 0) + room
        return Reservation(owner, room)

    def spool_path(self) -> Path:
        """A fresh file name in the store for one output being copied (the copier makes
        it, mode 0600)."""
        return self.directory / secrets.token_hex(12)

    def commit(
        self, reservation: Reservation, skill_id: str, files: list[Spooled]
    ) -> list[dict[str, object]]:
        """Keep ``files`` (copied into the store within the reservation's room) as
        resources of one new run of ``skill_id``, owned by the reservation's caller; the
        answer's entries for them. The caller's own oldest outputs go first when its cap
        or the node's would be passed; another caller's never do.
        """
        from skilld.agentskills._build import resource_uri

        run = secrets.token_hex(8)
        now = time.monotonic()
        owner = reservation.owner
        out: list[dict[str, object]] = []
        with self._lock:
            self._release(reservation)
            self._expire(now)
            for spooled in files:
                uri = resource_uri(skill_id, f"runs/{run}/{_quote(spooled.rel)}")
                self._entries[uri] = _Entry(
                    owner, now + self.seconds, spooled.mime, spooled.file, spooled.size
                )
                self._used[owner] = self._used.get(owner, 0) + spooled.size
                out.append(
                    {
                        "uri": uri,
                        "path": spooled.rel,
                        "size": spooled.size,
                        "mime_type": spooled.mime,
                        "kept_seconds": int(self.seconds),
                    }
                )
            reserved_others = sum(self._reserved.values())
            for uri in [u for u, e in self._entries.items() if e.owner == owner]:
                total = sum(self._used.values())
                if (
                    self._used.get(owner, 0) <= self.caller_bytes
                    and total + reserved_others <= self.total_bytes
                ):
                    break
                self._drop(uri)
            # An output evicted by the run that made it is not listed as kept.
            return [e for e in out if e["uri"] in self._entries]

    def release(self, reservation: Reservation) -> None:
        """Give back a reservation nothing was committed with (a failed run)."""
        with self._lock:
            self._release(reservation)

    # -- reading ---------------------------------------------------------------------

    def open(
        self, caller: Caller, uri: str, max_bytes: int | None = None
    ) -> tuple[str, bytes] | None:
        """A kept output's MIME type and bytes, for the caller that made it; ``None`` for
        any other caller and for a URI never kept or expired (the same answer).

        Raises:
            TooLarge: the output is larger than ``max_bytes`` (nothing was read).
        """
        with self._lock:
            self._expire(time.monotonic())
            entry = self._entries.get(uri)
            if entry is None or entry.owner != caller.key:
                return None
        if max_bytes is not None and entry.size > max_bytes:
            raise TooLarge(entry.size)
        try:
            fd = os.open(self.directory / entry.file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None  # evicted since
        with os.fdopen(fd, "rb") as fh:
            return entry.mime, fh.read(entry.size)

    def used(self, caller: Caller) -> int:
        """The bytes ``caller`` keeps now."""
        with self._lock:
            self._expire(time.monotonic())
            return self._used.get(caller.key, 0)

    # -- inside the lock ---------------------------------------------------------------

    def _release(self, reservation: Reservation) -> None:
        if not reservation.open:
            return
        reservation.open = False
        left = self._reserved.get(reservation.owner, 0) - reservation.room
        if left > 0:
            self._reserved[reservation.owner] = left
        else:
            self._reserved.pop(reservation.owner, None)

    def _drop(self, uri: str) -> None:
        entry = self._entries.pop(uri)
        self._used[entry.owner] -= entry.size
        if not self._used[entry.owner]:
            del self._used[entry.owner]
        with contextlib.suppress(OSError):
            (self.directory / entry.file).unlink()

    def _expire(self, now: float) -> None:
        for uri in [u for u, e in self._entries.items() if e.until <= now]:
            self._drop(uri)


def _quote(rel: str) -> str:
    from urllib.parse import quote

    return quote(rel, safe="")


def digest_uri(uri: str) -> str:
    """What the audit log writes for a kept output's URI: a digest, never the URI (which
    is all it takes to read the output)."""
    return "sha256:" + hashlib.sha256(uri.encode("utf-8")).hexdigest()[:32]


__all__ = [
    "CALLER_KEPT_BYTES",
    "KEPT_SECONDS",
    "TOTAL_KEPT_BYTES",
    "KeptOutputs",
    "Reservation",
    "Spooled",
    "digest_uri",
]
