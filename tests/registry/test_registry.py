"""The registry dispatches tool calls to real components, audits them, and checks invoke."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from skilld.audit import MemorySink
from skilld.errors import CallCancelled, DeadlineExceeded, GuestError, RegistryError
from skilld.package.build import build_component
from skilld.registry import (
    Exposure,
    NullChannel,
    Registry,
    SkillEntry,
    ToolAnnotations,
    annotations_for,
    per_skill_schema,
)
from skilld.sandbox import CallContext, Sandbox
from skilld.state import SqliteState
from skilld.types import Decision, Limits, MethodSpec
from support.checkers import TextQuestions
from support.env import SKILLS, cache_dir


class InvokeOnly(TextQuestions):
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
        spec = comp.describe(CallContext(name, Limits(), NullChannel()))
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
    branches = {b["properties"]["method"]["const"]: b for b in notes.input_schema["oneOf"]}
    add = next(m for m in reg.skills()[1].spec.methods if m.name == "add")
    assert branches["add"]["properties"]["args"] == add.params_schema


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


class CancelledChannel(NullChannel):
    """A channel whose client has already cancelled the call."""

    def cancelled(self) -> bool:
        return True


def test_cancellation_stops_a_guest_that_never_polls(
    registry: tuple[Registry, MemorySink],
) -> None:
    """The call's channel reaches the sandbox: a cancelled spinning guest stops, audited."""
    reg, sink = registry
    with pytest.raises(CallCancelled):
        reg.call("hostile/loop", {}, CancelledChannel())
    assert sink.records[-1]["outcome"] == "cancelled"
    assert sink.records[-1]["limits_hit"] == []


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
    assert inner["caller"] == "skill:hostile<local:stdio" and inner["depth"] == 1
    assert outer["decisions"][0]["allowed"] is True
    denied = reg.call(
        "hostile/relay", {"skill_id": "notes", "method": "list", "args": {}}, NullChannel()
    ).value
    assert denied["denied"] == "not-permitted" and denied["rule"] == "default-deny"
    assert sink.records[-1]["decisions"][0]["allowed"] is False


def test_invoke_cycle_is_stopped(registry: tuple[Registry, MemorySink]) -> None:
    """A self-invoking chain its checker lets through ends at the skill's slots, typed."""
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
    # The plain checker knows no depth and the host's ceiling is far off: a nested
    # call takes a slot without waiting, counted against its principal's share of the
    # skill's slots, so the chain stops when that share runs out.
    assert "limit-exceeded" in text and "hold 6 of the skill's 8 slots, its share" in text


# -- annotations -------------------------------------------------------------------

NOTHING = ToolAnnotations(read_only=True, destructive=False, idempotent=True, open_world=False)
CHANGES = ToolAnnotations(read_only=False, destructive=True, idempotent=False, open_world=False)
REACHES = ToolAnnotations(read_only=True, destructive=False, idempotent=True, open_world=True)
SENDS = ToolAnnotations(read_only=False, destructive=False, idempotent=False, open_world=True)
ANYTHING = ToolAnnotations(read_only=False, destructive=True, idempotent=False, open_world=True)
FS_RO = {"fs": [{"id": "s.fs", "path": "/data", "mode": "ro"}]}
FS_RW = {"fs": [{"id": "s.fs", "path": "/data", "mode": "rw"}]}
HTTP_GET = {"http": [{"id": "s.http", "url": "https://api.test/*", "methods": ["GET"]}]}
HTTP_POST = {"http": [{"id": "s.http", "url": "https://api.test/*", "methods": ["GET", "POST"]}]}
TCP = {"tcp": [{"id": "s.tcp", "host": "db.test", "ports": [[5432, 5432]]}]}
SHELL = {"shell": [{"id": "s.shell", "program": "git"}]}
KV = {"kv": {"id": "s.kv"}}
INVOKE = {"invoke": {"id": "s.invoke", "calls": ["notes"], "called_by": [], "max_depth": 4}}
CALLED_ONLY = {"invoke": {"id": "s.invoke", "calls": [], "called_by": ["*"], "max_depth": 4}}


@pytest.mark.parametrize(
    ("grants", "expected"),
    [
        ({}, NOTHING),
        (FS_RO, NOTHING),
        (FS_RW, CHANGES),
        (HTTP_GET, REACHES),
        (HTTP_POST, SENDS),
        (TCP, SENDS),
        (SHELL, CHANGES),
        (KV, CHANGES),
        (INVOKE, ANYTHING),
        (CALLED_ONLY, NOTHING),
        ({**FS_RO, **HTTP_GET}, REACHES),
        ({**FS_RO, **INVOKE}, ANYTHING),
        ({**KV, **HTTP_GET}, ANYTHING),
    ],
    ids=[
        "none",
        "fs-ro",
        "fs-rw",
        "http-get",
        "http-post",
        "tcp",
        "shell",
        "kv",
        "invoke",
        "invoked-only",
        "fs-ro+http-get",
        "fs-ro+invoke",
        "kv+http-get",
    ],
)
def test_annotations_follow_effective_grants(
    grants: Mapping[str, Any], expected: ToolAnnotations
) -> None:
    """Hints come from grants; invoke may reach any skill's grants, so it promises nothing."""
    assert annotations_for(grants) == expected


# -- per-skill tools -----------------------------------------------------------------


def _valid(schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> bool:
    validator = jsonschema.Draft202012Validator(schema)
    return validator.is_valid(arguments)


def test_per_skill_schema_checks_each_methods_arguments(
    registry: tuple[Registry, MemorySink],
) -> None:
    """A per-skill tool's schema holds every method's parameters, picked by ``method``."""
    reg, _ = registry
    schema = next(t for t in reg.tools() if t.name == "notes").input_schema
    jsonschema.Draft202012Validator.check_schema(schema)
    assert _valid(schema, {"method": "add", "args": {"title": "t", "body": "b"}})
    assert _valid(schema, {"method": "list"})
    assert not _valid(schema, {"method": "add", "args": {"title": 1, "body": "b"}})
    assert not _valid(schema, {"method": "add"})
    assert not _valid(schema, {"method": "get", "args": {"body": "b"}})
    assert not _valid(schema, {"method": "drop_all"})


def test_per_skill_schema_rebases_local_references() -> None:
    """A method schema's own $defs still resolve once it sits inside the per-skill schema."""
    tree = MethodSpec(
        "plant",
        "Plant a tree",
        {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "$defs": {
                "node": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "default": {"$ref": "#/not-a-ref"}},
                        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                    },
                    "required": ["name"],
                }
            },
            "properties": {"root": {"$ref": "#/$defs/node"}},
            "required": ["root"],
        },
    )
    schema = per_skill_schema([MethodSpec("noop", "", {"type": "object"}), tree])
    jsonschema.Draft202012Validator.check_schema(schema)
    args = schema["oneOf"][1]["properties"]["args"]
    assert "$schema" not in args
    node = args["$defs"]["node"]["properties"]
    assert node["name"]["default"] == {"$ref": "#/not-a-ref"}
    deep = {"root": {"name": "a", "kids": [{"name": "b", "kids": [{"name": "c"}]}]}}
    assert _valid(schema, {"method": "plant", "args": deep})
    broken = {"root": {"name": "a", "kids": [{"name": "b", "kids": [{"kids": []}]}]}}
    assert not _valid(schema, {"method": "plant", "args": broken})


# -- resources and prompts -----------------------------------------------------------


@pytest.fixture
def conformance(sandbox: Sandbox) -> tuple[Registry, MemorySink, SkillEntry]:
    """A registry serving the conformance skill (resources and prompts), one slot only."""
    wasm = build_component(SKILLS["conformance"], cache_dir=cache_dir())
    comp = sandbox.load(wasm.read_bytes(), name="conformance")
    limits = Limits(timeout_ms=2000, max_concurrency=1)
    sink = MemorySink()
    reg = Registry(audit=sink)
    entry = SkillEntry(
        spec=comp.describe(CallContext("conformance", limits, NullChannel())),
        component=comp,
        limits=limits,
    )
    reg.add(entry)
    reg.mark_ready()
    return reg, sink, entry


def test_resource_reads_and_prompts_are_audited(
    conformance: tuple[Registry, MemorySink, SkillEntry],
) -> None:
    """Reading a resource and rendering a prompt each leave one audit record, like a call."""
    reg, sink, _ = conformance
    assert reg.resource_skill("test://template/7/data") == "conformance"
    (out,) = reg.read_resource("test://template/7/data", NullChannel())
    assert json.loads(out.content[0].text or "")["id"] == "7"
    messages = reg.get_prompt(
        "test_prompt_with_arguments", {"arg1": "a", "arg2": "b"}, NullChannel()
    )
    assert "arg1='a'" in json.dumps(messages)
    read, prompt = sink.records
    assert (read["event"], read["skill"], read["caller"]) == ("call", "conformance", "local:stdio")
    assert (read["method"], read["target"], read["outcome"]) == (
        "read-resource",
        "test://template/7/data",
        "ok",
    )
    assert read["output_sha256"] is not None
    assert (prompt["method"], prompt["target"], prompt["outcome"]) == (
        "get-prompt",
        "test_prompt_with_arguments",
        "ok",
    )
    assert prompt["input_sha256"] != read["input_sha256"]
    with pytest.raises(RegistryError, match="no prompt"):
        reg.get_prompt("nope", {}, NullChannel())
    assert len(sink.records) == 2


def test_resource_reads_take_a_slot(
    conformance: tuple[Registry, MemorySink, SkillEntry],
) -> None:
    """A resource read waits for the skill's slots like a call, and is refused when none frees."""
    reg, sink, entry = conformance
    slot = entry.gate.take(0)  # the skill's only slot, held by "another call"
    try:
        with pytest.raises(GuestError, match=r"busy \(1 calls running\)"):
            reg.read_resource("test://static-text", NullChannel())
    finally:
        slot.release()
    (busy,) = sink.records
    assert (busy["method"], busy["outcome"], busy["limits_hit"]) == (
        "read-resource",
        "busy",
        ["busy"],
    )


class _CancelsAfter(NullChannel):
    """A client that cancels its call once it has been asked ``polls`` times."""

    def __init__(self, polls: int) -> None:
        self.polls = polls

    def cancelled(self) -> bool:
        self.polls -= 1
        return self.polls < 0


def test_a_call_waiting_for_a_slot_lets_go_when_cancelled(
    conformance: tuple[Registry, MemorySink, SkillEntry],
) -> None:
    """A call queued for a busy skill's slot ends as cancelled once its client cancels,
    not after the skill's whole wall time, and is audited as such."""
    reg, sink, entry = conformance
    slot = entry.gate.take(0)  # the skill's only slot, held by "another call"
    try:
        with pytest.raises(CallCancelled, match="while it waited for a slot"):
            reg.read_resource("test://static-text", _CancelsAfter(3))
    finally:
        slot.release()
    (record,) = sink.records
    assert record["outcome"] == "cancelled"
    (out,) = reg.read_resource("test://static-text", NullChannel())  # the slot is free again
    assert out.content
