"""Where audit records go: JSON lines through structlog, or memory for tests.

The structlog pipeline is private to each sink (``structlog.wrap_logger`` over
a ``WriteLogger``), so creating a sink never changes structlog's global
configuration or anyone else's logging.
"""

from __future__ import annotations

import copy
import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import structlog

from skilld.errors import AuditError
from skilld.paths import private_file


def _render(_logger: object, _name: str, event_dict: Mapping[str, Any]) -> str:
    try:
        return json.dumps(event_dict, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise AuditError(f"audit record is not JSON-ready: {exc}") from exc


class JsonLinesSink:
    """An :class:`~skilld.types.AuditSink` writing one JSON object per line, flushed.

    Give it a path (opened for appending, mode 0600, owned and closed by the sink) or
    an open text stream (left open). Thread-safe; usable as a context manager.
    """

    def __init__(self, target: str | Path | TextIO):
        """Open ``target``.

        Raises:
            AuditError: the file cannot be opened for appending.
        """
        self._owned: TextIO | None = None
        if isinstance(target, str | Path):
            # Private: created 0600, and a wider mode found is narrowed (and said). The
            # log names every call's skill, caller and outcome.
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
            try:
                fd = os.open(target, flags, 0o600)
            except OSError as exc:
                raise AuditError(
                    f"cannot open the audit log: {exc.strerror}", location=str(target)
                ) from exc
            private_file(fd, target, "audit log")
            self._owned = os.fdopen(fd, "a", encoding="utf-8")
            stream: TextIO = self._owned
            self.name = str(target)
        else:
            stream = target
            self.name = getattr(target, "name", "<stream>")
        self._stream = stream
        self._lock = threading.Lock()
        self._closed = False
        self._log = structlog.wrap_logger(
            structlog.WriteLogger(stream), processors=[_render], cache_logger_on_first_use=True
        )

    def emit(self, record: Mapping[str, Any]) -> None:
        """Write ``record`` as one line and flush it.

        Raises:
            AuditError: the sink is closed, the record is not JSON-ready, or the write failed.
        """
        fields = dict(record)
        event = fields.pop("event", "call")
        with self._lock:
            if self._closed:
                raise AuditError("the audit sink is closed", location=self.name)
            try:
                self._log.msg(event, **fields)
            except OSError as exc:
                raise AuditError(
                    f"cannot write the audit log: {exc.strerror or exc}", location=self.name
                ) from exc

    def close(self) -> None:
        """Close the file if the sink opened it; later emits fail."""
        with self._lock:
            self._closed = True
            if self._owned is not None:
                self._owned.close()

    def __enter__(self) -> JsonLinesSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MemorySink:
    """An :class:`~skilld.types.AuditSink` keeping records in a list (for tests)."""

    def __init__(self) -> None:
        """Start empty."""
        self.records: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def emit(self, record: Mapping[str, Any]) -> None:
        """Keep a deep copy of ``record``, after checking it is JSON-ready.

        Raises:
            AuditError: the record is not JSON-ready.
        """
        _render(None, "emit", record)
        with self._lock:
            self.records.append(copy.deepcopy(dict(record)))
