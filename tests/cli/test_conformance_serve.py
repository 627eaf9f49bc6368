"""The official MCP conformance suite against `skilld serve` and the sandboxed conformance skill."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from support.env import ROOT, cache_env

SUITE = Path(os.environ.get("SKILLD_MCP_CONFORMANCE") or ROOT / "tools" / "mcp-conformance")


@pytest.mark.slow
def test_serve_passes_every_server_scenario(tmp_path: Path) -> None:
    """All 30 active server scenarios pass against `serve --with-conformance` and the wasm skill."""
    assert SUITE.is_file(), f"no conformance runner at {SUITE} (SKILLD_MCP_CONFORMANCE)"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "skilld",
            "serve",
            "--with-conformance",
            "--transport",
            "http",
            "--port",
            "0",
            "--state-dir",
            str(tmp_path / "state"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **cache_env()},
    )
    try:
        assert server.stderr is not None
        url = None
        for line in server.stderr:  # the JSON "serving" line names the bound URL
            if line.startswith("{") and '"serving"' in line:
                url = json.loads(line)["url"]
                break
        assert url, "the server never said where it listens"
        # keep draining its log so a full pipe never blocks the server
        threading.Thread(target=server.stderr.read, daemon=True).start()
        done = subprocess.run(
            [str(SUITE), url], capture_output=True, text=True, timeout=900, check=False
        )
    finally:
        server.terminate()
        server.wait(timeout=60)
    summary = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"scenarios: 30 passed, 0 failed", summary), done.stdout[-4000:]
