"""sha256 of files through the descriptor that later reads them, and hashing ahead of time.

Imports nothing of skilld's and nothing heavy, so that ``skilld serve`` can start hashing a
bundle's files on another core before it imports wasmtime and the MCP SDK. hashlib
releases the GIL while it hashes a large buffer, so the imports and the hashing overlap.

Hashing ahead of time checks nothing by itself: it opens each file once, keeps the
descriptor and remembers the sha256 of what that descriptor reads. The loader later
compares that digest with the verified lock and loads through the same descriptor, so
the bytes that were hashed are the bytes that load.
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import stat
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path


def sha256_fd(fd: int) -> str:
    """sha256 of everything readable from ``fd`` (from its start).

    The file is mapped and hashed in one call: hashlib then releases the GIL for the
    whole file, where chunked reads would take it back for every chunk and stall
    behind whatever else the process is doing (at start-up: importing the MCP SDK).
    """
    size = os.fstat(fd).st_size
    if size == 0:
        return hashlib.sha256(b"").hexdigest()
    with mmap.mmap(fd, size, prot=mmap.PROT_READ) as mapped:
        return hashlib.sha256(mapped).hexdigest()


def open_regular(path: Path) -> int:
    """A read-only descriptor for the regular file ``path`` itself.

    Never through a final symlink, and never blocking: a FIFO or device planted where a
    file was expected is refused instead of hanging the reader.

    Raises:
        OSError: the file cannot be opened, is a symlink, or is not a regular file.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return fd


class Prehash:
    """Files of one directory opened and hashed in the background, by relative path.

    Use as a context manager: leaving it closes every descriptor it still holds.
    """

    def __init__(self, root: Path, rels: list[str], workers: int = 2):
        self.root = Path(root)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="skilld-hash")
        # The largest files first: they decide when hashing ends.
        order = sorted(rels, key=self._size, reverse=True)
        self._jobs: dict[str, Future[tuple[int, str]]] = {
            rel: self._pool.submit(self._hash, rel) for rel in order
        }

    def _size(self, rel: str) -> int:
        try:
            return (self.root / rel).lstat().st_size
        except OSError:
            return 0

    def _hash(self, rel: str) -> tuple[int, str]:
        fd = open_regular(self.root / rel)
        try:
            return fd, sha256_fd(fd)
        except BaseException:
            os.close(fd)
            raise

    def take(self, rel: str) -> tuple[int, str] | None:
        """The open descriptor of ``rel`` and the sha256 it read; ``None`` when not hashed.

        The caller owns the descriptor from then on. A file that could not be opened or
        read answers ``None``: the caller opens it itself and reports the error.
        """
        job = self._jobs.pop(rel, None)
        if job is None:
            return None
        try:
            return job.result()
        except OSError:
            return None

    def close(self) -> None:
        """Stop hashing and close every descriptor nobody took."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        for job in self._jobs.values():
            if job.done() and not job.cancelled() and job.exception() is None:
                os.close(job.result()[0])
        self._jobs.clear()

    def __enter__(self) -> Prehash:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
