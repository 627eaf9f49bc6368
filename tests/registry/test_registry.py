"""The registry dispatches tool calls to real components, audits them, and checks invoke."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from skilld.errors import DeadlineExceeded, GuestError, RegistryError
from skilld.registry import Exposure, NullChannel, Registry, SkillEntry
from skilld.sandbox import Sandbox
from skilld.state import SqliteState
from skilld.types import Decision, Limits


class MemorySink:
    """Keeps audit records in a list."""

    def __init__(self) -> None:
        self.records: list[Mapping[str, Any]] = []

    def emit(self, record: Mapping[str, Any]) -> None:
        self.records.append(record)


class InvokeOnly:
    """A checker that allows invoking the named skills and nothing else."""

    def __init__(self, callees: set[str]):
        self.callees = callees

    def check(self, capability: str, action: str, target: str) -> Decision:
        ok = capability == "invoke" and target in self.callees
        return Decision(
            ok,
            capability,
            action,
            target,
            "test.invoke[0]" if ok else "default-deny",
            "listed" if ok else f"{target} is not listed",
        )


@pytest.fixture
def registry(
    sandbox: Sandbox, component_path: Callable[[str], Path], tmp_path: Path
) -> tuple[Registry, MemorySink]:
    """A registry with echo, notes and hostile (which may invoke echo and itself)."""
    sink = MemorySink()
    reg = Registry(audit=sink)
    state = SqliteState(tmp_path / "state.db")
    for name in ("echo", "notes", "hostile"):
        comp = sandbox.load(component_path(name).read_bytes(), name=name)
        spec = comp.describe(
            __import__("skilld.sandbox", fromlist=["CallContext"]).CallContext(
                name, Limits(), NullChannel()
            )
        )
        exposure = Exposure(hidden=("fail",)) if name == "echo" else Exposure()
        if name == "notes":
            exposure = Exposure(per_skill=True)
        reg.add(
            SkillEntry(
                spec=spec,
                component=comp,
                kv=state.store(name),
                limits=Limits(timeout_ms=2000),
                checker=InvokeOnly({"echo", "hostile"}) if name == "hostile" else None,
                exposure=exposure,
            )
        )
    reg.mark_ready()
    return reg, sink


def test_tools_follow_exposure(registry: tuple[Registry, MemorySink]) -> None:
    """Per-method tools are named skill/method, hidden methods vanish, per-skill is one tool."""
    reg, _ = registry
    names = {t.name for t in reg.tools()}
    assert {"echo/echo", "echo/structured", "notes", "hostile/loop"} <= names
    assert "echo/fail" not in names
    notes = next(t for t in reg.tools() if t.name == "notes")
    assert set(notes.input_schema["properties"]["method"]["enum"]) == {
        "add",
        "get",
        "list",
        "delete",
    }


def test_call_and_audit(registry: tuple[Registry, MemorySink]) -> None:
    """A call returns the value and leaves one audit record with digests and outcome."""
    reg, sink = registry
    out = reg.call("echo/echo", {"text": "hi"}, NullChannel())
    assert out.value == "hi"
    (rec,) = sink.records
    assert rec["skill"] == "echo" and rec["method"] == "echo" and rec["outcome"] == "ok"
    assert len(rec["input_sha256"]) == 64 and rec["output_sha256"]


def test_per_skill_tool(registry: tuple[Registry, MemorySink]) -> None:
    """A per-skill tool dispatches on its method argument and refuses hidden/unknown ones."""
    reg, _ = registry
    reg.call("notes", {"method": "add", "args": {"title": "x", "body": "y"}}, NullChannel())
    assert (
        reg.call("notes", {"method": "get", "args": {"title": "x"}}, NullChannel()).value["body"]
        == "y"
    )
    with pytest.raises(GuestError, match="no method"):
        reg.call("notes", {"method": "drop_all"}, NullChannel())


def test_unknown_tool(registry: tuple[Registry, MemorySink]) -> None:
    """An unknown tool name is a RegistryError naming it."""
    reg, _ = registry
    with pytest.raises(RegistryError, match="nope"):
        reg.call("nope", {}, NullChannel())


def test_faults_are_audited(registry: tuple[Registry, MemorySink]) -> None:
    """A deadline costs the call, is raised, and is audited as a limit hit."""
    reg, sink = registry
    with pytest.raises(DeadlineExceeded):
        reg.call("hostile/loop", {}, NullChannel())
    assert sink.records[-1]["outcome"] == "deadline"
    assert sink.records[-1]["limits_hit"] == ["deadline"]


def test_invoke_allowed_and_denied(registry: tuple[Registry, MemorySink]) -> None:
    """invoke reaches an allowed skill; a callee outside the policy is denied with its rule."""
    reg, sink = registry
    ok = reg.call(
        "hostile/relay",
        {"skill_id": "echo", "method": "echo", "args": {"text": "via"}},
        NullChannel(),
    )
    assert ok.value == "via"
    inner, outer = sink.records[-2], sink.records[-1]
    assert inner["caller"] == "skill:hostile" and inner["depth"] == 1
    assert outer["decisions"][0]["allowed"] is True
    denied = reg.call(
        "hostile/relay", {"skill_id": "notes", "method": "list", "args": {}}, NullChannel()
    ).value
    assert denied["denied"] == "not-permitted" and denied["rule"] == "default-deny"
    assert sink.records[-1]["decisions"][0]["allowed"] is False


def test_invoke_cycle_is_depth_limited(registry: tuple[Registry, MemorySink]) -> None:
    """A skill invoking itself forever is stopped by the depth limit with a typed error."""
    reg, _ = registry
    args: dict[str, Any] = {"skill_id": "hostile", "method": "relay", "args": {}}
    nested = args
    for _ in range(12):
        inner: dict[str, Any] = {"skill_id": "hostile", "method": "relay", "args": {}}
        nested["args"] = inner
        nested = inner
    nested["args"] = {"skill_id": "echo", "method": "echo", "args": {"text": "deep"}}
    out = reg.call("hostile/relay", args, NullChannel()).value
    text = json.dumps(out)
    assert "limit-exceeded" in text and "depth" in text
