"""The official MCP conformance suite against skilld's server and the conformance dispatcher."""

from __future__ import annotations

import os
import re
from pathlib import Path

import anyio
import pytest

from support.env import ROOT
from support.mcp_fakes import running_http
from support.static_dispatcher import conformance_dispatcher

# The runner ships in tools/; SKILLD_MCP_CONFORMANCE points at another copy.
SUITE = Path(os.environ.get("SKILLD_MCP_CONFORMANCE") or ROOT / "tools" / "mcp-conformance")
ACTIVE_SERVER_SCENARIOS = 30


@pytest.mark.slow
@pytest.mark.anyio
async def test_conformance_suite_passes_every_server_scenario() -> None:
    """Every 2025-11-25 server scenario of @modelcontextprotocol/conformance passes over HTTP
    (the 2026-07-28 set runs against the wasm skill: tests/cli/test_conformance_serve.py)."""
    assert SUITE.is_file(), f"no conformance runner at {SUITE} (SKILLD_MCP_CONFORMANCE)"
    with anyio.fail_after(900):
        async with running_http(conformance_dispatcher()) as server:
            done = await anyio.run_process(
                [str(SUITE), server.url, "--requirements", "2025-11-25"], check=False
            )
    output = done.stdout.decode(errors="replace")
    summary = output.strip().splitlines()[-1]
    assert re.fullmatch(r"scenarios: (\d+) passed, 0 failed", summary), output[-4000:]
    assert summary == f"scenarios: {ACTIVE_SERVER_SCENARIOS} passed, 0 failed", output[-4000:]
    assert done.returncode == 0
