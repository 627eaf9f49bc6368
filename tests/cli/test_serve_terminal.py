"""``skilld serve`` as a new user meets it: the banner, the logs, a busy port, where state goes."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from skilld.bundle import BuildResult
from support.env import ROOT, cache_env


def _argv(bundle: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "skilld", "serve", "--bundle", str(bundle), *extra]


def _env(state_home: Path) -> dict[str, str]:
    return {**os.environ, **cache_env(), "XDG_STATE_HOME": str(state_home)}


@contextmanager
def _stopping(proc: subprocess.Popen[bytes]) -> Iterator[subprocess.Popen[bytes]]:
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _read_until(fd: int, needle: bytes, proc: subprocess.Popen[bytes]) -> bytes:
    """What the server wrote to ``fd`` up to and including ``needle`` (fails if it exits)."""
    seen = b""
    deadline = time.monotonic() + 120
    while needle not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {needle!r} in: {seen.decode(errors='replace')}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: the pty closed, the server is gone
                chunk = b""
            assert chunk, f"server exited ({proc.poll()}): {seen.decode(errors='replace')}"
            seen += chunk
    return seen


def test_terminal_gets_a_plain_banner_with_url_and_how_to_stop(
    demo_bundle: BuildResult, tmp_path: Path
) -> None:
    """On a terminal, stderr carries a plain banner (URL, state, Ctrl-C) and no JSON at all."""
    bundle = demo_bundle.out
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        _argv(bundle, "--transport", "http", "--port", "0"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=slave,
        env=_env(tmp_path),
    )
    os.close(slave)
    try:
        with _stopping(proc):
            text = _read_until(master, b"Press Ctrl-C to stop.", proc).decode()
    finally:
        os.close(master)
    lines = [line for line in text.splitlines() if line.strip()]
    assert re.fullmatch(
        rf"skilld 0\.1\.0: serving {re.escape(str(bundle))} \(\d+ skills, \d+ tools\)", lines[0]
    )
    assert any(line.split()[-1].startswith("http://127.0.0.1:") for line in lines)
    assert any("/sse" in line for line in lines)
    assert any(line.split() == ["authentication:", "none", "(anyone", "who", "reaches", "the",
                                "address", "may", "call)"] for line in lines)  # fmt: skip
    assert not [line for line in lines if line.lstrip().startswith("{")]


def test_pipe_gets_json_lines_only(demo_bundle: BuildResult, tmp_path: Path) -> None:
    """Not on a terminal, every stderr line is one JSON object: ready (with state), serving."""
    bundle = demo_bundle.out
    proc = subprocess.Popen(
        _argv(bundle, "--transport", "http", "--port", "0"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=_env(tmp_path),
    )
    assert proc.stderr is not None
    events = []
    with _stopping(proc):
        for raw in proc.stderr:
            events.append(json.loads(raw))
            if events[-1]["event"] == "serving":
                break
    ready = next(e for e in events if e["event"] == "ready")
    assert ready["bundle"] == str(bundle)
    # no --state-dir: the bundle's own directory under the (test's) XDG state home
    state = Path(ready["state_dir"])
    assert state.parent == tmp_path / "skilld"
    assert state.name.startswith(f"{bundle.name}-")
    assert (state / "audit.jsonl").is_file()


def test_busy_port_is_a_clear_error_before_ready(demo_bundle: BuildResult, tmp_path: Path) -> None:
    """A port in use fails with host:port named (exit 2); nothing says ready; JSON to the end."""
    bundle = demo_bundle.out
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        done = subprocess.run(
            _argv(bundle, "--transport", "http", "--port", str(port)),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=_env(tmp_path),
            timeout=120,
            check=False,
        )
    assert done.returncode == 2, done.stderr
    events = [json.loads(line) for line in done.stderr.splitlines()]  # JSON only, to the end
    assert [e["event"] for e in events if e["event"] in ("ready", "serving")] == []
    failed = events[-1]
    assert failed["event"] == "failed" and failed["kind"] == "UsageError"
    assert f"cannot listen on 127.0.0.1:{port}" in failed["error"]


def test_with_conformance_goes_with_the_demo_only(demo_bundle: BuildResult, tmp_path: Path) -> None:
    """--with-conformance beside --bundle is a usage error (exit 2), said in a JSON line."""
    bundle = demo_bundle.out
    done = subprocess.run(
        _argv(bundle, "--with-conformance", str(ROOT / "tests")),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    (failed,) = [json.loads(line) for line in done.stderr.splitlines()]
    assert failed["event"] == "failed" and "--with-conformance" in failed["error"]
