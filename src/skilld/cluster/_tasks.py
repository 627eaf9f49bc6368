"""MCP task records in JetStream KV, so that any entry node of a cluster answers for a task.

A task's call runs on the entry node that created it (its *owner*: the call's channel,
its input-required questions and its cancel path live there); what a client may learn
of it lives in the bucket ``skilld-tasks`` under ``t.TASK``, written only by the owner.
Another entry node reads that record for ``tasks/get``, and carries ``tasks/cancel`` and
``tasks/update`` to the owner as a request under ``r.OWNER.TASK.NONCE``, which the owner
watches; it applies a request to a task it runs (a cancel ends the call, and a routed
call's cancel reaches the worker that runs a script, which ends its process tree) and
deletes it.

Every value is signed by the node that wrote it, with its cluster key, over a context of
its own (``skilld-cluster-task-v1``) and the key it is stored under: a record is used only
when its signer may speak for the owner it names (the trust file's ``cluster``
patterns), so a node cannot forge or move another node's task, and a request only when
its signer may speak for the node it claims and it is addressed to this node; requests
are accepted once per stamp (the replay window of membership, its own instance). The
bus's permissions (only nodes reach ``$KV.>``) are the second wall.

Every entry node also watches the records (:meth:`TaskBoard.follow`): it tells its own
listeners of each verified change (``notifications/tasks/status`` from any entry node), and
it keeps an index of who owns which unfinished task, so that when membership reports an
owner gone (left, expired, or restarted: its boot changed) it marks that owner's unfinished
tasks ``failed``. Such a record is signed by the node that wrote it (``by``), names the
owner, and is believed only as ``failed`` with no result; the write is a compare-and-set on
the record's revision, so of several entry nodes that saw the owner go one writes it.

Values are kept for the bucket's TTL (the tasks' TTL), so a result outlives neither
its ``ttlMs`` nor, by much, the node that made it. Records are not encrypted: every
entry node must read them, and only nodes can.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import (
    KeyDeletedError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
)
from nats.js.kv import KeyValue

from skilld.cluster import _announce
from skilld.cluster._config import NODE_RE
from skilld.cluster._link import NatsLink
from skilld.errors import ClusterError
from skilld.package import SigningKey, TrustStore

log = logging.getLogger("skilld.cluster")

BUCKET = "skilld-tasks"
CONTEXT = b"skilld-cluster-task-v1\0"
# What a task id may be before it names a key (a client sends it: no dots, no wildcards).
TASK_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
OPS = ("cancel", "update")
_TIMEOUT_S = 5.0
_MAX_VALUE = 1024 * 1024

TERMINAL = frozenset({"completed", "failed", "cancelled"})

Request = Callable[[str, str, dict[str, Any]], None]
"""``(task id, op, body)``: a request for a task this node owns (on the link's thread)."""

Seen = Callable[[str, dict[str, Any]], None]
"""``(task id, record with its owner)``: a verified record (on the link's thread)."""


@dataclass(frozen=True)
class _Known:
    """What the index keeps of a record: enough to find an owner's unfinished tasks."""

    owner: str
    status: str
    boot: int  # the boot in the stamp its writer signed it with
    expires: float


class TaskBoard:
    """This node's view of the cluster's task records (a ``TaskBoard`` of ``skilld.mcp``).

    Args:
        link: the node's NATS link.
        kv: the opened bucket.
        node: this node's name (the owner of the tasks it creates).
        key: this node's cluster signing key.
        trust: the trust set signers are checked against.
        refused: told ``(claimed node, reason)`` of every value refused.
    """

    def __init__(
        self,
        link: NatsLink,
        kv: KeyValue,
        node: str,
        key: SigningKey,
        trust: TrustStore,
        refused: Callable[[str, str], None] = lambda node, reason: None,
    ) -> None:
        self.node = node
        self._link = link
        self._kv = kv
        self._key = key
        self._trust = trust
        self._refused = refused
        self._stamper = _announce.Stamper()
        self._fresh = _announce.Freshness()
        self._on_request: Request | None = None
        self._on_record: Seen | None = None
        self._on_failed: Seen | None = None
        self._index: dict[str, _Known] = {}

    @classmethod
    async def open(
        cls,
        link: NatsLink,
        node: str,
        key: SigningKey,
        trust: TrustStore,
        ttl_s: float,
        refused: Callable[[str, str], None] = lambda node, reason: None,
    ) -> TaskBoard:
        """Open (creating it when missing) the task bucket; on the link's loop.

        Raises:
            ClusterError: JetStream is not enabled on the server, or refused the bucket.
        """
        try:
            kv = await link.bucket(
                KeyValueConfig(
                    bucket=BUCKET,
                    description="skilld MCP task records (owner-signed)",
                    history=1,
                    storage=StorageType.FILE,
                    ttl=ttl_s,
                    max_value_size=_MAX_VALUE,
                )
            )
        except Exception as exc:
            raise ClusterError(
                f"cannot open the JetStream KV bucket {BUCKET}: {exc!r}",
                hint="tasks shared by a cluster's entry nodes need JetStream: nats-server -js",
            ) from exc
        return cls(link, kv, node, key, trust, refused)

    # -- records -----------------------------------------------------------------

    def put(self, task_id: str, record: Mapping[str, Any]) -> None:
        """Store this node's record of ``task_id`` (acknowledged by JetStream on return).

        Raises:
            ClusterError: a malformed task id, or JetStream did not take it.
        """
        key = _record_key(task_id)
        doc = {"owner": self.node, "task": task_id, "record": dict(record)}
        self._run(self._kv.put(key, self._sign(key, doc)), "storing a task")

    def get(self, task_id: str) -> dict[str, Any] | None:
        """The record of ``task_id`` and its owner, when its owner signed it; else None.

        Returns ``{"owner": NODE, **record}``.
        """
        if not TASK_ID.fullmatch(task_id):
            return None
        key = _record_key(task_id)
        try:
            value = self._run(self._read(key), "reading a task")
        except ClusterError as exc:
            log.warning("cluster: task %s unreadable: %s", task_id, exc)
            return None
        if value is None:
            return None
        try:
            owner, record, _boot = self._verified(task_id, key, value)
        except ClusterError as exc:
            self._refused(_claimed(value), f"task record {task_id} refused: {exc.message}")
            return None
        return {**record, "owner": owner}

    def _verified(self, task_id: str, key: str, value: bytes) -> tuple[str, dict[str, Any], int]:
        """A record value's owner, record and signing boot, once verified.

        Raises:
            ClusterError: see :func:`_record_of`.
        """
        signer, doc, boot = self._open_stamped(key, value)
        owner, record = _record_of(task_id, signer, doc)
        return owner, record, boot

    # -- every record, as it changes -----------------------------------------------

    def follow(self, on_record: Seen, on_failed: Seen) -> None:
        """Hear every verified record as it changes (``on_record``, on the link's thread),
        and keep the index :meth:`owner_gone` works from; ``on_failed`` hears each task this
        node marked failed because its owner went.

        Raises:
            ClusterError: JetStream refused the watch.
        """
        self._on_record, self._on_failed = on_record, on_failed
        watcher = self._run(self._kv.watch("t.>"), "watching task records")
        self._link.spawn(self._follow(watcher))

    async def _entries(self, watcher: Any) -> AsyncIterator[Any]:
        """The watched entries, until the link closes (the end of the initial values and
        a quiet hour are not entries)."""
        while True:
            try:
                entry = await watcher.updates(timeout=3600)
            except Exception:  # noqa: BLE001 - a quiet hour, or the link closing
                if self._link.nc.is_closed:
                    return
                continue
            if entry is not None and entry is not KeyValue.KeyWatcher.STOP_ITER:
                yield entry

    async def _follow(self, watcher: Any) -> None:
        async for entry in self._entries(watcher):
            key = str(entry.key)
            task_id = key[2:]
            if entry.operation is not None or not entry.value:
                self._index.pop(task_id, None)  # deleted, purged or aged out
                continue
            self._seen(task_id, key, bytes(entry.value))

    def _seen(self, task_id: str, key: str, value: bytes) -> None:
        try:
            owner, record, boot = self._verified(task_id, key, value)
            known = _Known(owner, str(record.get("status")), boot, float(record["expires"]))
        except (ClusterError, KeyError, TypeError, ValueError) as exc:
            reason = exc.message if isinstance(exc, ClusterError) else "malformed"
            self._refused(_claimed(value), f"task record {task_id[:64]} refused: {reason}")
            return
        if len(self._index) >= 4096:  # a bounded index: drop what is past its TTL
            now = time.time()
            for gone in [t for t, k in self._index.items() if k.expires <= now]:
                del self._index[gone]
        self._index[task_id] = known
        if self._on_record is not None:
            self._on_record(task_id, {**record, "owner": owner})

    def owner_gone(
        self, node: str, boot: int | None, reason: str
    ) -> concurrent.futures.Future[None] | None:
        """Mark ``node``'s unfinished tasks failed (those of a boot before ``boot`` when it
        restarted; all of them when ``boot`` is None); called on the link's loop. Returns
        the marking under way, if any."""
        if node == self.node:
            return None
        doomed = [
            t
            for t, k in self._index.items()
            if k.owner == node and k.status not in TERMINAL and (boot is None or k.boot < boot)
        ]
        return self._link.spawn(self._fail(node, boot, reason, doomed)) if doomed else None

    async def _fail(self, node: str, boot: int | None, reason: str, doomed: list[str]) -> None:
        for task_id in doomed:
            try:
                await self._fail_one(task_id, node, boot, reason)
            except Exception as exc:  # noqa: BLE001 - the task stays as it was until its TTL
                log.warning("cluster: task %s of node %s not marked failed: %r", task_id, node, exc)

    async def _fail_one(self, task_id: str, node: str, boot: int | None, reason: str) -> None:
        """Compare-and-set the record failed; another node winning the race ends it here."""
        key = _record_key(task_id)
        for _attempt in range(3):
            try:
                entry = await self._kv.get(key)
            except (KeyNotFoundError, KeyDeletedError):
                return
            if entry.value is None:
                return
            owner, record, signed = self._verified(task_id, key, bytes(entry.value))
            if owner != node or record.get("status") in TERMINAL:
                return  # finished, or already marked by another node
            if boot is not None and signed >= boot:
                return  # written by the owner's new life
            message = f"node {node} running this task {reason}; its call is lost"
            failed = {
                **record,
                "status": "failed",
                "result": None,
                "input_requests": None,
                "message": message,
                "error": {"code": -32603, "message": message},
                "updated_at": _now(),
            }
            doc = {"owner": node, "by": self.node, "task": task_id, "record": failed}
            try:
                await self._kv.update(key, self._sign(key, doc), last=entry.revision)
            except KeyWrongLastSequenceError:
                continue  # changed under us: read it again
            log.warning("cluster: task %s marked failed: %s", task_id, message)
            if self._on_failed is not None:
                self._on_failed(task_id, {**failed, "owner": node})
            return

    # -- requests to a task's owner ------------------------------------------------

    def ask(self, owner: str, task_id: str, op: str, body: Mapping[str, Any]) -> None:
        """Send ``op`` (``cancel`` or ``update``) for ``task_id`` to the node that owns it.

        Raises:
            ClusterError: a malformed owner, task id or op, or JetStream did not take it.
        """
        if not NODE_RE.fullmatch(owner) or op not in OPS:
            raise ClusterError(f"no task request {op!r} to node {owner!r}")
        _record_key(task_id)
        key = f"r.{owner}.{task_id}.{secrets.token_hex(8)}"
        doc = {"from": self.node, "to": owner, "task": task_id, "op": op, "body": dict(body)}
        self._run(self._kv.put(key, self._sign(key, doc)), "sending a task request")

    def listen(self, on_request: Request) -> None:
        """Hear the requests for this node's tasks from now on (``on_request`` on the link's
        thread, each verified and accepted once).

        Raises:
            ClusterError: JetStream refused the watch.
        """
        self._on_request = on_request
        watcher = self._run(self._kv.watch(f"r.{self.node}.>"), "watching task requests")
        self._link.spawn(self._hear(watcher))

    async def _hear(self, watcher: Any) -> None:
        async for entry in self._entries(watcher):
            if entry.operation is not None or not entry.value:
                continue  # a delete marker: a request handled
            self._request(str(entry.key), bytes(entry.value))
            try:
                await self._kv.delete(entry.key)
            except Exception as exc:  # noqa: BLE001 - the bucket's TTL ends it anyway
                log.info("cluster: task request %s not deleted: %r", entry.key, exc)

    def _request(self, key: str, value: bytes) -> None:
        try:
            signer, doc = self._open(key, value, once=True)
            task_id, op, body = _request_of(key, self.node, signer, doc)
        except ClusterError as exc:
            self._refused(_claimed(value), f"task request refused: {exc.message}")
            return
        if self._on_request is not None:
            # ``by``: the verified sender, whatever the body says
            self._on_request(task_id, op, {**body, "by": signer})

    # -- signing -----------------------------------------------------------------------

    def _sign(self, key: str, doc: Mapping[str, Any]) -> bytes:
        data = json.dumps(doc, separators=(",", ":"), sort_keys=True)
        headers = _announce.sign(_bound(key, data.encode()), self._key, self._stamper(), CONTEXT)
        return json.dumps({"h": headers, "d": data}, separators=(",", ":")).encode()

    def _open_stamped(self, key: str, value: bytes) -> tuple[str, dict[str, Any], int]:
        """A record's signer, document and the boot of its stamp.

        Raises:
            ClusterError: see :meth:`_open`.
        """
        signer, doc = self._open(key, value)
        return signer, doc, _announce.parse_stamp(_parse(value)[0])[0]

    def _open(self, key: str, value: bytes, *, once: bool = False) -> tuple[str, dict[str, Any]]:
        headers, data, doc = _parse(value)
        signed_by = _announce.check_bytes(
            _bound(key, data.encode()),
            {str(k): str(v) for k, v in headers.items()},
            self._trust,
            CONTEXT,
        )
        # a record speaks for its owner, or for the node that marked it failed (``by``)
        claimed = (doc.get("by") or doc.get("owner")) if key.startswith("t.") else doc.get("from")
        if not isinstance(claimed, str) or not NODE_RE.fullmatch(claimed):
            raise ClusterError(f"a task value from an invalid node name {claimed!r}")
        if not signed_by.may_announce(claimed):
            raise ClusterError(f"key {signed_by.name} may not speak for node {claimed!r}")
        if once:
            self._fresh.accept(claimed, _announce.parse_stamp(headers))
        return claimed, doc

    # -- JetStream -----------------------------------------------------------------------

    async def _read(self, key: str) -> bytes | None:
        try:
            entry = await self._kv.get(key)
        except (KeyNotFoundError, KeyDeletedError):
            return None
        return None if entry.value is None else bytes(entry.value)

    def _run(self, coro: Any, what: str) -> Any:
        try:
            return self._link.run(coro, timeout=_TIMEOUT_S)
        except ClusterError:
            raise
        except Exception as exc:
            raise ClusterError(f"{what} failed in JetStream KV: {exc!r}") from exc


def _parse(value: bytes) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """A stored value's signature headers, signed text and document.

    Raises:
        ClusterError: not the shape this module writes.
    """
    try:
        outer = json.loads(value)
        headers, data = outer["h"], outer["d"]
        doc = json.loads(data) if isinstance(data, str) else None
    except (ValueError, KeyError, TypeError):
        doc = None
    if not isinstance(doc, dict) or not isinstance(headers, dict):
        raise ClusterError("an unsigned or malformed task value")
    return headers, data, doc


def _record_of(task_id: str, signer: str, doc: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The owner and record of a verified record value.

    A record is the owner's; or, signed by another node (``by``), the owner's task marked
    ``failed`` with no result after the owner went: nothing else may be said for it.

    Raises:
        ClusterError: neither its owner nor a marking node signed it, or it is another
            task's.
    """
    owner, record, by = doc.get("owner"), doc.get("record"), doc.get("by")
    if not isinstance(record, dict):
        raise ClusterError("a task record that is not an object")
    if doc.get("task") != task_id or not isinstance(owner, str) or not NODE_RE.fullmatch(owner):
        raise ClusterError(f"a task record of {owner!r} stored under another task")
    if by is None and owner == signer:
        return owner, record
    if (
        by == signer
        and by != owner
        and record.get("status") == "failed"
        and not record.get("result")
    ):
        return owner, record
    raise ClusterError(f"a task record of {owner!r} signed by node {signer!r}")


def _request_of(
    key: str, node: str, signer: str, doc: dict[str, Any]
) -> tuple[str, str, dict[str, Any]]:
    """The task, op and body of a verified request value.

    Raises:
        ClusterError: not addressed to ``node``, stored under another task's key, or not
            a request this module knows.
    """
    task_id, op, body = doc.get("task"), doc.get("op"), doc.get("body")
    if doc.get("from") != signer or doc.get("to") != node:
        raise ClusterError(f"a task request from {signer!r} not for this node")
    if not isinstance(task_id, str) or not key.startswith(f"r.{node}.{task_id}."):
        raise ClusterError("a task request stored under another task's key")
    if op not in OPS or not isinstance(body, dict):
        raise ClusterError(f"an unknown task request {op!r}")
    return task_id, str(op), body


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _record_key(task_id: str) -> str:
    if not TASK_ID.fullmatch(task_id):
        raise ClusterError(f"not a task id: {task_id[:64]!r}")
    return f"t.{task_id}"


def _bound(key: str, data: bytes) -> bytes:
    """What is signed: the key a value is stored under, then the value."""
    return key.encode() + b"\0" + data


def _claimed(value: bytes) -> str:
    try:
        doc = json.loads(json.loads(value)["d"])
        return str(doc.get("owner") or doc.get("from") or "?")[:64]
    except (ValueError, KeyError, TypeError, AttributeError):
        return "?"
