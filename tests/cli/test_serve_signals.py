"""SIGTERM drains a real `skilld serve` process: over Streamable HTTP, SSE and stdio."""

from __future__ import annotations

import json
import os
import shlex
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.sse import sse_client
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from support.env import cache_dir
from support.mcp_fakes import text_of as _text
from support.serve_process import ServeProcess, serve_argv

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    """The SDK clients run on asyncio."""
    return "asyncio"


@pytest.fixture
def server(ops_bundle: Path, tmp_path: Path) -> Iterator[ServeProcess]:
    """A fresh server with a 20 s grace, killed if a test leaves it running."""
    proc = ServeProcess(ops_bundle, tmp_path, extra=["--shutdown-grace", "20"])
    try:
        yield proc
    finally:
        proc.stop()


@asynccontextmanager
async def session_over(
    transport: str, server: ServeProcess, elicit: Any
) -> AsyncIterator[ClientSession]:
    """An initialized SDK session to ``server`` over ``transport``."""
    if transport == "sse":
        streams = sse_client(server.base + "/sse")
    else:
        # terminate_on_close=False: the server is gone by the time the client closes.
        streams = streamable_http_client(server.url, terminate_on_close=False)
    async with (
        streams as (read, write),
        ClientSession(read, write, elicitation_callback=elicit) as session,
    ):
        await session.initialize()
        yield session


def held_elicitation() -> tuple[anyio.Event, anyio.Event, Any]:
    """(asked, answer, callback): an elicitation callback that sets ``asked`` and accepts
    once ``answer`` is set, holding the call in flight until then."""
    asked = anyio.Event()
    answer = anyio.Event()

    async def elicit(
        context: Any, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        asked.set()
        await answer.wait()
        return types.ElicitResult(action="accept", content={"username": "u", "email": "e@x"})

    return asked, answer, elicit



@pytest.mark.parametrize("transport", ["streamable-http", "sse"])
async def test_sigterm_answers_calls_in_flight_and_refuses_new_ones(
    server: ServeProcess, transport: str
) -> None:
    """SIGTERM with a call in flight: it is answered, a new call gets [unavailable], exit 0."""
    asked, answer, elicit = held_elicitation()

    results: list[types.CallToolResult] = []
    with anyio.fail_after(90):
        async with (
            session_over(transport, server, elicit) as session,
            anyio.create_task_group() as tg,
        ):
            # The client lists tools after a call (to check structured output): list them now.
            await session.list_tools()

            async def slow() -> None:
                results.append(
                    await session.call_tool("conformance/elicitation", {"message": "hold"})
                )

            tg.start_soon(slow)
            await asked.wait()
            os.kill(server.proc.pid, signal.SIGTERM)
            server.wait_for("draining")
            refused = await session.call_tool("echo/echo", {"text": "late"})
            assert refused.is_error
            assert _text(refused).startswith("[unavailable]")
            assert "shutting down" in _text(refused)
            # Well past the half second after which event streams used to be closed.
            with anyio.move_on_after(1.5):
                await anyio.sleep_forever()
            answer.set()
        assert await anyio.to_thread.run_sync(server.proc.wait, 30) == 0
    (finished,) = results
    assert not finished.is_error, _text(finished)
    assert "action=accept" in _text(finished)
    server.drain_log()
    stopped = [e for e in server.events() if e.get("event") == "stopped"]
    assert stopped and stopped[0]["drained"] is True
    # The audit sink was flushed and closed after both calls were recorded: the refused
    # one too, though its guest never ran.
    outcomes = {(r["skill"], r["method"]): r for r in server.audit() if r["event"] == "call"}
    assert outcomes[("conformance", "elicitation")]["outcome"] == "ok"
    assert outcomes[("echo", "echo")]["outcome"] == "draining"
    assert outcomes[("echo", "echo")]["refused"] is True


def _serving_pid(marker: str) -> int:
    """The pid of the ``skilld serve`` process whose command line holds ``marker``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in argv and marker.encode() in b" ".join(argv) and b"-c" not in argv:
            return int(entry.name)
    raise AssertionError(f"no skilld serve process for {marker}")


@pytest.mark.parametrize("second_signal", [False, True], ids=["drained", "second-signal"])
async def test_sigterm_drains_stdio(ops_bundle: Path, tmp_path: Path, second_signal: bool) -> None:
    """stdio: SIGTERM with a call in flight and the client still connected (stdin open).
    The call is answered, a new one gets [unavailable], the server stops at once after
    the drain without waiting for stdin, writes `stopped`, and exits 0. A second signal
    ends the drain at once: the held call is not waited for."""
    asked, answer, elicit = held_elicitation()

    audit, log, status = tmp_path / "audit.jsonl", tmp_path / "stderr.log", tmp_path / "exit"
    serve = serve_argv(ops_bundle, tmp_path, "stdio", "--shutdown-grace", "20")
    # A shell in between keeps the server's exit status for the test (the SDK reaps its
    # own child); the server itself gets the signal.
    params = StdioServerParameters(
        command="/bin/sh",
        args=["-c", f'{shlex.join(serve)}; echo $? > "{status}"'],
        env={**os.environ, "SKILLD_CACHE": str(cache_dir())},
    )
    results: list[types.CallToolResult] = []
    with anyio.fail_after(90), log.open("w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write, elicitation_callback=elicit) as session,
            anyio.create_task_group() as tg,
        ):
            await session.initialize()
            await session.list_tools()

            async def slow() -> None:
                try:
                    results.append(
                        await session.call_tool("conformance/elicitation", {"message": "hold"})
                    )
                except MCPError:
                    assert second_signal  # cut by the second signal, never answered

            tg.start_soon(slow)
            await asked.wait()
            pid = _serving_pid(str(tmp_path))
            os.kill(pid, signal.SIGTERM)
            while '"draining"' not in log.read_text():
                await anyio.sleep(0.05)
            refused = await session.call_tool("echo/echo", {"text": "late"})
            assert refused.is_error
            assert _text(refused).startswith("[unavailable]")
            if second_signal:
                os.kill(pid, signal.SIGTERM)
            else:
                answer.set()
            # The client keeps stdin open: the server must stop on its own.
            with anyio.fail_after(10):
                while not status.exists() or not status.read_text().strip():
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
    assert status.read_text().strip() == "0", log.read_text()[-3000:]
    events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    stopped = [e for e in events if e.get("event") == "stopped"]
    assert stopped and stopped[0]["transport"] == "stdio"
    assert stopped[0]["drained"] is not second_signal
    if second_signal:
        return
    (finished,) = results
    assert not finished.is_error, _text(finished)
    assert "action=accept" in _text(finished)
    outcomes = {
        (r["skill"], r["method"]): r
        for r in map(json.loads, audit.read_text().splitlines())
        if r["event"] == "call"
    }
    assert outcomes[("conformance", "elicitation")]["outcome"] == "ok"
    assert outcomes[("echo", "echo")]["outcome"] == "draining"
