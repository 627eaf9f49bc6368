"""One audit record per call, built while the call runs.

:class:`CallRecorder` is the one builder of every record skilld writes about a call:
the ``call`` record (a guest ran, or a request was refused before it could), and the
``started`` record that goes out before a call's first state write.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from typing import Any

from skilld.types import (
    MAX_AUDITED_DECISIONS,
    AuditSink,
    Caller,
    Decision,
    DecisionKey,
    decision_key,
    decisions_beyond,
)

# Keys every call record has.
RECORD_KEYS = (
    "event",
    "call_id",
    "skill",
    "version",
    "method",
    "caller",
    "principal",
    "depth",
    "input_sha256",
    "output_sha256",
    "start",
    "duration_ms",
    "outcome",
    "limits_hit",
    "error",
    "decisions",
)

# Outcomes that name the limit the call reached (listed under ``limits_hit``).
_LIMIT_OUTCOMES = frozenset({"deadline", "memory", "stack", "busy"})
# Host faults one call keeps for its record: a guest may retry a failing call in a loop.
MAX_HOST_FAULTS = 16


def digest(value: Any) -> str:
    """sha256 hex of bytes, of a string's UTF-8, or of a value's canonical JSON."""
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
    elif isinstance(value, str):
        data = value.encode()
    else:
        data = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(data).hexdigest()


class CallRecorder:
    """Collects one call's decisions and limits, then yields its audit record.

    ::

        rec = CallRecorder("notes", "0.1.0", "add", caller=Caller.local(), input=args_json)
        rec.record(checker.check_path(path))
        sink.emit(rec.finish("ok", output=result))
    """

    def __init__(
        self,
        skill: str,
        version: str | None,
        method: str,
        *,
        caller: Caller,
        input: Any,  # noqa: A002 - the record's field is called input
        depth: int = 0,
        target: str | None = None,
        clock: Callable[[], float] = time.time,
        timer: Callable[[], float] = time.perf_counter,
    ):
        """Start the call now; ``input`` is hashed, never stored.

        ``target`` names what a resource read or a prompt was about (its URI or name).
        The record names the ``caller`` (``caller``: its label, e.g.
        ``skill:notes<token:alice``) and the principal behind it (``principal``: its key).
        """
        self.skill, self.version, self.method = skill, version, method
        self.caller, self.depth, self.target = caller, depth, target
        # Joins a call's ``started`` and ``call`` records (64 random bits).
        self.call_id = os.urandom(8).hex()
        self.input_sha256 = digest(input)
        self.decisions: list[Decision] = []
        self.decisions_beyond: dict[DecisionKey, int] = {}
        self.limits_hit: list[str] = []
        self.host_faults: list[str] = []
        # Facts a backend adds (a script's exit status, its executor); JSON values under
        # names the record does not already use.
        self.facts: dict[str, Any] = {}
        self._timer = timer
        self.start = clock()
        self._t0 = timer()

    def record(self, decision: Decision) -> Decision:
        """Keep a permission decision (past the cap, count it); returns it.

        Returning it lets a check be wrapped inline.
        """
        if len(self.decisions) < MAX_AUDITED_DECISIONS:
            self.decisions.append(decision)
        else:
            key = decision_key(decision)
            self.decisions_beyond[key] = self.decisions_beyond.get(key, 0) + 1
        return decision

    def limit_hit(self, name: str) -> None:
        """Note that a limit (``deadline``, ``memory``, ``output``, ...) was reached."""
        if name not in self.limits_hit:
            self.limits_hit.append(name)

    def host_fault(self, text: str) -> None:
        """Note a host function's own failure (a host bug), up to :data:`MAX_HOST_FAULTS`."""
        if len(self.host_faults) < MAX_HOST_FAULTS:
            self.host_faults.append(text[:500])

    def _head(self, event: str) -> dict[str, Any]:
        """What every record of this call says first."""
        return {
            "event": event,
            "call_id": self.call_id,
            "skill": self.skill,
            "version": self.version,
            "method": self.method,
            "caller": self.caller.label(),
            "principal": self.caller.key,
            "depth": self.depth,
            "input_sha256": self.input_sha256,
            "start": self.start,
        }

    def started(self) -> dict[str, Any]:
        """The ``started`` record of a call about to write state (its ``call`` record follows)."""
        record = self._head("started")
        if self.target is not None:
            record["target"] = self.target
        return record

    def finish(
        self,
        outcome: str,
        *,
        output: Any = None,
        error: BaseException | str | None = None,
        refused: bool = False,
    ) -> dict[str, Any]:
        """The finished record (``outcome``: ``ok``, ``error:<code>``, ``deadline``...).

        An outcome that names a limit (``deadline``, ``memory``, ``stack``, ``busy``) is
        listed under ``limits_hit``. Past :data:`~skilld.types.MAX_AUDITED_DECISIONS`
        decisions, the rest are summarised under ``decisions_beyond_cap`` (a count per
        rule). ``refused`` marks a request refused before any guest code ran.
        """
        if outcome in _LIMIT_OUTCOMES:
            self.limit_hit(outcome)
        record = self._head("call")
        record |= {
            "output_sha256": None if output is None else digest(output),
            "duration_ms": round((self._timer() - self._t0) * 1000, 3),
            "outcome": outcome,
            "limits_hit": list(self.limits_hit),
            "error": None if error is None else str(error),
            "decisions": [d.as_dict() for d in self.decisions],
        }
        if self.decisions_beyond:
            record["decisions_beyond_cap"] = decisions_beyond(self.decisions_beyond)
        if self.target is not None:
            record["target"] = self.target
        detail = getattr(error, "detail", None)
        if detail:
            record["error_detail"] = detail
        if self.host_faults:
            record["host_faults"] = list(self.host_faults)
        if refused:
            record["refused"] = True
        for key, value in self.facts.items():
            record.setdefault(key, value)
        return record

    def emit(
        self,
        sink: AuditSink,
        outcome: str,
        *,
        output: Any = None,
        error: BaseException | str | None = None,
    ) -> dict[str, Any]:
        """Finish and send the record to ``sink``; returns it.

        Raises:
            AuditError: the sink could not record.
        """
        record = self.finish(outcome, output=output, error=error)
        sink.emit(record)
        return record
