"""A real `skilld serve` under a low descriptor limit and an idle crowd keeps answering probes."""

from __future__ import annotations

import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from support.serve_process import ServeProcess

LIMIT = 256
CROWD = 1000


def _low_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))


@pytest.fixture
def server(ops_bundle: Path, tmp_path: Path) -> Iterator[ServeProcess]:
    """A server limited to 256 descriptors (ulimit -n 256)."""
    proc = ServeProcess(ops_bundle, tmp_path, preexec=_low_fd_limit)
    try:
        yield proc
    finally:
        proc.stop()


def test_healthz_answers_under_a_thousand_idle_connections(server: ServeProcess) -> None:
    """1,000 idle connections against ulimit -n 256: /healthz answers, the log stays small."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < CROWD + 64:  # this test's own end of the crowd needs descriptors too
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, CROWD + 256), hard))
    serving = next(e for e in server.events() if e.get("event") == "serving")
    # The cap follows the limit: 160 descriptors are kept for the rest of the server.
    assert serving["max_connections"] == LIMIT - 160
    host, port = "127.0.0.1", int(server.base.rsplit(":", 1)[1])
    crowd: list[socket.socket] = []
    try:
        for _ in range(CROWD):
            crowd.append(socket.create_connection((host, port), timeout=10))
        with httpx2.Client(timeout=5) as http:
            for _ in range(20):
                started = time.monotonic()
                health = http.get(f"{server.base}/healthz", headers={"Connection": "close"})
                assert health.status_code == 200
                assert time.monotonic() - started < 5
    finally:
        for sock in crowd:
            sock.close()
    assert server.proc.poll() is None
    server.proc.terminate()
    assert server.proc.wait(timeout=30) == 0
    server.drain_log()
    # No storm of "Too many open files": the server never ran out of descriptors.
    assert server.stderr_bytes < 64_000
    assert not any("Too many open files" in line for line in server.lines)
