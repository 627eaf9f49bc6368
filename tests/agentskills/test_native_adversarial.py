"""The native executor against a hostile script: every attack refused or contained.

Each case runs ``scripts/probe.py CASE`` of the hostile skill through the registry
(slot, context, audit) and a real confined process; the script prints ``LEAK`` when
an attack got through. After every case the same skill answers a harmless call.
skilld runs as root here, so file modes protect nothing: only the kernel's
confinement (Landlock, namespaces, rlimits, no capabilities) stands in the way.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import socket
import sys
import threading
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from skilld import agentskills
from skilld.bundle import BuildResult
from skilld.confine import SIMULATE_ABI_ENV
from skilld.errors import (
    CallCancelled,
    ConfinementUnavailable,
    DeadlineExceeded,
    MemoryExhausted,
)
from skilld.registry import Call, Registry, SkillEntry
from skilld.types import Limits
from support.env import cache_dir

HOSTILE = Path(__file__).resolve().parent / "hostile"
PROBE = HOSTILE / "scripts" / "probe.py"
TIMEOUT_MS = 3000


def _cases() -> list[str]:
    tree = ast.parse(PROBE.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "CASES":
            assert isinstance(node.value, ast.Dict)
            return [k.value for k in node.value.keys if isinstance(k, ast.Constant)]
    raise AssertionError("no CASES in probe.py")


CASES = [c for c in _cases() if c != "ping"]
# How a case ends when it is contained rather than refused with an error.
DEADLINE = {"cpu-spin"}
TRUNCATED = {"stdout-flood", "stderr-flood"}
# Landlock does not govern file metadata: a process owning the skill's files may change
# their mode or times (never their content, which the test checks after every case).
# Run as root, the executor serves a copy owned by nobody, where both fail; otherwise a
# bundle on a read-only mount or owned by another user is what refuses them.
METADATA = set() if os.geteuid() == 0 else {"chmod-skill-file", "utime-skill-file"}
# Exhaustion is refused (MemoryError, EAGAIN) or, on a host under memory pressure, the
# kernel kills the process: contained either way.
KILLED_OK = {"memory-bomb", "fork-bomb"}
# Or the reaper, measuring the tree against the skill's memory limit, ends it first.
TREE_MEMORY = {"memory-bomb"}
# kill(-1) returns 0 even when every process it tried refused the signal (EPERM: another
# uid, or outside the script's Landlock signal scope): it prints LEAK having killed
# nothing; the host, this test and the next call are still there to show it.
SIGNALLED_NOTHING = {"kill-everything"}


class ListSink:
    """Audit records kept in memory."""

    def __init__(self) -> None:
        self.records: list[Mapping[str, Any]] = []

    def emit(self, record: Mapping[str, Any]) -> None:
        """Keep one record."""
        self.records.append(record)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The hostile skill registered with a native executor, and things it must not reach."""
    root = tmp_path_factory.mktemp("hostile")
    skill_dir = root / "bundle" / "agentskills" / "hostile" / "files"
    shutil.copytree(HOSTILE, skill_dir)
    for path in [*skill_dir.rglob("*"), skill_dir]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    (root / "bundle" / "bundle.lock").write_text("the lock")
    outside = root / "state"
    outside.mkdir()
    (outside / "audit.jsonl").write_text("records")
    source = agentskills.read_source(HOSTILE)
    spec = agentskills.describe(source.md, "0.0.0", source.files)
    limits = Limits(timeout_ms=TIMEOUT_MS, memory_bytes=256 << 20)
    backend = agentskills.open_backend(
        spec, skill_dir, None, "native", {"interpreters": ("python",)}, {}, limits
    )
    sink = ListSink()
    registry = Registry(audit=sink)
    registry.add(SkillEntry(spec=spec, component=backend, limits=limits))
    listener = socket.create_server(("127.0.0.1", 0))
    abstract = f"skilld-hostile-{uuid.uuid4().hex}"
    unix = socket.socket(socket.AF_UNIX)
    unix.bind("\0" + abstract)
    unix.listen()
    secret_name, secret_value = "SKILLD_TEST_SECRET", uuid.uuid4().hex
    os.environ[secret_name] = secret_value
    try:
        yield {
            "registry": registry,
            "audit": sink,
            "ctx": {
                "skill": str(backend.executor.root),  # type: ignore[union-attr]
                "outside_file": str(root / "bundle" / "bundle.lock"),
                "outside_dir": str(outside),
                "port": listener.getsockname()[1],
                "abstract": abstract,
                "host_pid": os.getpid(),
                "secret_name": secret_name,
                "secret_value": secret_value,
                "token": f"skilld-grandchild-{uuid.uuid4().hex}",
            },
            "skill_dir": skill_dir,
            "served_dir": backend.executor.root,  # type: ignore[union-attr]
        }
    finally:
        os.environ.pop(secret_name, None)
        listener.close()
        unix.close()


def _probe(world: dict[str, Any], case: str) -> dict[str, Any]:
    registry: Registry = world["registry"]
    out = registry.call_method(
        Call(
            "hostile",
            "run_script",
            {"script": "scripts/probe.py", "args": [case, json.dumps(world["ctx"])]},
        )
    )
    value: dict[str, Any] = out.value
    return value


def _processes_with(token: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if token.encode() in cmdline:
            found.append(proc.name)
    return found


def test_there_are_at_least_sixty_cases() -> None:
    """The suite holds at least 60 attacks (the issue's bar)."""
    assert len(CASES) >= 60


@pytest.mark.parametrize("case", CASES)
def test_attack_is_refused_or_contained_and_the_next_call_answers(
    world: dict[str, Any], case: str
) -> None:
    """The attack gets nothing (the kernel refuses it, or the call is cut short), the
    skill directory is unchanged, and the next call of the skill is answered."""
    served = world["served_dir"]
    before = {p: (p.read_bytes(), p.stat().st_mode) for p in served.rglob("*") if p.is_file()}
    value: dict[str, Any] | None = None
    if case in DEADLINE:
        with pytest.raises(DeadlineExceeded, match="whole process tree was killed"):
            _probe(world, case)
        assert world["audit"].records[-1]["outcome"] == "deadline"
    elif case in TREE_MEMORY:
        try:
            value = _probe(world, case)
        except MemoryExhausted as exc:
            over = str(exc)
        else:
            over = ""
        if value is None:
            assert "over the skill's memory limit of 256 MiB" in over
            assert world["audit"].records[-1]["outcome"] == "memory"
    else:
        value = _probe(world, case)
    if value is not None:
        assert case in METADATA | SIGNALLED_NOTHING or "LEAK" not in value["stdout"], value
        if case in TRUNCATED:
            assert value["output_truncated"]
            assert len(value["stdout"]) + len(value["stderr"]) <= 2 * agentskills_cap()
        elif case in METADATA | SIGNALLED_NOTHING:
            pass  # content unchanged and the next call answered: checked below
        elif case in KILLED_OK and value["signal"] is not None:
            assert value["exit_status"] is None
        else:
            assert value["stdout"].startswith("BLOCKED"), value
        record = world["audit"].records[-1]
        assert record["outcome"] == "ok"
        assert record["decisions"][0]["capability"] == "scripts"
        assert record["executor"] == "native"
        assert record["script"] == "scripts/probe.py"
        assert record["exit_status"] == value["exit_status"]
        assert record["input_sha256"] and record["output_sha256"]
    after = {p: (p.read_bytes(), p.stat().st_mode) for p in served.rglob("*") if p.is_file()}
    assert after == before
    assert _processes_with(world["ctx"]["token"]) == []
    assert "pong" in _probe(world, "ping")["stdout"]


def agentskills_cap() -> int:
    """The per-stream output cap of the native executor."""
    from skilld.agentskills._executors import OUTPUT_CAP

    return OUTPUT_CAP


def test_no_landlock_refuses_to_run(
    world: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without Landlock (simulated), the executor runs nothing and says what is missing."""
    monkeypatch.setenv(SIMULATE_ABI_ENV, "0")
    with pytest.raises(ConfinementUnavailable, match="Landlock") as refused:
        _probe(world, "ping")
    assert refused.value.code == "confinement-refused"
    assert str(refused.value).startswith("wall landlock: ")
    record = world["audit"].records[-1]
    assert record["outcome"] == "error:confinement-refused"
    assert "Landlock" in record["error"]


def test_an_old_landlock_refuses_to_run(
    world: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Landlock without the features the confinement needs (ABI 2) refuses too."""
    monkeypatch.setenv(SIMULATE_ABI_ENV, "2")
    with pytest.raises(ConfinementUnavailable):
        _probe(world, "ping")


class CancelAfter:
    """A client channel that says it cancelled once ``event`` is set."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def progress(self, progress: float, total: float | None, message: str | None) -> None:
        """Drop it."""

    def log(self, level: str, data: Any) -> None:
        """Drop it."""

    def sample(self, params: Mapping[str, Any]) -> Mapping[str, Any]:
        """No client to ask."""
        raise AssertionError("not used")

    def elicit(self, params: Mapping[str, Any]) -> Mapping[str, Any]:
        """No client to ask."""
        raise AssertionError("not used")

    def cancelled(self) -> bool:
        """True once the test cancels."""
        return self.event.is_set()


def test_cancelling_kills_the_script_tree(world: dict[str, Any]) -> None:
    """A client's cancellation ends a spinning script's tree; the audit says cancelled."""
    event = threading.Event()
    event.set()  # cancelled from the start: the executor must notice while it runs
    registry: Registry = world["registry"]
    with pytest.raises(CallCancelled, match="whole process tree was killed"):
        registry.call_method(
            Call(
                "hostile",
                "run_script",
                {"script": "scripts/probe.py", "args": ["cpu-spin", json.dumps(world["ctx"])]},
                CancelAfter(event),
            )
        )
    assert world["audit"].records[-1]["outcome"] == "cancelled"
    assert "pong" in _probe(world, "ping")["stdout"]


def test_a_refusal_reaches_the_client_as_its_own_code(
    agent_bundle: BuildResult, tmp_path: Path
) -> None:
    """Over MCP (``skilld serve``, the SDK client over stdio), a native script refused by
    the confinement (no Landlock, simulated) answers ``[confinement-refused] wall
    landlock: ...`` as a tool error, not ``[internal]``; the server answers next."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "skilld", "serve", "--bundle", str(agent_bundle.out),
              "--state-dir", str(tmp_path / "state")],
        env={**os.environ, "SKILLD_CACHE": str(cache_dir()), SIMULATE_ABI_ENV: "0"},
    )  # fmt: skip

    async def main() -> tuple[Any, Any]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            with anyio.fail_after(60):
                refused = await s.call_tool(
                    "pdf-text/run_script", {"script": "scripts/extract.py", "args": []}
                )
                listed = await s.list_tools()
            return refused, listed

    refused, listed = anyio.run(main)
    text = "".join(getattr(c, "text", "") for c in refused.content)
    assert refused.is_error
    assert text.startswith("[confinement-refused] wall landlock: "), text
    assert "Landlock" in text and "[internal]" not in text
    assert any(t.name == "pdf-text/run_script" for t in listed.tools)
