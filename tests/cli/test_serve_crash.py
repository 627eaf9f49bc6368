"""kill -9 in the middle of state writes: every write on disk names its call in the audit log."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from support.serve_process import ServeProcess

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    """The SDK client runs on asyncio."""
    return "asyncio"


@pytest.fixture
def server(ops_bundle: Path, tmp_path: Path) -> Iterator[ServeProcess]:
    """A fresh server, killed if a test leaves it running."""
    proc = ServeProcess(ops_bundle, tmp_path)
    try:
        yield proc
    finally:
        proc.stop()


def _keys(db: Path, prefix: str) -> list[str]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT key FROM kv WHERE skill = 'hostile' AND key LIKE ?", (prefix + "%",)
        )
        return [row[0] for row in rows]
    except sqlite3.OperationalError:  # the table is created with the first write
        return []
    finally:
        conn.close()


def _sha(args: dict[str, Any]) -> str:
    return hashlib.sha256(
        json.dumps(args, separators=(",", ":"), sort_keys=True).encode()
    ).hexdigest()


async def test_writes_before_a_sigkill_are_traceable_to_a_started_record(
    server: ServeProcess, tmp_path: Path
) -> None:
    """SIGKILL mid-write: the keys on disk lead to a started record whose call never finished."""
    db = tmp_path / "state.sqlite3"
    done = {"count": 3, "prefix": "a"}
    cut = {"count": 10_000_000, "prefix": "b"}
    with anyio.fail_after(60):
        async with (
            streamable_http_client(server.url) as (read, write),
            ClientSession(read, write) as session,
            anyio.create_task_group() as tg,
        ):
            await session.initialize()
            await session.list_tools()
            finished = await session.call_tool("hostile/write_keys", done)
            assert not finished.is_error

            async def writer() -> None:
                # The server dies before it can answer.
                with pytest.raises(MCPError):
                    await session.call_tool("hostile/write_keys", cut)

            tg.start_soon(writer)
            # Another process's progress: nothing to wait on but the file itself.
            while not _keys(db, "b"):
                await anyio.sleep(0.005)
            os.kill(server.proc.pid, signal.SIGKILL)
            assert await anyio.to_thread.run_sync(server.proc.wait, 30) == -signal.SIGKILL
            tg.cancel_scope.cancel()
    records = server.audit()
    started = {r["call_id"]: r for r in records if r["event"] == "started"}
    ended = {r["call_id"]: r for r in records if r["event"] == "call"}
    # The finished call: its started and call records share a call id.
    (done_id,) = [i for i, r in started.items() if r["input_sha256"] == _sha(done)]
    assert ended[done_id]["outcome"] == "ok"
    assert sorted(_keys(db, "a")) == ["a000000", "a000001", "a000002"]
    # The cut call: its writes are on disk, its started record too, its call record never came.
    assert _keys(db, "b")
    (cut_id,) = [i for i, r in started.items() if r["input_sha256"] == _sha(cut)]
    assert started[cut_id]["skill"] == "hostile" and started[cut_id]["method"] == "write_keys"
    assert cut_id not in ended
