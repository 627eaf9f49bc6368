"""Tasks (the ``io.modelcontextprotocol/tasks`` extension, SEP-2663): long calls polled by id.

A tool the operator marks as task-capable (``ServeConfig.task_tools``) answers a
2026-07-28 ``tools/call`` whose client declared the extension with a
``CreateTaskResult`` (``resultType: "task"``) instead of waiting: the call goes on in
the background exactly as an input-required call does (a :class:`ParkedCall`, one
audit record when it ends), and the client asks ``tasks/get`` for its status and, once
terminal, its inlined result; ``tasks/update`` carries ``inputResponses`` to the
questions a parked guest asked; ``tasks/cancel`` cancels it through the call's own
cancel path (the sandbox stops the guest; a native script's process tree is ended by
its executor). A task that ran but reported an error is ``completed`` with
``isError``; ``failed`` is kept for protocol-level failures (a crashed guest).

What is kept about a task is a :class:`TaskRecord` in a :class:`TaskStore`, for its
``ttlMs`` after it was created: :class:`MemoryTaskStore` here; a store every entry node
of a cluster shares (JetStream KV) is the cluster's to add. The running call itself
lives on the node that started it.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from mcp import types
from mcp.shared.exceptions import MCPError

from skilld.mcp._rounds import MISSING_REQUIRED_CLIENT_CAPABILITY, ParkedCall

TASKS = "io.modelcontextprotocol/tasks"
CAPABILITIES_META = "io.modelcontextprotocol/clientCapabilities"
TERMINAL = frozenset({"completed", "failed", "cancelled"})


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class TaskRecord:
    """What a client may learn of one task (the wire's ``Task``, plus its outcome)."""

    task_id: str
    tool: str
    status: str
    created_at: str
    updated_at: str
    ttl_ms: int
    poll_interval_ms: int
    expires: float
    result: Mapping[str, Any] | None = None
    error: Mapping[str, Any] | None = None
    message: str | None = None

    def wire(self) -> dict[str, Any]:
        """The ``Task`` fields."""
        out: dict[str, Any] = {
            "taskId": self.task_id,
            "status": self.status,
            "createdAt": self.created_at,
            "lastUpdatedAt": self.updated_at,
            "ttlMs": self.ttl_ms,
            "pollIntervalMs": self.poll_interval_ms,
        }
        if self.message:
            out["statusMessage"] = self.message
        return out


class TaskStore(Protocol):
    """Where task records live for their TTL; any entry node may answer from it.

    ``put`` must be durable before it returns: a ``tasks/get`` right after the
    ``CreateTaskResult`` must find the task.
    """

    def put(self, record: TaskRecord) -> None:
        """Store (or replace) ``record``."""
        ...

    def get(self, task_id: str) -> TaskRecord | None:
        """The record, or None when unknown or past its TTL."""
        ...


@dataclass
class MemoryTaskStore:
    """A :class:`TaskStore` in this process's memory (one node; lost on restart)."""

    clock: Callable[[], float] = time.monotonic
    _records: dict[str, TaskRecord] = field(default_factory=dict)

    def put(self, record: TaskRecord) -> None:
        """Store ``record``, dropping the ones past their TTL."""
        now = self.clock()
        for key in [k for k, r in self._records.items() if r.expires <= now]:
            del self._records[key]
        self._records[record.task_id] = record

    def get(self, task_id: str) -> TaskRecord | None:
        """The record while its TTL lasts."""
        record = self._records.get(task_id)
        if record is None or record.expires <= self.clock():
            return None
        return record


def declares_tasks(ctx_params: Mapping[str, Any] | None, connection_caps: Any) -> bool:
    """Whether this request's client declared the tasks extension (per request or session)."""
    meta = (ctx_params or {}).get("_meta")
    caps = meta.get(CAPABILITIES_META) if isinstance(meta, Mapping) else None
    extensions = caps.get("extensions") if isinstance(caps, Mapping) else None
    if isinstance(extensions, Mapping) and TASKS in extensions:
        return True
    declared = getattr(connection_caps, "extensions", None)
    return isinstance(declared, Mapping) and TASKS in declared


def tasks_required() -> MCPError:
    """``-32021``: the request needs the tasks extension its client did not declare."""
    return MCPError(
        MISSING_REQUIRED_CLIENT_CAPABILITY,
        f"declare the {TASKS} extension in the request's client capabilities to use tasks",
        data={"requiredCapabilities": {"extensions": {TASKS: {}}}},
    )


Outcome = Callable[[BaseException | None, Any], tuple[str, Mapping[str, Any] | None, Any]]
"""Maps a finished call (exception, result) to (status, error, result)."""


class Tasks:
    """The tasks of this node: records in a store, and the calls still running here."""

    def __init__(
        self, store: TaskStore, ttl_ms: int = 600_000, poll_interval_ms: int = 500
    ) -> None:
        self.store = store
        self.ttl_ms = ttl_ms
        self.poll_interval_ms = poll_interval_ms
        self._running: dict[str, ParkedCall[Any]] = {}
        self._finished: dict[str, asyncio.Event] = {}

    def create(self, tool: str, call: ParkedCall[Any], outcome: Outcome) -> TaskRecord:
        """Record a task for ``call`` (durably, before the client hears of it)."""
        now = _now()
        record = TaskRecord(
            task_id=f"task-{secrets.token_urlsafe(18)}",
            tool=tool,
            status="working",
            created_at=now,
            updated_at=now,
            ttl_ms=self.ttl_ms,
            poll_interval_ms=self.poll_interval_ms,
            expires=time.monotonic() + self.ttl_ms / 1000,
        )
        self.store.put(record)
        self._running[record.task_id] = call

        def ended(task: asyncio.Task[Any]) -> None:
            self._running.pop(record.task_id, None)
            current = self.store.get(record.task_id) or record
            if current.status == "cancelled":
                return
            exc = None if task.cancelled() else task.exception()
            value = None if exc is not None or task.cancelled() else task.result()
            status, error, result = outcome(exc, value)
            self.store.put(
                replace(current, status=status, error=error, result=result, updated_at=_now())
            )

        call.task.add_done_callback(ended)
        return record

    def get(self, task_id: str) -> dict[str, Any]:
        """The ``tasks/get`` answer: status, and the result, error or questions.

        Raises:
            MCPError: ``-32602`` for a task id this server does not know (or forgot).
        """
        record = self._record(task_id)
        body = {"resultType": "complete", **record.wire()}
        call = self._running.get(task_id)
        if record.status not in TERMINAL and call is not None and call.channel.pending:
            body["status"] = "input_required"
            body["inputRequests"] = {k: q.request() for k, q in call.channel.pending.items()}
        if record.status in TERMINAL:
            if record.error is not None:
                body["error"] = dict(record.error)
            elif record.result is not None:
                body["result"] = dict(record.result)
        return body

    def update(self, task_id: str, responses: Mapping[str, Any]) -> dict[str, Any]:
        """``tasks/update``: answers to the questions the task's guest waits on.

        Raises:
            MCPError: ``-32602`` for an unknown task.
        """
        self._record(task_id)
        call = self._running.get(task_id)
        if call is not None:
            call.channel.answer(responses)
        return {"resultType": "complete"}

    def cancel(self, task_id: str) -> dict[str, Any]:
        """``tasks/cancel``: the call is cancelled; the task reads ``cancelled`` from now on.

        Raises:
            MCPError: ``-32602`` for an unknown task.
        """
        record = self._record(task_id)
        if record.status in TERMINAL:
            return {"resultType": "complete"}
        self.store.put(replace(record, status="cancelled", updated_at=_now()))
        call = self._running.get(task_id)
        if call is not None:
            call.channel.cancel()
        return {"resultType": "complete"}

    def _record(self, task_id: str) -> TaskRecord:
        record = self.store.get(task_id)
        if record is None:
            raise MCPError(types.INVALID_PARAMS, f"unknown task: {task_id}")
        return record
