"""The registry's audit trail: every record goes to the sink through here.

Records are built by :class:`skilld.audit.CallRecorder` (one per call: ``started``,
``call``, or a ``call`` refused before any guest code ran); this module only sends them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from skilld.audit import CallRecorder
from skilld.types import AuditSink, Caller, CallOutput


class AuditTrail:
    """Where a registry's records go (``None``: nowhere)."""

    def __init__(self, sink: AuditSink | None):
        self._sink = sink

    def emit(self, record: dict[str, Any]) -> None:
        """Send one record to the sink, if there is one.

        Raises:
            AuditError: the sink could not record.
        """
        if self._sink is not None:
            self._sink.emit(record)

    def refused(
        self,
        skill: str,
        version: str | None,
        method: str,
        arguments: Mapping[str, Any],
        outcome: str,
        error: str,
        caller: Caller,
    ) -> None:
        """The record of a request ``caller`` made, refused before any guest code ran
        (``refused: true``).

        Raises:
            AuditError: the sink could not record.
        """
        if self._sink is None:
            return
        input_text = json.dumps(arguments, separators=(",", ":"), sort_keys=True, default=str)
        recorder = CallRecorder(skill, version, method, caller=caller, input=input_text)
        self._sink.emit(recorder.finish(outcome, error=error, refused=True))


def audited(out: object) -> Any:
    """The JSON value an audit record digests: a call's value, or each output's in turn."""
    if isinstance(out, CallOutput):
        return out.value
    if isinstance(out, list | tuple):
        return [audited(item) for item in out]
    return out
