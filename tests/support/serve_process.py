"""A real ``skilld serve --transport http`` process for the operations tests.

The bundle is built once per module from the repository's skills with small test
policies (never the demo policies, which other work changes). The server's JSON
log lines are read on a thread, so a test can wait for one (``wait_for``) without
sleeping and a full pipe never blocks the server.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from skilld.bundle import build_bundle
from skilld.sandbox import Sandbox
from support.env import SKILLS, cache_dir

# conformance: its elicitation tool holds a call open until the test's client answers.
# hostile: writes keys, spins to its deadline.
POLICIES = {
    "conformance.yaml": (
        "skill: conformance\nmcp:\n  tools: per-method\n  client: [elicit]\n"
        "limits:\n  wall_time: 60s\n"
    ),
    "echo.yaml": "skill: echo\ninvoke:\n  called_by: [hostile]\n",
    "hostile.yaml": (
        "skill: hostile\nkv: {}\nfs:\n  - id: data-ro\n    path: {data}\n    mode: ro\n"
        "invoke:\n  calls: [echo]\nlimits:\n  wall_time: 2s\n  memory: 128MiB\n"
    ),
}


def build_ops_bundle(sandbox: Sandbox, root: Path) -> Path:
    """Build the operations tests' bundle (conformance, echo, hostile) under ``root``."""
    data = root / "data"
    data.mkdir()
    (data / "hello.txt").write_text("hello")
    skills = root / "skills"
    skills.mkdir()
    shutil.copytree(SKILLS["conformance"], skills / "conformance")
    shutil.copytree(SKILLS["echo"], skills / "echo")
    shutil.copytree(SKILLS["hostile"], skills / "hostile")
    policies = root / "policies"
    policies.mkdir()
    for name, text in POLICIES.items():
        (policies / name).write_text(text.replace("{data}", str(data)))
    bundle = root / "bundle"
    build_bundle(skills, policies, bundle, sandbox=sandbox, cache_dir=cache_dir(), strict=False)
    return bundle


def serve_argv(bundle: Path, state: Path, transport: str, *extra: str) -> list[str]:
    """``skilld serve`` of ``bundle`` over ``transport``, its state and audit log (in
    ``audit.jsonl``) in ``state``."""
    return [
        sys.executable,
        "-m",
        "skilld",
        "serve",
        "--bundle",
        str(bundle),
        "--transport",
        transport,
        "--state-dir",
        str(state),
        "--audit-log",
        str(state / "audit.jsonl"),
        *extra,
    ]


class ServeProcess:
    """``skilld serve`` over HTTP on a free loopback port, with its log lines at hand."""

    def __init__(
        self,
        bundle: Path,
        state: Path,
        *,
        extra: Sequence[str] = (),
        preexec: Callable[[], None] | None = None,
    ):
        self.audit_log = state / "audit.jsonl"
        self.proc = subprocess.Popen(
            serve_argv(bundle, state, "http", "--port", "0", *extra),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "SKILLD_CACHE": str(cache_dir())},
            preexec_fn=preexec,
        )
        self.lines: list[str] = []
        self.stderr_bytes = 0
        self._queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        threading.Thread(target=self._read, daemon=True).start()
        serving = self.wait_for("serving", timeout=120)
        self.url: str = serving["url"]
        self.base = self.url.removesuffix("/mcp")

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_bytes += len(line)
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, event: str, timeout: float = 60) -> dict[str, Any]:
        """The next JSON log line whose event is ``event`` (lines before it are kept in ``lines``).

        Raises:
            AssertionError: the server exited, or ``timeout`` passed, first.
        """
        end = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"no {event!r} line in {timeout}s: {self.lines[-20:]}"
                ) from None
            if line is None:
                raise AssertionError(f"the server exited before {event!r}: {self.lines[-20:]}")
            self.lines.append(line)
            if line.startswith("{"):
                fields = json.loads(line)
                if fields.get("event") == event:
                    return dict(fields)

    def drain_log(self) -> None:
        """Read the rest of the log (the process has exited)."""
        while (line := self._queue.get(timeout=30)) is not None:
            self.lines.append(line)

    def events(self) -> list[dict[str, Any]]:
        """Every JSON log line read so far."""
        return [json.loads(line) for line in self.lines if line.startswith("{")]

    def audit(self) -> list[dict[str, Any]]:
        """Every audit record written so far."""
        if not self.audit_log.exists():
            return []
        text = self.audit_log.read_text(encoding="utf-8")
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def stop(self) -> None:
        """Kill the process if a test left it running."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
