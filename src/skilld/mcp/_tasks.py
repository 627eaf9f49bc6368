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
``ttlMs`` after it was created: :class:`MemoryTaskStore` on a node of its own, or
:class:`BoardTaskStore` over a cluster's :class:`TaskBoard` (JetStream KV, written by
``skilld.cluster``), so that any entry node answers ``tasks/get``. The running call
itself lives on the node that started it, its *owner*: another entry node carries
``tasks/cancel`` and ``tasks/update`` to it through the board, and reads the questions a
parked guest asked from the record the owner keeps current.

Each task is audited as it goes (``event: task``: ``created``, then its terminal
status, and ``cancel-requested`` with the node a cancel came through), beside the one
record its call makes; each status change is published to the listeners of
:meth:`Tasks.watch` (the ``notifications/tasks/status`` of ``subscriptions/listen``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol, cast, runtime_checkable

import anyio
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.subscriptions import SUBSCRIPTION_ID_META_KEY, ListenHandler
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel

from skilld import telemetry
from skilld.errors import SkilldError
from skilld.mcp._caller import caller_of
from skilld.mcp._config import ServeConfig
from skilld.mcp._content import error_result, error_text
from skilld.mcp._rounds import (
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    ParkedCall,
    ParkedCalls,
    RoundChannel,
    forward_elsewhere,
    plain,
    resume,
)
from skilld.registry import Dispatcher
from skilld.types import Caller

Ctx = ServerRequestContext[Any, Any]

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
    expires: float  # wall-clock seconds: the same on every node of a cluster
    result: Mapping[str, Any] | None = None
    error: Mapping[str, Any] | None = None
    message: str | None = None
    owner: str = ""  # the node the call runs on
    client: str = ""  # who made it (its caller's ``Caller.key``): only they are answered
    input_requests: Mapping[str, Any] | None = None  # what its guest waits on, if anything
    # The trace context of the request that created it: every tasks/* request about it,
    # on whichever entry node, links to it.
    trace: Mapping[str, str] | None = None

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
    ``CreateTaskResult`` must find the task. A store shared by several nodes is also a
    :class:`SharedTaskStore` (see :class:`BoardTaskStore`).
    """

    def put(self, record: TaskRecord) -> None:
        """Store (or replace) ``record``."""
        ...

    def get(self, task_id: str) -> TaskRecord | None:
        """The record, or None when unknown or past its TTL."""
        ...


@runtime_checkable
class SharedTaskStore(TaskStore, Protocol):
    """A store several entry nodes share: it carries an operation to a task's owner."""

    def ask(self, owner: str, task_id: str, op: str, body: Mapping[str, Any]) -> None:
        """Send ``op`` (``cancel``, ``update``) for ``task_id`` to the node ``owner``."""
        ...


@runtime_checkable
class AuditEmitter(Protocol):
    """A dispatcher that writes extra audit records (``Registry.emit_audit``)."""

    def emit_audit(self, record: dict[str, Any]) -> None:
        """Write ``record`` to the audit sink."""
        ...


@dataclass
class MemoryTaskStore:
    """A :class:`TaskStore` in this process's memory (one node; lost on restart)."""

    clock: Callable[[], float] = time.time
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


class TaskBoard(Protocol):
    """Task records shared by a cluster's entry nodes (``skilld.cluster.TaskBoard``).

    Records are plain JSON objects; each is the owner's, signed by it, and ``get`` returns
    only a record its owner signed (with ``owner`` set). ``ask`` sends ``cancel`` or
    ``update`` to the owner of a task; ``listen`` hears those sent to this node.
    """

    node: str

    def put(self, task_id: str, record: Mapping[str, Any]) -> None:
        """Store this node's record of ``task_id``."""
        ...

    def get(self, task_id: str) -> dict[str, Any] | None:
        """A task's record (``owner`` included), or None."""
        ...

    def ask(self, owner: str, task_id: str, op: str, body: Mapping[str, Any]) -> None:
        """Send ``op`` for ``task_id`` to its owner."""
        ...

    def listen(self, on_request: Callable[[str, str, dict[str, Any]], None]) -> None:
        """Hear the requests for this node's tasks (any thread)."""
        ...

    def follow(
        self,
        on_record: Callable[[str, dict[str, Any]], None],
        on_failed: Callable[[str, dict[str, Any]], None],
    ) -> None:
        """Hear every record as it changes, and each task this node marked failed because
        its owner went (any thread)."""
        ...


_FIELDS = (
    "task_id",
    "tool",
    "status",
    "created_at",
    "updated_at",
    "ttl_ms",
    "poll_interval_ms",
    "result",
    "error",
    "message",
    "input_requests",
    "expires",
    "client",
    "trace",
)


@dataclass
class BoardTaskStore:
    """A :class:`TaskStore` on a cluster's :class:`TaskBoard`.

    A record is answered while its ``expires`` (wall-clock seconds: they mean the same on
    every node) lasts.
    """

    board: TaskBoard
    clock: Callable[[], float] = time.time

    def put(self, record: TaskRecord) -> None:
        """Store ``record`` as this node's (durable in JetStream on return)."""
        self.board.put(record.task_id, {k: getattr(record, k) for k in _FIELDS})

    def get(self, task_id: str) -> TaskRecord | None:
        """The record while its TTL lasts, when its owner signed it."""
        raw = self.board.get(task_id)
        record = None if raw is None else record_of(raw)
        return record if record is not None and float(record.expires) > self.clock() else None

    def ask(self, owner: str, task_id: str, op: str, body: Mapping[str, Any]) -> None:
        """Send ``op`` for ``task_id`` to the node it runs on."""
        self.board.ask(owner, task_id, op, body)


def record_of(raw: Mapping[str, Any]) -> TaskRecord | None:
    """A board's record (``owner`` included) as a :class:`TaskRecord`; None if malformed."""
    try:
        fields = {k: raw[k] for k in _FIELDS if k in raw}
        return TaskRecord(**fields, owner=str(raw["owner"]))
    except (KeyError, TypeError, ValueError):
        return None


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


def task_outcome(
    exc: BaseException | None, value: Any
) -> tuple[str, Mapping[str, Any] | None, Any]:
    """A finished task call: (status, error, result) as ``tasks/get`` reports them.

    A guest that reported an error ran: ``completed`` with ``isError``; a guest that
    crashed, or a failure below the seam, is ``failed`` with a JSON-RPC error.
    """
    dump: Callable[[types.CallToolResult], Any] = lambda r: r.model_dump(  # noqa: E731
        by_alias=True, mode="json", exclude_none=True
    )
    if exc is None:
        return "completed", None, dump(value)
    if isinstance(exc, SkilldError):
        code, _rule, text = error_text(exc)
        if code == "cancelled":
            return "cancelled", None, None
        if code not in ("internal", "fault"):
            return "completed", None, dump(error_result(text))
        return "failed", {"code": types.INTERNAL_ERROR, "message": text}, None
    return "failed", {"code": types.INTERNAL_ERROR, "message": "the call failed unexpectedly"}, None


Audit = Callable[[dict[str, Any]], None]


class Tasks:
    """The tasks of this node: records in a store, and the calls still running here.

    Args:
        store: where records live (shared by a cluster's entry nodes, or this node's).
        ttl_ms: how long a task's record is kept after it was created.
        poll_interval_ms: the interval clients are told to poll at.
        node: this node's name, the owner recorded in the tasks it creates.
        audit: where the task's lifecycle records go (``None``: nowhere).
        max_per_client: how many tasks one client may have running here at once.
        max_tasks: how many tasks may run here at once, all clients together.
        max_results_per_client: how many of one client's tasks this node keeps, running
            or finished (a finished task's result is kept for its TTL).
        result_bytes_per_client: how many bytes of one client's finished results (their
            JSON) this node keeps; a result that would go beyond is not kept: its task
            ends ``failed`` naming the cap, and only that client's task is affected.
    """

    def __init__(
        self,
        store: TaskStore,
        ttl_ms: int = 600_000,
        poll_interval_ms: int = 500,
        node: str = "",
        audit: Audit | None = None,
        max_per_client: int = 16,
        max_tasks: int = 256,
        max_results_per_client: int = 64,
        result_bytes_per_client: int = 32 << 20,
    ) -> None:
        self.store = store
        self.max_per_client = max_per_client
        self.max_tasks = max_tasks
        self.max_results_per_client = max_results_per_client
        self.result_bytes_per_client = result_bytes_per_client
        # Finished tasks of each client whose records this node keeps: task -> (expires,
        # bytes of its result). Counted per Caller.key so one caller's results never take
        # the room of another's (issue #28: 600 results of 0.5 MiB took 300 MiB).
        self._kept: dict[str, dict[str, tuple[float, int]]] = {}
        self._client_of: dict[str, str] = {}  # running task -> its client
        self.ttl_ms = ttl_ms
        self.poll_interval_ms = poll_interval_ms
        self.node = node
        self._audit = audit
        self._running: dict[str, ParkedCall[Any]] = {}
        self._watchers: list[Callable[[dict[str, Any]], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._followers: set[asyncio.Task[None]] = set()
        # The last status told to listeners of each task another node owns (follow_board).
        self._told: dict[str, tuple[str, float]] = {}
        # Unfinished tasks other entry nodes run: task -> (client, expires).
        self._elsewhere: dict[str, tuple[str, float]] = {}

    def watch(self, listener: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
        """Hear each status change of this node's tasks (the ``Task`` fields and ``client``,
        on the loop); returns what stops it."""
        self._watchers.append(listener)

        def stop() -> None:
            with contextlib.suppress(ValueError):
                self._watchers.remove(listener)

        return stop

    def serve_requests(self, board: TaskBoard) -> None:
        """Apply the ``cancel``/``update`` requests other entry nodes send for our tasks."""

        def heard(task_id: str, op: str, body: dict[str, Any]) -> None:
            loop = self._loop
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(self._apply, task_id, op, body)

        board.listen(heard)

    def follow_board(self, board: TaskBoard) -> None:
        """Tell this node's listeners of status changes of tasks other entry nodes own
        (their records, seen changing on the board: a listen stream on any entry node hears
        any task of its client), and audit the tasks this node marked failed because their
        owner went. Called on the loop."""
        self._loop = asyncio.get_running_loop()
        loop = self._loop

        def later(act: Callable[[TaskRecord], None]) -> Callable[[str, dict[str, Any]], None]:
            def heard(_task_id: str, raw: dict[str, Any]) -> None:
                record = record_of(raw)
                if record is not None and not loop.is_closed():
                    loop.call_soon_threadsafe(act, record)

            return heard

        board.follow(later(self._seen), later(self._marked_failed))

    def _seen(self, record: TaskRecord) -> None:
        """A record changed on the board: its status, once per change, to our listeners,
        unless this node runs it (its own changes are told as they happen, see _emit)."""
        if record.owner == self.node or record.expires <= time.time():
            return
        # the client's tasks running on other entry nodes count towards its cap here
        if record.status in TERMINAL:
            self._elsewhere.pop(record.task_id, None)
        else:
            self._elsewhere[record.task_id] = (record.client, record.expires)
        told = self._told.get(record.task_id)
        if told is not None and told[0] == record.status:
            return
        if len(self._told) >= 4096:
            now = time.time()
            for gone in [t for t, (_s, expires) in self._told.items() if expires <= now]:
                del self._told[gone]
                self._elsewhere.pop(gone, None)
        self._told[record.task_id] = (record.status, record.expires)
        for listener in list(self._watchers):
            listener({**record.wire(), "client": record.client})

    def _marked_failed(self, record: TaskRecord) -> None:
        self._audit_event("failed", record, by=self.node, reason=record.message)

    def _apply(self, task_id: str, op: str, body: dict[str, Any]) -> None:
        if task_id not in self._running:
            return  # over, or never ours: nothing runs here to act on
        by = str(body.get("by", "?"))[:64]
        if op == "cancel":
            self.cancel(task_id, by=by)
        elif op == "update" and isinstance(body.get("responses"), dict):
            self._answer(self._running[task_id], body["responses"])

    def admit(self, client: str = "") -> None:
        """Refuse a new task beyond the caps: the client's unfinished tasks on any entry node
        of the cluster (other nodes' as the board shows them), and this node's running
        tasks. The 2025-11-25 tasks text says receivers SHOULD limit concurrent tasks per
        requestor and assigns no code: the internal-error code, the limit in ``data``.

        Raises:
            MCPError: ``-32603`` when ``client`` or this node already runs its maximum.
        """
        now = time.time()
        mine = sum(1 for c in self._client_of.values() if c == client) + sum(
            1 for c, expires in self._elsewhere.values() if c == client and expires > now
        )
        if mine >= self.max_per_client:
            scope, limit = "client", self.max_per_client
        elif len(self._running) >= self.max_tasks:
            scope, limit = "node", self.max_tasks
        elif mine + len(self._kept_of(client, now)) >= self.max_results_per_client:
            limit = self.max_results_per_client
            raise MCPError(
                types.INTERNAL_ERROR,
                f"too many tasks: this client has {limit} tasks kept here, running or "
                f"finished (max_task_results_per_client); a finished task's result is kept "
                f"for its TTL ({self.ttl_ms} ms): wait for the oldest to expire",
                data={"limit": limit, "scope": "client-results"},
            )
        else:
            return
        who = "this client has" if scope == "client" else "this server has"
        raise MCPError(
            types.INTERNAL_ERROR,
            f"too many tasks: {who} {limit} running; wait for one to end, or cancel one",
            data={"limit": limit, "scope": scope},
        )

    def _kept_of(self, client: str, now: float) -> dict[str, tuple[float, int]]:
        """``client``'s finished tasks still kept (those past their TTL forgotten)."""
        kept = self._kept.get(client, {})
        for task_id in [t for t, (expires, _) in kept.items() if expires <= now]:
            del kept[task_id]
        if not kept:
            self._kept.pop(client, None)
        return kept

    def _keep(self, record: TaskRecord) -> TaskRecord:
        """Count ``record``'s result against its client's bytes, or, beyond the cap, the
        record without it (``failed`` naming the cap)."""
        size = 0 if record.result is None else len(json.dumps(record.result, default=str))
        kept = self._kept_of(record.client, time.time())
        held = sum(b for _, b in kept.values())
        if size and held + size > self.result_bytes_per_client:
            record = replace(
                record,
                status="failed",
                result=None,
                error={
                    "code": types.INTERNAL_ERROR,
                    "message": f"the task's result ({size} bytes) was not kept: this "
                    f"client's finished results here hold {held} of "
                    f"{self.result_bytes_per_client} bytes (max_task_result_bytes_per_client);"
                    f" they are freed as their TTL ({self.ttl_ms} ms) ends",
                    "data": {"limit": self.result_bytes_per_client, "scope": "client-results"},
                },
            )
            size = 0
        self._kept.setdefault(record.client, {})[record.task_id] = (record.expires, size)
        return record

    def create(
        self, tool: str, call: ParkedCall[Any], outcome: Outcome, client: str = ""
    ) -> TaskRecord:
        """Record a task for ``call`` made by ``client`` (durably, before it hears of it).

        Raises:
            MCPError: ``-32603`` beyond the caps (see :meth:`admit`); the call is cancelled.
            SkilldError: the store did not take the record; the call is cancelled.
        """
        try:
            self.admit(client)
        except MCPError:
            call.channel.cancel()
            raise
        self._loop = asyncio.get_running_loop()
        now = _now()
        record = TaskRecord(
            task_id=f"task-{secrets.token_urlsafe(18)}",
            tool=tool,
            status="working",
            created_at=now,
            updated_at=now,
            ttl_ms=self.ttl_ms,
            poll_interval_ms=self.poll_interval_ms,
            expires=time.time() + self.ttl_ms / 1000,
            owner=self.node,
            client=client,
            trace=telemetry.carrier() or None,
        )
        try:
            self.store.put(record)
        except SkilldError:
            call.channel.cancel()  # nobody could ever ask for it
            raise
        self._running[record.task_id] = call
        self._client_of[record.task_id] = client
        self._emit("created", record)
        if hasattr(self.store, "ask"):
            # Other entry nodes read the questions from the record: keep it current.
            follower = self._loop.create_task(self._follow(record.task_id, call))
            self._followers.add(follower)
            follower.add_done_callback(self._followers.discard)

        def ended(task: asyncio.Task[Any]) -> None:
            self._running.pop(record.task_id, None)
            self._client_of.pop(record.task_id, None)
            current = self.store.get(record.task_id) or record
            if current.status == "cancelled":
                self._emit("cancelled", current)
                return
            exc = None if task.cancelled() else task.exception()
            value = None if exc is not None or task.cancelled() else task.result()
            status, error, result = outcome(exc, value)
            done = self._keep(
                replace(
                    current,
                    status=status,
                    error=error,
                    result=result,
                    input_requests=None,
                    updated_at=_now(),
                )
            )
            try:
                self.store.put(done)
            except SkilldError as exc:  # the record stays as it was until its TTL
                logging.getLogger("skilld.mcp").warning("task %s: %s", record.task_id, exc)
            self._emit(done.status, done)  # failed when its result was beyond the cap

        call.task.add_done_callback(ended)
        return record

    async def _follow(self, task_id: str, call: ParkedCall[Any]) -> None:
        """Keep the shared record's ``input_required`` and questions in step with the guest."""
        asked: Mapping[str, Any] | None = None
        while not call.task.done():
            await call.changed.wait()
            call.changed.clear()
            pending = {k: q.request() for k, q in call.channel.pending.items()} or None
            current = self.store.get(task_id)
            if pending == asked or call.task.done() or current is None:
                continue
            if current.status in TERMINAL:
                return
            status = "input_required" if pending else "working"
            changed = replace(current, status=status, input_requests=pending, updated_at=_now())
            try:
                self.store.put(changed)
            except SkilldError as exc:  # the next change tries again
                logging.getLogger("skilld.mcp").warning("task %s: %s", task_id, exc)
                continue
            asked = pending
            self._emit(status, changed)

    def _emit(self, status: str, record: TaskRecord, by: str | None = None) -> None:
        # ``created`` is the audit's word; the wire says the task's status (``working``).
        wire = record.status if status == "created" else status
        if status != "cancel-requested":
            for listener in list(self._watchers):
                listener({**record.wire(), "status": wire, "client": record.client})
        self._audit_event(status, record, by=by)

    def _audit_event(
        self, status: str, record: TaskRecord, by: str | None = None, reason: str | None = None
    ) -> None:
        if self._audit is None:
            return
        event = {
            "event": "task",
            "task": record.task_id,
            "tool": record.tool,
            "status": status,
            "node": self.node or None,
            "owner": record.owner or None,
            "start": time.time(),
        }
        if by is not None:
            event["by"] = by
        if reason is not None:
            event["reason"] = reason
        try:
            self._audit(event)
        except SkilldError as exc:  # the task goes on; the trouble is logged
            logging.getLogger("skilld.mcp").warning("task audit failed: %s", exc)

    def get(self, task_id: str, client: str | None = None) -> dict[str, Any]:
        """The ``tasks/get`` answer: status, and the result, error or questions.

        Raises:
            MCPError: ``-32602`` for a task id this server does not know (or forgot), or
                one another client made.
        """
        record = self._record(task_id, client)
        body = {"resultType": "complete", **record.wire()}
        call = self._running.get(task_id)
        if record.status not in TERMINAL and call is not None and call.channel.pending:
            body["status"] = "input_required"
            body["inputRequests"] = {k: q.request() for k, q in call.channel.pending.items()}
        elif record.status not in TERMINAL and call is None and record.input_requests:
            # Another entry node runs it: the questions its owner recorded.
            body["status"] = "input_required"
            body["inputRequests"] = dict(record.input_requests)
        elif record.status == "input_required":
            body["status"] = "working"
        if record.status in TERMINAL:
            if record.error is not None:
                body["error"] = dict(record.error)
            elif record.result is not None:
                body["result"] = dict(record.result)
        return body

    def update(
        self, task_id: str, responses: Mapping[str, Any], client: str | None = None
    ) -> dict[str, Any]:
        """``tasks/update``: answers to the questions the task's guest waits on.

        Raises:
            MCPError: ``-32602`` for an unknown task (or another client's).
        """
        record = self._record(task_id, client)
        call = self._running.get(task_id)
        if call is not None:
            self._answer(call, responses)
        elif record.status not in TERMINAL:
            self._forward(record, "update", {"responses": dict(responses)})
        return {"resultType": "complete"}

    def cancel(
        self, task_id: str, by: str | None = None, client: str | None = None
    ) -> dict[str, Any]:
        """``tasks/cancel``: the call is cancelled; the task reads ``cancelled`` from now on
        (at once here; once its owner heard of it when another entry node runs it).

        Raises:
            MCPError: ``-32602`` for an unknown task (or another client's).
        """
        record = self._record(task_id, client)
        if record.status in TERMINAL:
            return {"resultType": "complete"}
        call = self._running.get(task_id)
        self._emit("cancel-requested", record, by=by or self.node or "client")
        if call is None:
            self._forward(record, "cancel", {})
            return {"resultType": "complete"}
        self.store.put(replace(record, status="cancelled", input_requests=None, updated_at=_now()))
        call.channel.cancel()
        return {"resultType": "complete"}

    @staticmethod
    def _answer(call: ParkedCall[Any], responses: Mapping[str, Any]) -> None:
        call.channel.answer(responses)
        # The shared record follows: its questions are answered (see _follow).
        call.changed.set()

    def pending_elsewhere(self, task_id: str) -> bool:
        """Whether ``task_id`` runs on another node and is not over (a cancel sent there
        may not have been applied yet)."""
        record = self.store.get(task_id)
        return record is not None and record.status not in TERMINAL and task_id not in self._running

    def _forward(self, record: TaskRecord, op: str, body: Mapping[str, Any]) -> None:
        """Carry ``op`` to the node the task runs on.

        Raises:
            MCPError: ``-32603`` when no other node can be reached for it.
        """
        store = self.store
        if not isinstance(store, SharedTaskStore) or not record.owner or record.owner == self.node:
            # Ours but no longer running (this node restarted): nothing can act on it.
            return
        try:
            store.ask(record.owner, record.task_id, op, {**body, "by": self.node})
        except SkilldError as exc:
            raise MCPError(
                types.INTERNAL_ERROR, f"the node running task {record.task_id} is unreachable"
            ) from exc

    def _record(self, task_id: str, client: str | None = None) -> TaskRecord:
        record = self.store.get(task_id)
        # Another client's task reads as unknown: its id alone is no proof of whose it is.
        if record is None or (client is not None and record.client != client):
            raise MCPError(types.INVALID_PARAMS, f"unknown task: {task_id}")
        telemetry.link(record.trace, "task")
        return record


def client_capabilities(ctx: Ctx) -> Any:
    """The capabilities a handshake-era client declared on its connection (or None)."""
    connection = getattr(ctx.session, "_connection", None)
    return getattr(connection, "client_capabilities", None)


def tasks_of(
    dispatcher: Dispatcher, config: ServeConfig, node: str, board: TaskBoard | None
) -> Tasks:
    """This server's tasks: on the cluster's ``board`` when the node wired one, audited
    through the dispatcher's sink when it offers one."""
    store: TaskStore = MemoryTaskStore() if board is None else BoardTaskStore(board)
    tasks = Tasks(
        store,
        ttl_ms=config.task_ttl_ms,
        node=board.node if board is not None else node,
        audit=dispatcher.emit_audit if isinstance(dispatcher, AuditEmitter) else None,
        max_per_client=config.max_tasks_per_client,
        max_tasks=config.max_tasks,
        max_results_per_client=config.max_task_results_per_client,
        result_bytes_per_client=config.max_task_result_bytes_per_client,
    )
    if board is not None:
        tasks.follow_board(board)
        tasks.serve_requests(board)
    return tasks


class _TaskStatus(BaseModel):
    """``notifications/tasks/status`` (the ``Task`` fields as the 2026-07-28 wire has them)."""

    method: str = "notifications/tasks/status"
    params: dict[str, Any]


class TaskListen:
    """``subscriptions/listen``: the SDK's stream (list changes), plus, for a client that
    declared the tasks extension, ``notifications/tasks/status`` for each status change of
    the tasks its caller made on this node (the same ``Caller.key``)."""

    def __init__(self, inner: ListenHandler, tasks: Tasks) -> None:
        self._inner = inner
        self._tasks = tasks

    async def __call__(
        self, ctx: Ctx, params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        if not declares_tasks(ctx.params, client_capabilities(ctx)):
            return await self._inner(ctx, params)
        client = caller_of(ctx).key
        meta = {SUBSCRIPTION_ID_META_KEY: ctx.request_id}
        send, recv = anyio.create_memory_object_stream[dict[str, Any]](256)

        def heard(task: dict[str, Any]) -> None:
            if task.pop("client", "") == client:
                with contextlib.suppress(anyio.WouldBlock, anyio.ClosedResourceError):
                    send.send_nowait(task)

        async def relay() -> None:
            async for task in recv:
                note = _TaskStatus(params={**task, "_meta": meta})
                await ctx.session.send_notification(
                    cast(Any, note), related_request_id=ctx.request_id
                )

        stop = self._tasks.watch(heard)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(relay)
                result = await self._inner(ctx, params)
                tg.cancel_scope.cancel()
        finally:
            stop()
            send.close()
        return result


_GATHER_S = 0.2  # how long a required-task tool's first request waits for a question


async def as_task(
    parked: ParkedCalls,
    tasks: Tasks,
    ctx: Ctx,
    params: types.CallToolRequestParams,
    name: str,
    digest: str,
    *,
    caller: Caller,
    forwarded: bool,
    min_level: Callable[[], types.LoggingLevel | None],
    new_channel: Callable[[Mapping[str, Any]], RoundChannel],
    start: Callable[[RoundChannel], Coroutine[Any, Any, types.CallToolResult]],
    required: bool,
) -> types.CallToolResult | types.InputRequiredResult | dict[str, Any]:
    """Start (or, after input rounds, escalate) a call as a task; ``CreateTaskResult``.

    A ``required`` tool first gathers the input its guest asks for right away in
    input-required rounds, and becomes a task on the round that brings the last
    answer (SEP-2663's composition of the two); an ``optional`` one is a task at
    once, its questions surfacing on ``tasks/get``.

    Raises:
        MCPError: the caller's task caps refuse it (nothing ran); ``-32602`` for a
            ``requestState`` naming no call of this tool here.
    """
    if params.request_state is not None:
        answer = await forward_elsewhere(parked, ctx, params.request_state, caller, forwarded)
        if answer is not None:
            forwarded_answer: types.CallToolResult | types.InputRequiredResult | dict[str, Any]
            forwarded_answer = answer
            return forwarded_answer
        call = resume(parked, ctx, params, name, digest, caller, min_level)
    else:
        tasks.admit(caller.key)  # refused before the call starts
        # The call may end before or after this request's answer: its facts go on a span
        # of its own, never on the request's (a trace's shape must not be a race).
        telemetry.calls_get_own_spans()
        channel = new_channel(plain(params.input_responses))
        # Until it is a task, a required tool's call gathers its input in rounds like any
        # other call: counted against its caller's rounds cap (max_rounds_per_caller), which
        # its tasks caps do not cover yet. Once a task, the task caps count it instead.
        call = parked.start(
            name, digest, channel, lambda: start(channel), caller.key, capped=required
        )
        if required:
            with anyio.move_on_after(_GATHER_S):
                while not call.channel.pending and not call.task.done():
                    call.changed.clear()
                    await call.changed.wait()
            if call.channel.pending:
                return await parked.step(call)
    record = tasks.create(name, call, task_outcome, client=caller.key)
    call.capped = False  # a task now: its questions are the task's, never a round ended
    return {"resultType": "task", **record.wire()}


HEADER_MISMATCH = -32020  # SEP-2243: a routing header disagrees with the body
# How long tasks/cancel waits for another entry node to apply it (the ack goes out anyway).
_CANCEL_WAIT_S = 3.0


class TaskParams(types.RequestParams):
    """``tasks/get``, ``tasks/update`` and ``tasks/cancel`` params."""

    task_id: str
    input_responses: dict[str, Any] | None = None


def _gate(ctx: Ctx, params: TaskParams) -> None:
    """Refuse a tasks/* request of a client without the extension, or misrouted.

    Raises:
        MCPError: -32021 without the extension; -32020 (HTTP 400) when the
            ``Mcp-Name`` header names another task than the body (SEP-2663 routes
            tasks/* by it, so a mismatch could reach the wrong node).
    """
    if not declares_tasks(ctx.params, client_capabilities(ctx)):
        raise tasks_required()
    headers = getattr(ctx.request, "headers", None)
    named = headers.get("mcp-name") if headers is not None else None
    if named is not None and named.strip() != params.task_id:
        raise MCPError(
            HEADER_MISMATCH,
            "the Mcp-Name header does not match params.taskId",
            data={"header": "Mcp-Name"},
        )


class TaskRequests:
    """The ``tasks/get``, ``tasks/update`` and ``tasks/cancel`` handlers over ``tasks``.

    Each answers only the caller that made the task (its ``Caller.key``).
    """

    def __init__(self, tasks: Tasks) -> None:
        self._tasks = tasks

    def register(self, server: Server[Any]) -> None:
        """Add the three handlers to the SDK's ``server``."""
        server.add_request_handler("tasks/get", TaskParams, self.get)
        server.add_request_handler("tasks/update", TaskParams, self.update)
        server.add_request_handler("tasks/cancel", TaskParams, self.cancel)

    async def get(self, ctx: Ctx, params: TaskParams) -> dict[str, Any]:
        """``tasks/get``: the task's status (and, once terminal, its result).

        Raises:
            MCPError: as :func:`_gate`; ``-32602`` for a task unknown to this caller.
        """
        _gate(ctx, params)
        return self._tasks.get(params.task_id, client=caller_of(ctx).key)

    async def update(self, ctx: Ctx, params: TaskParams) -> dict[str, Any]:
        """``tasks/update``: answers to the questions the task's guest asked.

        Raises:
            MCPError: as :func:`_gate`; ``-32602`` for a task unknown to this caller.
        """
        _gate(ctx, params)
        responses = plain(params.input_responses)
        return self._tasks.update(params.task_id, responses, client=caller_of(ctx).key)

    async def cancel(self, ctx: Ctx, params: TaskParams) -> dict[str, Any]:
        """``tasks/cancel``: end the task's call; waits a bounded while for another
        entry node that runs it.

        Raises:
            MCPError: as :func:`_gate`; ``-32602`` for a task unknown to this caller.
        """
        _gate(ctx, params)
        ack = self._tasks.cancel(params.task_id, client=caller_of(ctx).key)
        # Another entry node runs it: let its owner end it before the client's next
        # tasks/get (which then reads cancelled), within a bound.
        with anyio.move_on_after(_CANCEL_WAIT_S):
            while self._tasks.pending_elsewhere(params.task_id):
                await anyio.sleep(0.05)
        return ack
