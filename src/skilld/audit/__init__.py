"""Audit records and sinks: one JSON line per call, with every permission decision.

A record holds the skill id and version, method, caller, sha256 of the input and
of the output, start time, duration, limits hit, outcome, error and every
:class:`~skilld.types.Decision` (with its rule id) taken during the call.
:class:`CallRecorder` builds it; :class:`JsonLinesSink` writes it through a
private structlog pipeline; :class:`MemorySink` keeps it for tests.
"""

from __future__ import annotations

from skilld.audit._record import MAX_HOST_FAULTS, RECORD_KEYS, CallRecorder, digest
from skilld.audit._sinks import JsonLinesSink, MemorySink

__all__ = [
    "MAX_HOST_FAULTS",
    "RECORD_KEYS",
    "CallRecorder",
    "JsonLinesSink",
    "MemorySink",
    "digest",
]
