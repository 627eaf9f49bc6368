"""The service: results, traces, audit records and the registry seam."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from typing import Any

import pytest

from skilld.delegate import DelegateService
from skilld.errors import RunOnThread
from skilld.registry import NullChannel, Registry
from support.delegate import AuditFile

RESULT_KEYS = {
    "success", "output", "error", "program", "grade", "generation_tier", "correction_attempts",
    "generation_time_ms", "execution_time_ms", "total_time_ms", "trace",
}  # fmt: skip


def test_result_has_every_field_and_a_timed_trace(service: DelegateService) -> None:
    """A run returns the issue's result fields; each trace entry has step, tool, args, timing."""
    result = service.run_program("a = echo('one')\nresult = [a, echo(b)]", "text", {"b": "two"})
    assert result.keys() >= RESULT_KEYS
    assert result["success"] and result["output"] == ["one", "two"]
    assert result["grade"]["label"] == "Grade(0, 0)"
    assert result["total_time_ms"] >= result["execution_time_ms"] > 0
    steps = result["trace"]
    assert [(t["step"], t["tool"], t["args"], t["result"]) for t in steps] == [
        (1, "echo", {"text": "one"}, "one"),
        (2, "echo", {"text": "two"}, "two"),
    ]
    assert all(t["success"] and t["error"] is None and t["duration_ms"] > 0 for t in steps)


def test_large_tool_results_are_traced_as_digests(service: DelegateService) -> None:
    """A tool result over 1 KiB appears in the trace as its sha256 and size."""
    result = service.run_program("result = len(echo(big))", "text", {"big": "x" * 5000})
    assert result["output"] == 5000
    entry = result["trace"][0]
    raw = json.dumps("x" * 5000).encode()
    assert "result" not in entry
    assert entry["result_sha256"] == hashlib.sha256(raw).hexdigest()
    assert entry["result_bytes"] == len(raw)


def test_failed_tool_call_is_in_the_trace(service: DelegateService) -> None:
    """A tool's refusal ends the program with its code and line, and is the trace's last entry."""
    result = service.run_program("x = 1\nresult = get('missing-note')", "notes")
    assert result["error"]["code"] == "not-found" and result["error"]["line"] == 2
    last = result["trace"][-1]
    assert last["tool"] == "get" and not last["success"] and "not-found" in last["error"]


def test_every_tool_call_is_audited_under_the_kit(
    service: DelegateService, kits_registry: tuple[Registry, AuditFile]
) -> None:
    """The runner call and each tool call leave audit records; the gate's decision is kept."""
    registry, audit = kits_registry
    before = len(audit.records)
    registry.call("delegate", {"intent": "shout audit me", "kit": "text"}, NullChannel())
    records = audit.records[before:]
    by_skill = {r["skill"]: r for r in records}
    assert by_skill["echo"]["caller"] == "skill:kit.text<skill:delegate<local:stdio"
    assert by_skill["kit.text"]["caller"] == "skill:delegate<local:stdio"
    assert by_skill["delegate"]["caller"] == "local:stdio"
    assert {r["principal"] for r in records if r.get("event") == "call"} == {"local"}
    rules = [d["rule"] for d in by_skill["kit.text"]["decisions"]]
    assert "kit.text.tools" in rules and "kit.text.invoke" in rules


def test_programs_never_run_inline(kits_registry: tuple[Registry, AuditFile]) -> None:
    """An inline attempt at delegate or run_program goes to a thread; kit_list answers inline."""
    registry = kits_registry[0]
    with pytest.raises(RunOnThread):
        registry.call_inline(
            "run_program", {"program": "result = 1", "kit": "text"}, NullChannel(), 0.001
        )
    listed = registry.call_inline("kit_list", {}, NullChannel(), 0.05)
    assert {k["kit"] for k in listed.value} == {"notes", "text"}
    # The MCP layer tries delegate's tools inline (kit_list answers there), no guest's.
    inline = {t.name: t.inline for t in registry.tools()}
    assert inline["kit_list"] and inline["run_program"]
    assert not any(v for name, v in inline.items() if "/" in name)


def test_kit_info_lists_tools_limits_and_patterns(service: DelegateService) -> None:
    """kit_info says what each function calls, its positional parameters and the caps."""
    info = service.kit_info("notes")
    assert info["tools"]["add"]["calls"] == "notes/add"
    assert info["tools"]["add"]["params"] == ["title", "body"]
    assert info["tools"]["titles"]["params"] == []
    assert info["limits"]["tool_calls"] == 32 and info["limits"]["wall_time_ms"] == 5000
    assert [t["id"] for t in info["templates"]] == ["add-and-read", "show"]
    assert [r["id"] for r in info["rules"]] == ["list", "count"]


def test_programs_run_on_warm_runner_instances(
    kits_registry: tuple[Registry, AuditFile],
    service: DelegateService,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once warmed, a program takes a ready runner instance instead of instantiating one.

    The runner (CPython with the standard library) is the largest component a node
    has; instantiating it on a program's path cost more than the round trips a
    program saves (bench/bench_delegate.py, docs/runtime.md).
    """
    runner = next(
        e.component.component  # type: ignore[attr-defined]
        for e in kits_registry[0].skills()
        if e.spec.id == "kit.text"
    )
    assert service.run_program("result = 1", "text", {})["success"]  # the pool fills after it
    deadline = time.monotonic() + 120
    while runner._pool.qsize() == 0:
        assert time.monotonic() < deadline, "no warm runner instance appeared"
        time.sleep(0.01)  # polling the background worker, which has no event to wait on
    made_here: list[str] = []
    fresh = runner._fresh

    def counted(*args: Any, **kwargs: Any) -> Any:
        made_here.append(threading.current_thread().name)
        return fresh(*args, **kwargs)

    monkeypatch.setattr(runner, "_fresh", counted)
    assert service.run_program("result = 2", "text", {})["output"] == 2
    assert threading.current_thread().name not in made_here


def test_a_programs_runner_and_tool_calls_reuse_the_callers_warm_instances(
    kits_registry: tuple[Registry, AuditFile],
) -> None:
    """A second program for the same caller runs on the runner and tool instances of the first.

    That is what makes a program of three tools faster than three direct calls
    (bench/bench_delegate.py): none of its calls pays an instance's life.
    """
    registry, audit = kits_registry
    intent = {"intent": "add a note warm-1 saying hello", "kit": "notes"}
    registry.call("delegate", intent, NullChannel())
    before = len(audit.records)
    intent = {"intent": "add a note warm-2 saying hello", "kit": "notes"}
    assert registry.call("delegate", intent, NullChannel()).value["success"]
    guests = [r for r in audit.records[before:] if r.get("event") == "call" and "instances" in r]
    assert {r["skill"] for r in guests} == {"kit.notes", "notes"}
    assert len([r for r in guests if r["skill"] == "notes"]) == 3
    assert all(r["instances"] == "warm" and r["instance_call"] >= 2 for r in guests), guests
