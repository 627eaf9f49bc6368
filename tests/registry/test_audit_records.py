"""Audit records are bounded (decisions past a cap are counted) and traceable (started records)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skilld.audit import CallRecorder, MemorySink
from skilld.errors import AuditError, DeadlineExceeded, GuestError, GuestTrap
from skilld.registry import NullChannel, Registry, SkillEntry
from skilld.sandbox import CallContext, Sandbox
from skilld.state import SqliteState
from skilld.types import MAX_AUDITED_DECISIONS, Caller, Decision, Limits
from support.checkers import TextQuestions


class AllowKv(TextQuestions):
    """A checker allowing the kv capability, deciding (and so recording) every access."""

    def check(self, capability: str, action: str, target: str) -> Decision:
        ok = capability == "kv"
        return Decision(ok, capability, action, target, "t.kv" if ok else "default-deny", "test")


class ClosedSink(MemorySink):
    """A sink whose started records fail, as a closed or broken audit log does."""

    def emit(self, record: object) -> None:
        if isinstance(record, dict) and record.get("event") == "started":
            raise AuditError("the audit sink is closed", location="test")
        super().emit(record)  # type: ignore[arg-type]


def _registry(
    sandbox: Sandbox,
    component_path: Callable[[str], Path],
    tmp_path: Path,
    sink: MemorySink,
    timeout_ms: int = 30_000,
) -> tuple[Registry, SqliteState]:
    state = SqliteState(tmp_path / "state.db")
    reg = Registry(audit=sink)
    for name in ("hostile", "echo"):
        comp = sandbox.load(component_path(name).read_bytes(), name=name)
        spec = comp.describe(CallContext(name, Limits(), NullChannel()))
        reg.add(
            SkillEntry(
                spec=spec,
                component=comp,
                kv=state.store(name),
                limits=Limits(timeout_ms=timeout_ms),
                checker=AllowKv() if name == "hostile" else None,
            )
        )
    reg.mark_ready()
    return reg, state


def test_a_record_lists_the_first_decisions_and_counts_the_rest(
    sandbox: Sandbox, component_path: Callable[[str], Path], tmp_path: Path
) -> None:
    """100 kv writes: 64 decisions in full, 36 counted under their rule; the line stays small."""
    sink = MemorySink()
    reg, _state = _registry(sandbox, component_path, tmp_path, sink)
    assert reg.call("hostile/write_keys", {"count": 100}, NullChannel()).value == 100
    started, record = sink.records
    assert len(record["decisions"]) == MAX_AUDITED_DECISIONS
    assert record["decisions_beyond_cap"] == {
        "count": 100 - MAX_AUDITED_DECISIONS,
        "by_rule": [
            {
                "capability": "kv",
                "action": "set",
                "allowed": True,
                "rule": "t.kv",
                "count": 100 - MAX_AUDITED_DECISIONS,
            }
        ],
    }
    assert len(json.dumps(record)) < 16_000
    assert started["event"] == "started" and started["call_id"] == record["call_id"]


def test_a_deadline_hit_writer_still_writes_a_bounded_record(
    sandbox: Sandbox, component_path: Callable[[str], Path], tmp_path: Path
) -> None:
    """A guest writing keys until its deadline (thousands of decisions) gets one bounded line."""
    sink = MemorySink()
    reg, _state = _registry(sandbox, component_path, tmp_path, sink, timeout_ms=1000)
    # Whichever sees the deadline first ends the call: the sandbox (a trap) or kv.set
    # (a `timeout` error the guest passes on).
    with pytest.raises((DeadlineExceeded, GuestError)):
        reg.call("hostile/write_keys", {"count": 10_000_000}, NullChannel())
    record = sink.records[-1]
    assert record["outcome"] in ("deadline", "error:timeout")
    assert record["decisions_beyond_cap"]["count"] > 0
    assert len(json.dumps(record)) < 16_000


def test_started_is_written_before_the_first_state_write_only(
    sandbox: Sandbox, component_path: Callable[[str], Path], tmp_path: Path
) -> None:
    """A state-writing call gets started + call records (one call_id); a read-only one only call."""
    sink = MemorySink()
    reg, _state = _registry(sandbox, component_path, tmp_path, sink)
    reg.call("hostile/write_keys", {"count": 3}, NullChannel())
    reg.call("echo/echo", {"text": "x"}, NullChannel())
    events = [(r["event"], r["skill"]) for r in sink.records]
    assert events == [("started", "hostile"), ("call", "hostile"), ("call", "echo")]
    first, second, third = sink.records
    assert first["call_id"] == second["call_id"] != third["call_id"]
    assert first["input_sha256"] == second["input_sha256"]


def test_no_state_write_without_its_started_record(
    sandbox: Sandbox, component_path: Callable[[str], Path], tmp_path: Path
) -> None:
    """When the started record cannot be written, the write is not made (fail closed)."""
    sink = ClosedSink()
    reg, state = _registry(sandbox, component_path, tmp_path, sink)
    with pytest.raises(GuestError, match=r"host error in kv\.set"):
        reg.call("hostile/write_keys", {"count": 3}, NullChannel())
    (record,) = sink.records
    assert record["host_faults"] and "AuditError" in record["host_faults"][0]
    assert state.store("hostile").keys("", 10) == []


def test_refusals_are_audited_as_calls_that_did_not_run(
    sandbox: Sandbox, component_path: Callable[[str], Path], tmp_path: Path
) -> None:
    """Registry.refused writes a call-shaped record: refused, its method, no output or decisions."""
    sink = MemorySink()
    reg, _state = _registry(sandbox, component_path, tmp_path, sink)
    reg.refused("echo", "echo/echo", {"text": 5}, "invalid-argument", "[invalid-argument] bad")
    (record,) = sink.records
    assert record["refused"] is True
    assert (record["skill"], record["method"], record["outcome"]) == (
        "echo",
        "echo",
        "invalid-argument",
    )
    assert record["output_sha256"] is None and record["decisions"] == []
    assert record["version"] == "0.1.0"


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["fs", "kv", "http"]),
            st.sampled_from(["read", "write", "get"]),
            st.booleans(),
            st.text(max_size=30),
        ),
        max_size=300,
    )
)
def test_recorders_keep_the_cap_and_lose_no_count(
    checks: list[tuple[str, str, bool, str]],
) -> None:
    """Whatever decisions come, a record lists at most the cap, and kept + counted = taken."""
    rec = CallRecorder("s", "1", "m", caller=Caller.local(), input={})
    ctx = CallContext("s", Limits(), NullChannel())
    for cap, action, ok, target in checks:
        decision = Decision(ok, cap, action, target, f"r.{cap}" if ok else "default-deny", "x")
        rec.record(decision)
        ctx.record(decision)
    record = rec.finish("ok")
    beyond = record.get("decisions_beyond_cap", {"count": 0, "by_rule": []})
    assert len(record["decisions"]) == min(len(checks), MAX_AUDITED_DECISIONS)
    assert len(record["decisions"]) + beyond["count"] == len(checks)
    assert sum(r["count"] for r in beyond["by_rule"]) == beyond["count"]
    assert len(ctx.decisions) == len(record["decisions"])
    assert sum(ctx.decisions_beyond.values()) == beyond["count"]


def test_a_traps_text_goes_to_the_audit_record_never_to_the_caller(
    sandbox: Sandbox, component_path: Callable[[str], Path], tmp_path: Path
) -> None:
    """A trap's own text (a panic message, stderr) is in error_detail, not in the caller's error."""
    sink = MemorySink()
    reg, _state = _registry(sandbox, component_path, tmp_path, sink)
    with pytest.raises(GuestTrap) as trapped:
        reg.call("hostile/trap", {}, NullChannel())
    assert "unreachable" not in str(trapped.value)
    record = sink.records[-1]
    assert record["outcome"] == "fault" and "unreachable" not in record["error"]
    assert "unreachable" in record["error_detail"]
