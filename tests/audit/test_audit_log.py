"""Audit: one flushed JSON line per call with every decision; recorder and memory sink."""

from __future__ import annotations

import hashlib
import io
import json
import threading
from pathlib import Path

import pytest
import structlog

from skilld.audit import RECORD_KEYS, CallRecorder, JsonLinesSink, MemorySink, digest
from skilld.errors import AuditError
from skilld.types import AuditSink, Caller, Decision

ALLOW = Decision(True, "fs", "read", "/data/a", "notes.fs[0]", "under /data")
DENY = Decision(False, "http", "GET", "http://10.0.0.1/", "default-deny", "private address")


def test_sinks_are_audit_sinks(tmp_path: Path) -> None:
    """Both sinks satisfy the AuditSink protocol the registry uses."""
    with JsonLinesSink(tmp_path / "a.log") as sink:
        assert isinstance(sink, AuditSink)
    assert isinstance(MemorySink(), AuditSink)


def test_one_json_line_per_call_with_decisions(tmp_path: Path) -> None:
    """Each call becomes exactly one line holding the record and its decisions."""
    path = tmp_path / "audit.log"
    with JsonLinesSink(path) as sink:
        for i in range(3):
            rec = CallRecorder("notes", "0.1.0", "add", caller=Caller.local(), input=f'{{"i":{i}}}')
            rec.record(ALLOW)
            rec.record(DENY)
            rec.limit_hit("output")
            rec.emit(sink, "ok", output={"id": i})
        # Flushed per record: visible before the sink closes.
        lines = path.read_text().splitlines()
    assert len(lines) == 3
    first = json.loads(lines[0])
    assert set(RECORD_KEYS) <= set(first)
    assert first["event"] == "call" and first["skill"] == "notes" and first["version"] == "0.1.0"
    assert first["input_sha256"] == hashlib.sha256(b'{"i":0}').hexdigest()
    assert first["output_sha256"] == digest({"id": 0})
    assert first["limits_hit"] == ["output"]
    assert [d["rule"] for d in first["decisions"]] == ["notes.fs[0]", "default-deny"]
    assert first["decisions"][1]["allowed"] is False


def test_stream_target_is_left_open() -> None:
    """A sink over a stream writes lines to it and does not close it."""
    stream = io.StringIO()
    sink = JsonLinesSink(stream)
    sink.emit({"event": "call", "skill": "echo", "decisions": []})
    sink.close()
    assert json.loads(stream.getvalue()) == {"event": "call", "skill": "echo", "decisions": []}
    assert not stream.closed


def test_emit_after_close_and_bad_records_fail(tmp_path: Path) -> None:
    """A closed sink and a record that is not JSON-ready raise AuditError."""
    sink = JsonLinesSink(tmp_path / "a.log")
    with pytest.raises(AuditError):
        sink.emit({"skill": object()})
    sink.close()
    with pytest.raises(AuditError):
        sink.emit({"skill": "x"})
    with pytest.raises(AuditError):
        MemorySink().emit({"x": {1, 2}})


def test_unwritable_path_is_an_audit_error(tmp_path: Path) -> None:
    """Opening a log in a missing directory fails as AuditError naming the path."""
    with pytest.raises(AuditError) as info:
        JsonLinesSink(tmp_path / "missing" / "a.log")
    assert "missing" in str(info.value)


def test_sink_leaves_global_structlog_alone(tmp_path: Path) -> None:
    """Creating and using a sink does not change structlog's global configuration."""
    before = structlog.get_config()
    with JsonLinesSink(tmp_path / "a.log") as sink:
        sink.emit({"skill": "x"})
    assert structlog.get_config() == before


def test_concurrent_emits_do_not_interleave(tmp_path: Path) -> None:
    """Records from many threads come out as whole lines."""
    path = tmp_path / "a.log"
    with JsonLinesSink(path) as sink:

        def work(n: int) -> None:
            for i in range(50):
                sink.emit({"skill": f"s{n}", "i": i, "pad": "x" * 500})

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    lines = path.read_text().splitlines()
    assert len(lines) == 400
    assert all(json.loads(line)["pad"] == "x" * 500 for line in lines)


def test_recorder_timing_with_fake_clocks() -> None:
    """start comes from the wall clock, duration from the monotonic timer."""
    ticks = iter([10.0, 10.25])
    rec = CallRecorder(
        "echo",
        "1",
        "echo",
        caller=Caller.local().as_skill("notes"),
        input=b"x",
        depth=1,
        clock=lambda: 1700000000.0,
        timer=lambda: next(ticks),
    )
    record = rec.finish("error", error=ValueError("boom"))
    assert record["start"] == 1700000000.0 and record["duration_ms"] == 250.0
    assert record["error"] == "boom" and record["output_sha256"] is None
    assert record["depth"] == 1 and record["caller"] == "skill:notes<local:stdio"
    assert record["principal"] == "local"


def test_memory_sink_keeps_copies() -> None:
    """MemorySink keeps a copy, so later mutation of the record does not change history."""
    sink = MemorySink()
    record = {"skill": "a", "decisions": [ALLOW.as_dict()]}
    sink.emit(record)
    record["decisions"].append(DENY.as_dict())
    assert len(sink.records[0]["decisions"]) == 1
