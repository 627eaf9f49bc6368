"""The stdio transport's stdin reader: any bytes in any chunks give the SDK's lines, and
closing it ends a read that waits."""

from __future__ import annotations

import io
import os
import time

import anyio
from hypothesis import given, settings
from hypothesis import strategies as st

from skilld.mcp._stdin import FdLines


async def _collect(chunks: list[bytes]) -> list[str]:
    read, write = os.pipe()
    os.set_blocking(read, False)
    lines = FdLines(read)
    out: list[str] = []

    async def feed() -> None:
        for chunk in chunks:
            os.write(write, chunk)
            await anyio.sleep(0)
        os.close(write)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(feed)
            out.extend([line async for line in lines])
    finally:
        os.close(read)
    return out


@settings(max_examples=300, deadline=None)
@given(
    chunks=st.lists(
        st.binary(max_size=64) | st.sampled_from([b"\n", b"\r", b"\r\n", b"\xe2\x82", b"\xac"]),
        max_size=20,
    )
)
def test_lines_are_what_the_sdks_reader_gives(chunks: list[bytes]) -> None:
    """Whatever the bytes and however they are split (bad UTF-8, a character or a CRLF cut
    in two, no final newline), the lines are those of the SDK's TextIOWrapper reader."""
    data = b"".join(chunks)
    expected = list(io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="replace"))
    assert anyio.run(_collect, chunks) == expected


def test_close_ends_a_waiting_read() -> None:
    """A read waiting on a silent pipe ends when the reader is closed (a signal's drain)."""
    read, write = os.pipe()
    os.set_blocking(read, False)
    lines = FdLines(read)

    async def main() -> list[str]:
        got: list[str] = []
        # A close that did not end the wait would hang the task group: fail instead.
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:

                async def consume() -> None:
                    got.extend([line async for line in lines])

                tg.start_soon(consume)
                await anyio.sleep(0.2)
                lines.close()
        return got

    started = time.monotonic()
    try:
        assert anyio.run(main) == []
    finally:
        os.close(read)
        os.close(write)
    assert time.monotonic() - started < 5
