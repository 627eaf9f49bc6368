"""The official TypeScript SDK client against the same server, in both protocol eras."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator

import anyio
import pytest
from test_mcp_rounds import tool

from skilld.audit import MemorySink
from skilld.mcp import HttpServer, ServeConfig
from skilld.registry import Registry
from support.env import ROOT
from support.mcp_fakes import running_http

CLIENT = ROOT / "tools" / "mcp-ts-client"

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
async def server(conformance: tuple[Registry, MemorySink]) -> AsyncIterator[HttpServer]:
    """The wasm conformance skill over Streamable HTTP."""
    async with running_http(conformance[0], ServeConfig(transport="http", port=0)) as srv:
        yield srv


@pytest.mark.parametrize("mode", ["2026-07-28", "legacy"])
async def test_typescript_sdk_completes_a_guest_that_elicits_samples_and_lists_roots(
    server: HttpServer,
    conformance: tuple[Registry, MemorySink],
    mode: str,
) -> None:
    """@modelcontextprotocol/client 2.4.0 pinned to 2026-07-28 (input-required rounds) and in
    legacy mode (2025-11-25 server requests) gets the same answers from the same guest."""
    registry, sink = conformance
    names = [tool(registry, m) for m in ("ir_multi_round", "ir_sampling", "ir_multiple_inputs")]
    with anyio.fail_after(300):
        done = await anyio.run_process(
            [str(CLIENT), server.url, mode, *names], check=False, env=dict(os.environ)
        )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    lines = [json.loads(line) for line in done.stdout.decode().splitlines() if line.startswith("{")]
    assert [(r["text"], r["isError"]) for r in lines] == [
        ("Ada likes teal", False),
        ("LLM response: Paris", False),
        ("Paris Ada (1 roots)", False),
    ]
    records = [r for r in sink.records if r.get("skill") == "conformance"]
    assert [r.get("outcome") for r in records] == ["ok", "ok", "ok"], records
