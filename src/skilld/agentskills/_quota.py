"""Size caps for one script run: its workspace, and what it writes into its ``rw`` grants.

A per-call workspace is a directory in the node's work directory (``skilld.paths``).
Where skilld may mount (root with ``CAP_SYS_ADMIN``: a bare host), a tmpfs of exactly
the cap (bytes and inodes) is mounted on it, a hard wall: the script gets ``ENOSPC``.
Elsewhere (a container has no ``CAP_SYS_ADMIN``) the cap is *accounted*: while the
script runs, a thread walks the workspace (allocated blocks and the number of entries).
Either way each ``rw`` grant is accounted (growth over what it held when the call
started). Past a cap the watch trips the call's channel; the executor ends the call as
it would on a cancel (the whole process tree is killed, a wasm guest is stopped at its
next epoch check), and the backend answers ``limit-exceeded`` naming the cap.

What accounting cannot do: it samples (every ``POLL_S``, slower when a tree is large),
so a script can overshoot by what it writes between two looks (``RLIMIT_FSIZE`` bounds
any one file of a native script); and a grant's budget counts *net* growth, so a file
rewritten in place costs nothing. It bounds what a call can leave behind, not the I/O
it does.
"""

from __future__ import annotations

import ctypes
import os
import stat
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# How often a running script's workspace and grants are looked at.
POLL_S = 0.05
# A walk that took this share of the interval or more slows the polling down, so that
# accounting a large grant never costs more than about a fifth of a core.
_WALK_SHARE = 0.2
# At most this many files and directories in one workspace (a tree of empty files fills
# no blocks but exhausts inodes and makes every walk slower).
MAX_ENTRIES = 10_000
# A grant holding more than this many entries is accounted up to them only.
_MAX_GRANT_ENTRIES = 200_000
_MS_NOSUID, _MS_NODEV = 2, 4


class _Mounts:
    """Whether this process may mount a tmpfs; asked once (a refusal does not change)."""

    refused = False


def mount_tmpfs(path: Path, size: int) -> bool:
    """Mount a tmpfs of ``size`` bytes and ``MAX_ENTRIES`` inodes on ``path`` (mode 0700);
    False where mounting is not allowed (then the cap is accounted). The caller removes
    it with :func:`skilld.paths.remove_tree`, which detaches it."""
    if _Mounts.refused or os.geteuid() != 0:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    options = f"size={size},nr_inodes={MAX_ENTRIES + 1},mode=0700".encode()
    flags = _MS_NOSUID | _MS_NODEV
    if libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", flags, options) != 0:
        _Mounts.refused = True
        return False
    return True


@dataclass(frozen=True, slots=True)
class Usage:
    """What a tree holds: allocated bytes and entries (``capped``: the walk stopped early)."""

    bytes: int
    entries: int
    capped: bool = False


def usage(root: Path, max_entries: int) -> Usage:
    """Allocated bytes (``st_blocks``) and entries under ``root``, links not followed.

    A file that disappears during the walk is skipped (the script may be deleting).
    """
    total = entries = 0
    stack = [str(root)]
    while stack:
        try:
            it = os.scandir(stack.pop())
        except OSError:
            continue
        with it:
            for entry in it:
                entries += 1
                if entries > max_entries:
                    return Usage(total, entries, capped=True)
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += info.st_blocks * 512
                if stat.S_ISDIR(info.st_mode):
                    stack.append(entry.path)
    return Usage(total, entries)


class Quota:
    """Watches one script run; a context manager around the executor's ``run``.

    Args:
        workspace: the call's workspace.
        grants: the ``rw`` grant directories the script may write.
        workspace_bytes: the workspace's cap.
        write_bytes: how much the ``rw`` grants may grow, together, in this call.
        channel: the call's client channel; the watch hands out a wrapper of it
            (:attr:`channel`) that also says cancelled once a cap is passed.
        tmpfs: the workspace is a tmpfs of the cap (:func:`mount_tmpfs`): full is the cap.
    """

    def __init__(
        self,
        workspace: Path,
        grants: Sequence[str],
        *,
        workspace_bytes: int,
        write_bytes: int,
        channel: Any,
        tmpfs: bool = False,
    ):
        self.workspace = workspace
        self.grants = tuple(grants)
        self.workspace_bytes = workspace_bytes
        self.write_bytes = write_bytes
        self.tmpfs = tmpfs
        self.exceeded: str | None = None
        self.channel = _TrippedChannel(channel, self)
        self._baseline = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Quota:
        self._baseline = self._grants_usage()
        self._thread = threading.Thread(target=self._watch, name="skilld-quota", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.exceeded is None:
            self.check()  # what the script wrote since the last look

    def check(self) -> str | None:
        """Look once; the exceeded cap's message (also kept in :attr:`exceeded`), or None."""
        ws = self._tmpfs_usage() if self.tmpfs else usage(self.workspace, MAX_ENTRIES)
        if ws.capped:
            self.exceeded = (
                f"the script's workspace holds more than {MAX_ENTRIES} files and directories "
                "(the cap)"
            )
        elif ws.bytes > self.workspace_bytes:
            kind = ", a tmpfs" if self.tmpfs else ""
            self.exceeded = (
                f"the script's workspace grew past its cap of {_mib(self.workspace_bytes)} "
                f"(limits.workspace{kind})"
            )
        elif self.grants and self._grants_usage() - self._baseline > self.write_bytes:
            self.exceeded = (
                f"the script wrote more than its per-call write budget of "
                f"{_mib(self.write_bytes)} into its rw grants (limits.writes)"
            )
        return self.exceeded

    def _tmpfs_usage(self) -> Usage:
        """A full tmpfs (no block or no inode left) reads as past its cap."""
        try:
            st = os.statvfs(self.workspace)
        except OSError:
            return Usage(0, 0)
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        if st.f_ffree == 0:
            return Usage(used, MAX_ENTRIES + 1, capped=True)
        return Usage(self.workspace_bytes + 1 if st.f_bavail == 0 else used, 0)

    def _grants_usage(self) -> int:
        return sum(usage(Path(g), _MAX_GRANT_ENTRIES).bytes for g in self.grants)

    def _watch(self) -> None:
        wait = POLL_S
        while not self._stop.wait(wait):
            started = time.monotonic()
            if self.check() is not None:
                return
            wait = max(POLL_S, (time.monotonic() - started) / _WALK_SHARE)


class _TrippedChannel:
    """A client channel that also reports cancelled once its quota is exceeded."""

    def __init__(self, inner: Any, quota: Quota):
        self._inner = inner
        self._quota = quota

    def cancelled(self) -> bool:
        return self._quota.exceeded is not None or bool(self._inner.cancelled())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB"
