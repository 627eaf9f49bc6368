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

Values are kept for the bucket's TTL (the tasks' TTL), so a result outlives neither
its ``ttlMs`` nor, by much, the node that made it. Records are not encrypted: every
entry node must read them, and only nodes can.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from collections.abc import Callable, Mapping
from typing import Any

from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BucketNotFoundError, KeyDeletedError, KeyNotFoundError
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

Request = Callable[[str, str, dict[str, Any]], None]
"""``(task id, op, body)``: a request for a task this node owns (on the link's thread)."""


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
        js = link.nc.jetstream()
        try:
            try:
                kv = await js.key_value(BUCKET)
            except BucketNotFoundError:
                kv = await js.create_key_value(
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
            owner, record = _record_of(task_id, *self._open(key, value))
        except ClusterError as exc:
            self._refused(_claimed(value), f"task record {task_id} refused: {exc.message}")
            return None
        return {**record, "owner": owner}

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
        while True:
            try:
                entry = await watcher.updates(timeout=3600)
            except Exception:  # noqa: BLE001 - a quiet hour, or the link closing
                if self._link.nc.is_closed:
                    return
                continue
            if entry is None or entry is KeyValue.KeyWatcher.STOP_ITER:
                continue  # the end of the initial values
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

    def _open(self, key: str, value: bytes, *, once: bool = False) -> tuple[str, dict[str, Any]]:
        headers, data, doc = _parse(value)
        signed_by = _announce.check_bytes(
            _bound(key, data.encode()),
            {str(k): str(v) for k, v in headers.items()},
            self._trust,
            CONTEXT,
        )
        claimed = doc.get("owner") if key.startswith("t.") else doc.get("from")
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

    Raises:
        ClusterError: its owner did not sign it, or it is another task's.
    """
    owner, record = doc.get("owner"), doc.get("record")
    if doc.get("task") != task_id or owner != signer:
        raise ClusterError(f"a task record of {owner!r} signed by node {signer!r}")
    if not isinstance(record, dict):
        raise ClusterError("a task record that is not an object")
    return signer, record


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
