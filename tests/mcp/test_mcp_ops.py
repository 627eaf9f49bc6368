"""Operations: probes, Prometheus metrics, per-skill concurrency and draining shutdown."""

from __future__ import annotations

from dataclasses import replace

import anyio
import anyio.to_thread
import httpx2
import pytest
from anyio import wait_all_tasks_blocked
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from skilld.mcp import ServeConfig
from skilld.mcp._metrics import Metrics
from skilld.mcp._serve_http import advertised_url
from support.mcp_fakes import (
    Gate,
    connect,
    fake_dispatcher,
    memory_service,
    memory_session,
    running_http,
    text_of,
)

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
        'skilld_tool_calls_total{skill="net",tool="net/fetch",outcome="error:not-permitted"} 1'
        in lines
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
    config = ServeConfig(transport="http", port=0, queue_timeout_s=0.2)
    with anyio.fail_after(30):
        async with (
            running_http(replace(fake_dispatcher(gate), concurrency=1), config) as server,
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


async def test_drain_refuses_a_call_still_waiting_for_a_slot() -> None:
    """A call queued for a slot when draining began is refused once the slot frees, never run."""
    gate = Gate()
    dispatcher = replace(fake_dispatcher(gate), concurrency=1)
    service = memory_service(dispatcher, ServeConfig(queue_timeout_s=30))
    results: dict[str, types.CallToolResult] = {}
    drained: list[bool] = []

    async def call(tool: str) -> None:
        results[tool] = await session.call_tool(tool, {})

    async def drain() -> None:
        drained.append(await service.drain(30))

    with anyio.fail_after(30):
        async with memory_session(service) as session, anyio.create_task_group() as tg:
            tg.start_soon(call, "work/wait")
            await anyio.to_thread.run_sync(gate.started.wait)
            tg.start_soon(call, "work/progress")
            await wait_all_tasks_blocked()
            assert dispatcher.gate("work").waiting == 1
            tg.start_soon(drain)
            await wait_all_tasks_blocked()
            assert drained == []
            gate.release.set()
    assert drained == [True]
    assert text_of(results["work/wait"]) == '{"released": true}'
    queued = results["work/progress"]
    assert queued.is_error and "shutting down" in text_of(queued)
    assert [name for name, _args in dispatcher.calls] == ["work/wait"]


async def test_drain_waits_for_a_resource_read_in_flight() -> None:
    """A resource read is a call in flight: drain waits for it, and refuses reads and prompts."""
    gate = Gate()
    service = memory_service(fake_dispatcher(gate))
    reads: list[types.ReadResourceResult] = []
    drained: list[bool] = []

    async def read() -> None:
        reads.append(await session.read_resource("note://wait"))

    async def drain() -> None:
        drained.append(await service.drain(30))

    with anyio.fail_after(30):
        async with memory_session(service) as session, anyio.create_task_group() as tg:
            tg.start_soon(read)
            await anyio.to_thread.run_sync(gate.started.wait)
            tg.start_soon(drain)
            await wait_all_tasks_blocked()
            assert drained == []
            with pytest.raises(MCPError, match=r"\[unavailable\] the server is shutting down"):
                await session.read_resource("note://readme")
            with pytest.raises(MCPError, match="shutting down"):
                await session.get_prompt("greet", {"tone": "formal"})
            gate.release.set()
    assert drained == [True]
    (content,) = reads[0].contents
    assert isinstance(content, types.TextResourceContents)
    assert content.text == '{"released":true}'
    lines = service.metrics.render().splitlines()
    ok = 'skilld_tool_calls_total{skill="static",tool="resource:note://wait",outcome="ok"} 1'
    assert ok in lines
    refused = 'skilld_tool_calls_total{skill="static",tool="prompt:greet",outcome="draining"} 1'
    assert refused in lines
    assert 'skilld_tool_call_seconds_count{skill="static"} 1' in lines


async def test_resources_and_prompts_share_the_skills_slots() -> None:
    """With the skill's only slot taken by a resource read, a prompt of that skill is busy."""
    gate = Gate()
    service = memory_service(
        replace(fake_dispatcher(gate), concurrency=1), ServeConfig(queue_timeout_s=0.05)
    )
    with anyio.fail_after(30):
        async with memory_session(service) as session, anyio.create_task_group() as tg:
            tg.start_soon(session.read_resource, "note://wait")
            await anyio.to_thread.run_sync(gate.started.wait)
            with pytest.raises(MCPError, match=r"\[limit-exceeded\] skill static is busy"):
                await session.get_prompt("greet", {"tone": "formal"})
            # Tools of other skills have slots of their own.
            assert not (await session.call_tool("notes/echo", {"text": "x"})).is_error
            gate.release.set()


def test_wildcard_binds_advertise_loopback() -> None:
    """The URL of a server bound to every address names loopback, which the Host check accepts."""
    assert advertised_url("0.0.0.0", 8080) == "http://127.0.0.1:8080/mcp"
    assert advertised_url("", 8080) == "http://127.0.0.1:8080/mcp"
    assert advertised_url("::", 8080) == "http://[::1]:8080/mcp"
    assert advertised_url("::1", 8080) == "http://[::1]:8080/mcp"
    assert advertised_url("10.0.0.7", 80) == "http://10.0.0.7:80/mcp"


async def test_wildcard_bind_url_serves() -> None:
    """A client given the advertised URL of a 0.0.0.0 server connects and calls a tool."""
    config = ServeConfig(transport="http", host="0.0.0.0", port=0)
    with anyio.fail_after(30):
        async with (
            running_http(fake_dispatcher(), config) as server,
            streamable_http_client(server.url) as (read, write),
            ClientSession(read, write) as session,
        ):
            assert server.url == f"http://127.0.0.1:{server.port}/mcp"
            await session.initialize()
            assert not (await session.call_tool("notes/echo", {"text": "x"})).is_error


async def test_refusals_before_the_guest_runs_reach_the_audit() -> None:
    """Invalid arguments, a busy skill and a draining server each hand the dispatcher a refusal."""
    gate = Gate()
    dispatcher = replace(fake_dispatcher(gate), concurrency=1)
    service = memory_service(dispatcher, ServeConfig(queue_timeout_s=0.2))
    with anyio.fail_after(30):
        async with memory_session(service) as session, anyio.create_task_group() as tg:
            invalid = await session.call_tool("notes/echo", {})
            assert invalid.is_error
            tg.start_soon(session.call_tool, "work/wait", {})
            await anyio.to_thread.run_sync(gate.started.wait)
            busy = await session.call_tool("work/progress", {})
            assert busy.is_error
            gate.release.set()
            assert await service.drain(30)
            late = await session.call_tool("notes/echo", {"text": "late"})
            assert late.is_error
            assert [name for name, _args in dispatcher.calls] == ["work/wait"]
    assert dispatcher.refusals == [
        ("notes", "notes/echo", "invalid-argument"),
        ("work", "work/progress", "busy"),
        ("notes", "notes/echo", "draining"),
    ]
