"""stdin for the stdio transport, read so that a signal can end the wait for it.

The SDK's stdio transport reads stdin on a worker thread, and a thread blocked in
``read`` cannot be cancelled: on SIGTERM the server could drain its calls but then
not stop until the client wrote another line or closed the pipe. Here a pipe, a
socket or a terminal on fd 0 is read on the event loop instead (``wait_readable``,
then a non-blocking read), and the transport is handed the lines.

As the SDK does for its own reader, fd 0 itself is pointed at ``/dev/null`` while
serving (so a handler or a child process can never read protocol bytes), the
client's stream is read through a private duplicate, and fd 0 is put back after.
A regular file on fd 0 never blocks a read: the SDK's reader is left to it.
"""

from __future__ import annotations

import codecs
import contextlib
import fcntl
import io
import os
import stat
from collections.abc import AsyncIterator, Iterator

import anyio

_CHUNK = 64 * 1024


class FdLines:
    """The lines of a non-blocking descriptor, as the SDK's own reader gives them (UTF-8,
    bad bytes replaced, ``\\r\\n`` and ``\\r`` read as ``\\n``).

    :meth:`close` ends them as the end of the stream would, also while a read waits.
    """

    def __init__(self, fd: int):
        self._fd = fd
        # As the SDK's TextIOWrapper reads: UTF-8 with replacement, universal newlines.
        self._decoder = io.IncrementalNewlineDecoder(
            codecs.getincrementaldecoder("utf-8")(errors="replace"), translate=True
        )
        self._closed = False
        self._waiting: anyio.CancelScope | None = None

    def close(self) -> None:
        """End the lines here (the server stops reading; the descriptor stays open)."""
        self._closed = True
        if self._waiting is not None:
            self._waiting.cancel()

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _read(self) -> bytes | None:
        """The next bytes; ``b""`` at the end or once closed; None when there were none."""
        with anyio.CancelScope() as self._waiting:
            if not self._closed:
                await anyio.wait_readable(self._fd)
        self._waiting = None
        if self._closed:
            return b""
        try:
            return os.read(self._fd, _CHUNK)
        except BlockingIOError:
            return None

    async def _lines(self) -> AsyncIterator[str]:
        pending = ""
        while True:
            data = await self._read()
            if data is None:
                continue
            pending += self._decoder.decode(data, final=not data)
            *lines, pending = pending.split("\n")
            for line in lines:
                yield line + "\n"
            if not data:
                if pending:
                    yield pending
                return


@contextlib.contextmanager
def claimed_stdin() -> Iterator[FdLines | None]:
    """fd 0's stream as :class:`FdLines` while fd 0 reads ``/dev/null``; None when fd 0
    is not a pipe, a socket or a terminal (the SDK reads it then)."""
    try:
        mode = os.fstat(0).st_mode
    except OSError:
        yield None
        return
    # A character device other than a terminal (/dev/null) cannot be polled.
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(0)):
        yield None
        return
    private = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.dup2(null, 0)
    finally:
        os.close(null)
    os.set_blocking(private, False)
    try:
        yield FdLines(private)
    finally:
        with contextlib.suppress(OSError):
            os.set_blocking(private, True)
            os.dup2(private, 0)
        os.close(private)
