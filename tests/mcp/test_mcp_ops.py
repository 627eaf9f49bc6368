"""Operations: probes, Prometheus metrics, per-skill concurrency and draining shutdown."""

from __future__ import annotations

import anyio
import anyio.to_thread
import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp_fakes import Gate, connect, fake_dispatcher, running_http, text_of

from skilld.mcp import ServeConfig
from skilld.mcp._metrics import Metrics

pytestmark = pytest.mark.anyio


async def test_probes_follow_the_dispatcher() -> None:
    """/healthz is 200 while serving; /readyz is 200 only once the dispatcher is ready."""
    dispatcher = fake_dispatcher()
    dispatcher.is_ready = False
    with anyio.fail_after(30):
        async with running_http(dispatcher) as server, httpx2.AsyncClient(timeout=10) as http:
            base = f"http://127.0.0.1:{server.port}"
            assert (await http.get(f"{base}/healthz")).status_code == 200
            loading = await http.get(f"{base}/readyz")
            assert (loading.status_code, loading.json()) == (503, {"status": "loading"})
            dispatcher.is_ready = True
            assert (await http.get(f"{base}/readyz")).status_code == 200


async def test_metrics_count_calls_errors_denials_and_latency() -> None:
    """/metrics reports calls by outcome, errors and denials per skill, and a latency histogram."""
    with anyio.fail_after(30):
        async with running_http(fake_dispatcher()) as server:
            async with (
                streamable_http_client(server.url) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                await session.call_tool("notes/echo", {"text": "a"})
                await session.call_tool("notes/echo", {"text": "b"})
                await session.call_tool("notes/echo", {})
                await session.call_tool("net/fetch", {})
            async with httpx2.AsyncClient(timeout=10) as http:
                await http.post(server.url, content=b"{}", headers={"Host": "evil.example.com"})
                metrics = await http.get(f"http://127.0.0.1:{server.port}/metrics")
    assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
    lines = metrics.text.splitlines()
    assert 'skilld_tool_calls_total{skill="notes",tool="notes/echo",outcome="ok"} 2' in lines
    assert (
        'skilld_tool_calls_total{skill="notes",tool="notes/echo",outcome="invalid-argument"} 1'
        in lines
    )
    assert (
        'skilld_tool_calls_total{skill="net",tool="net/fetch",outcome="not-permitted"} 1' in lines
    )
    assert 'skilld_tool_errors_total{skill="net"} 1' in lines
    assert 'skilld_permission_denials_total{skill="net",rule="x"} 1' in lines
    assert 'skilld_tool_call_seconds_count{skill="notes"} 2' in lines
    assert 'skilld_tool_call_seconds_bucket{skill="notes",le="+Inf"} 2' in lines
    assert 'skilld_http_rejections_total{status="421"} 1' in lines
    assert "skilld_tool_calls_in_flight 0" in lines


def test_metrics_exposition_escapes_labels() -> None:
    """Label values with quotes, backslashes and newlines are escaped as the format requires."""
    metrics = Metrics()
    metrics.denied('we"ird\\skill\n', "r")
    assert 'skill="we\\"ird\\\\skill\\n"' in metrics.render()


async def test_a_full_skill_refuses_after_the_queue_timeout() -> None:
    """With every slot of a skill taken, another call waits briefly then fails as busy."""
    gate = Gate()
    config = ServeConfig(transport="http", port=0, skill_concurrency=1, queue_timeout_s=0.2)
    with anyio.fail_after(30):
        async with (
            running_http(fake_dispatcher(gate), config) as server,
            streamable_http_client(server.url) as (read, write),
            ClientSession(read, write) as session,
            anyio.create_task_group() as tg,
        ):
            await session.initialize()
            tg.start_soon(session.call_tool, "work/wait", {})
            await anyio.to_thread.run_sync(gate.started.wait)
            busy = await session.call_tool("work/progress", {})
            assert busy.is_error
            assert text_of(busy).startswith("[limit-exceeded] skill work is busy")
            # Another skill is not affected by work's limit.
            assert not (await session.call_tool("notes/echo", {"text": "x"})).is_error
            gate.release.set()


async def test_shutdown_drains_calls_in_flight() -> None:
    """Stopping the server refuses new calls and readiness, and lets the running call finish."""
    gate = Gate()
    results = []
    with anyio.fail_after(30):
        async with (
            running_http(fake_dispatcher(gate)) as server,
            # terminate_on_close=False: the server is gone once the call has drained.
            streamable_http_client(server.url, terminate_on_close=False) as (read, write),
            ClientSession(read, write) as session,
            anyio.create_task_group() as tg,
        ):
            await session.initialize()
            # The client lists tools after a call to check structured output; list
            # them now, while the server still accepts connections.
            await session.list_tools()

            async def call() -> None:
                results.append(await session.call_tool("work/wait", {}))

            tg.start_soon(call)
            await anyio.to_thread.run_sync(gate.started.wait)
            server.stop()
            async with httpx2.AsyncClient(timeout=10) as http:
                ready = await http.get(f"http://127.0.0.1:{server.port}/readyz")
                while ready.json()["status"] != "draining":
                    ready = await http.get(f"http://127.0.0.1:{server.port}/readyz")
                assert ready.status_code == 503
            refused = await session.call_tool("notes/echo", {"text": "late"})
            assert refused.is_error
            assert "shutting down" in text_of(refused)
            gate.release.set()
    (finished,) = results
    assert not finished.is_error
    assert text_of(finished) == '{"released": true}'


async def test_memory_transport_sanity() -> None:
    """The in-memory harness used by the mapping tests serves the same dispatcher."""
    with anyio.fail_after(10):
        async with connect("memory") as session:
            assert len((await session.list_tools()).tools) == len(fake_dispatcher().tools())
