"""The official MCP conformance suite against `skilld serve` and the sandboxed conformance skill."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from support.env import ROOT, cache_env

SUITE = Path(os.environ.get("SKILLD_MCP_CONFORMANCE") or ROOT / "tools" / "mcp-conformance")


# What passes, per requirement set: the scored scenarios (last line), and those run but not
# scored (the line before: the tasks extension's 10 and the pending ones).
EXPECTED = {
    "2025-11-25": ("not scored: 3 passed, 0 failed", "scenarios: 30 passed, 0 failed"),
    "2026-07-28": ("not scored: 13 passed, 0 failed", "scenarios: 37 passed, 0 failed"),
}


@pytest.mark.slow
@pytest.mark.parametrize("revision", sorted(EXPECTED))
def test_serve_passes_every_server_scenario(tmp_path: Path, revision: str) -> None:
    """Every scenario a revision's requirement set runs passes against `serve
    --with-conformance tests/` and the wasm skill (2025-11-25: 30 scored; 2026-07-28: 37 scored,
    and the tasks extension's 10)."""
    assert SUITE.is_file(), f"no conformance runner at {SUITE} (SKILLD_MCP_CONFORMANCE)"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "skilld",
            "serve",
            "--with-conformance",
            str(ROOT / "tests"),
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
            [str(SUITE), url, "--requirements", revision],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
    finally:
        server.terminate()
        server.wait(timeout=60)
    summary = tuple(done.stdout.strip().splitlines()[-2:])
    assert summary == EXPECTED[revision], done.stdout[-4000:]
