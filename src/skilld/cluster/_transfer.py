"""File transfer between nodes: chunked request/reply on ``skilld.transfer.NODE``.

Every step, each way, travels in the envelope of ``_envelope`` (sender, target,
transfer id, step and chunk number, the payload, a stamp accepted once): a
chunk, an ``end``, a ``read`` or a ``close`` is accepted only from the node that began
the transfer, in order, and an answer only from the node asked.

``send`` (push): a sealed ``put`` names the skill, the destination path, the size and
the sha256; the receiver checks that the sender is a member, that its seal is by a
key trusted for the sender's name, and that *its own* policy of the same skill
grants receiving into that directory from that node (an ``rw`` transfer rule); then
chunks follow, each acknowledged, and ``end`` makes the receiver verify and rename the
file into place. ``fetch`` (pull): a sealed ``get``; the holder checks its own grant to
send that file to the requester, and answers with the size and sha256, then chunks.
The requesting side verifies before its rename. Both nodes write a ``transfer`` audit
record. The file side (descriptor-based opening, the unnamed file, the rename) is the
sandbox's (``skilld.sandbox.abi.transfer``), handed in as :class:`FileAccess`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from nats.aio.msg import Msg

from skilld.cluster._envelope import Opened, Opener, Sealer, claimed
from skilld.cluster._link import NatsLink
from skilld.cluster._wire import PART_HEADROOM, dumps
from skilld.errors import ClusterError, ErrorCode, HostCallError, SkilldError
from skilld.registry import CallContext, Registry

log = logging.getLogger("skilld.cluster")

TRANSFER_PREFIX = "skilld.transfer"
_STEP_TIMEOUT_S = 10.0
# A transfer unfinished this long is dropped (its file never appears).
_OUTGOING_TTL_S = 60.0


class Sink(Protocol):
    """A file being received (``skilld.sandbox.abi.transfer.Incoming``)."""

    def write(self, data: bytes) -> None:
        """Append a chunk."""
        ...

    def commit(self, size: int, sha256: str) -> None:
        """Verify, then make it visible in one rename."""
        ...

    def abort(self) -> None:
        """Drop it."""
        ...


@dataclass(frozen=True, slots=True)
class FileAccess:
    """The file side of transfers, from the sandbox (the cluster may not import it)."""

    canonical: Callable[[str], str]
    read: Callable[[str, str], bytes]
    incoming: Callable[[str, str], Sink]
    max_bytes: int


def transfer_subject(node: str) -> str:
    """Where a node takes transfer requests."""
    return f"{TRANSFER_PREFIX}.{node}"


class Transfers:
    """The transfer service of one node (``services["transfer"]`` of its skills)."""

    def __init__(
        self,
        link: NatsLink,
        sealer: Sealer,
        opener: Opener,
        registry: Registry,
        files: FileAccess,
        members: Callable[[], list[str]],
        audit: Callable[[dict[str, Any]], None],
        refused: Callable[[str, str], None] = lambda node, reason: None,
        box: Callable[[str], bytes | None] = lambda node: None,
    ):
        self._link = link
        self._box = box  # a member's payload key: file bytes are sealed to it
        self._node = sealer.node
        self._sealer = sealer
        self._opener = opener
        self._registry = registry
        self._files = files
        self._members = members
        self._audit = audit
        self._refused = refused
        # transfer id -> (sink, its put request, when it began, the next chunk's number)
        self._incoming: dict[str, tuple[Sink, dict[str, Any], float, list[int]]] = {}
        # transfer id -> (the bytes, when it began, the node that asked)
        self._outgoing: dict[str, tuple[bytes, float, str]] = {}

    async def start(self) -> None:
        """Take transfer requests addressed to this node."""
        await self._link.nc.subscribe(transfer_subject(self._node), cb=self._on_request)

    # -- the guest's side (a worker thread) -------------------------------------------

    def nodes(self) -> list[str]:
        """The other members, by name."""
        return self._members()

    def send(self, ctx: CallContext, node: str, data: bytes, remote_path: str) -> int:
        """Push ``data`` to ``remote_path`` on ``node`` (the sending grant is checked).

        Raises:
            HostCallError: the node is not a member, it refused, or it did not answer.
        """
        self._member(node)
        tid = secrets.token_hex(12)
        sha = hashlib.sha256(data).hexdigest()
        doc = {
            "v": 1,
            "op": "put",
            "node": self._node,
            "to": node,
            "skill": ctx.skill_id,
            "path": remote_path,
            "size": len(data),
            "sha256": sha,
            "id": tid,
        }
        self._ask(node, tid, "put", dumps(doc), ctx)
        size = self._chunk_size()
        for seq, start in enumerate(range(0, len(data), size)):
            self._ask(node, tid, "chunk", data[start : start + size], ctx, seq=seq)
        self._ask(node, tid, "end", b"", ctx)
        self._audit(
            {**_record("out", ctx.skill_id, node, remote_path, len(data), sha), "outcome": "ok"}
        )
        return len(data)

    def fetch(self, ctx: CallContext, node: str, remote_path: str, sink: Sink) -> int:
        """Pull ``remote_path`` from ``node`` into ``sink`` and commit it.

        Raises:
            HostCallError: the node is not a member, it refused, did not answer, or the
                bytes did not match its sha256 (nothing is written).
        """
        self._member(node)
        tid = secrets.token_hex(12)
        doc = {
            "v": 1,
            "op": "get",
            "node": self._node,
            "to": node,
            "skill": ctx.skill_id,
            "path": remote_path,
            "id": tid,
        }
        meta = self._ask(node, tid, "get", dumps(doc), ctx)
        try:
            size, sha, parts = int(meta["size"]), str(meta["sha256"]), int(meta["parts"])
            for seq in range(parts):
                sink.write(self._ask(node, tid, "read", b"", ctx, seq=seq, raw=True))
            sink.commit(size, sha)
        finally:
            close = {"ev": "transfer", "op": "close", "id": tid, "to": node}
            self._link.publish(transfer_subject(node), b"", self._sealer.seal(close, b""))
        self._audit({**_record("in", ctx.skill_id, node, remote_path, size, sha), "outcome": "ok"})
        return size

    def _member(self, node: str) -> None:
        if node == self._node:
            raise HostCallError("invalid-argument", f"{node} is this node: use fs to copy files")
        if node not in self._members():
            raise HostCallError("unavailable", f"node {node!r} is not a member of the cluster now")

    def _chunk_size(self) -> int:
        return max(1024, self._link.nc.max_payload - PART_HEADROOM)

    def _ask(
        self,
        node: str,
        tid: str,
        op: str,
        body: bytes,
        ctx: CallContext,
        seq: int = 0,
        raw: bool = False,
    ) -> Any:
        wait = min(_STEP_TIMEOUT_S, max(0.05, ctx.remaining()))
        meta = {"ev": "transfer", "op": op, "id": tid, "seq": seq, "to": node}
        headers, body = self._sealer.seal_to(self._box(node), meta, body)
        try:
            msg = self._link.run(
                self._link.nc.request(
                    transfer_subject(node),
                    body,
                    timeout=wait,
                    headers=headers,
                ),
                timeout=wait + 1,
            )
        except Exception as exc:  # nats-py timeouts and no responders, ClusterError
            raise HostCallError(
                "unavailable", f"node {node} did not answer the transfer: {exc!r}"
            ) from exc
        try:
            opened = self._opener.open(msg.headers, msg.data, node, id=tid)
        except ClusterError as exc:
            self._refused(claimed(msg.headers), f"transfer answer dropped: {exc.message}")
            raise HostCallError(
                "unavailable", f"the answer of node {node} to the transfer did not verify"
            ) from exc
        if raw and opened.meta.get("op") == "data" and opened.meta.get("seq") == seq:
            return opened.data
        doc = json.loads(opened.data or b"{}")
        if "error" in doc:
            err = doc["error"]
            raise HostCallError(
                str(err.get("code", "internal")),
                f"node {node} refused the transfer: {err.get('message')}",
                rule=err.get("rule"),
            )
        return doc.get("ok")

    # -- the other side (the link's loop) ---------------------------------------------

    async def _on_request(self, msg: Msg) -> None:
        try:
            opened = self._opener.open(msg.headers, msg.data)
        except ClusterError as exc:
            self._refused(claimed(msg.headers), f"transfer step refused: {exc.message}")
            if msg.reply:
                await self._link.nc.publish(msg.reply, _refusal(exc))
            return
        op, tid = str(opened.meta.get("op", "")), str(opened.meta.get("id", ""))
        if op == "read" and msg.reply:
            out = self._outgoing.get(tid)
            if out is None or out[2] != opened.sender:
                await self._reply(msg.reply, opened, _NO_SUCH)
                return
            size, seq = self._chunk_size(), _int(opened.meta.get("seq"))
            chunk = out[0][seq * size : (seq + 1) * size]
            meta = {"ev": "transfer", "op": "data", "id": tid, "seq": seq, "to": opened.sender}
            headers, sealed = self._sealer.seal_to(opened.box, meta, chunk)
            await self._link.nc.publish(msg.reply, sealed, headers=headers)
            return
        if op == "close":
            out = self._outgoing.get(tid)
            if out is not None and out[2] == opened.sender:
                del self._outgoing[tid]
            return
        # Files are opened, written, synced and read on a thread, not on the link's loop
        # (routed calls share it); a subscription's messages are handled one at a time,
        # so the chunks of a transfer still arrive in order.
        answer = await asyncio.get_running_loop().run_in_executor(
            None, self._answer, op, opened.data, opened
        )
        if msg.reply:
            await self._reply(msg.reply, opened, answer)

    async def _reply(self, reply: str, opened: Opened, body: bytes) -> None:
        meta = {"ev": "transfer", "op": "answer", "id": opened.meta.get("id"), "to": opened.sender}
        headers, sealed = self._sealer.seal_to(opened.box, meta, body)
        await self._link.nc.publish(reply, sealed, headers=headers)

    def _answer(self, op: str, data: bytes, opened: Opened) -> bytes:
        tid = str(opened.meta.get("id", ""))
        try:
            if op == "put":
                reply: Any = self._begin_put(data, opened)
            elif op == "chunk":
                sink, doc, _at, expected = self._incoming[tid]
                if doc["node"] != opened.sender or _int(opened.meta.get("seq")) != expected[0]:
                    raise HostCallError(
                        ErrorCode.NOT_PERMITTED,
                        f"chunk {opened.meta.get('seq')} of transfer {tid} from node "
                        f"{opened.sender}: not the next chunk of a transfer it began",
                        rule="cluster.trust",
                    )
                sink.write(data)
                expected[0] += 1
                reply = True
            elif op == "end":
                reply = self._end_put(tid, opened.sender)
            elif op == "get":
                reply = self._begin_get(data, opened)
            else:
                raise HostCallError("invalid-argument", f"unknown transfer operation {op!r}")
            return dumps({"ok": reply})
        except KeyError:
            return _NO_SUCH
        except SkilldError as exc:
            incoming = self._incoming.get(tid)
            if incoming is not None and incoming[1]["node"] == opened.sender:
                del self._incoming[tid]
                incoming[0].abort()
            if isinstance(exc, HostCallError) and exc.rule == "cluster.trust":
                self._refused(opened.sender, f"transfer step refused: {exc.message}")
            return dumps({"error": _error(exc)})

    def _request(self, data: bytes, opened: Opened) -> dict[str, Any]:
        """The ``put``/``get`` document of a verified request, checked against its envelope.

        Raises:
            HostCallError: ``not-permitted`` when the document disagrees with its envelope
                or the sender is not a member.
        """
        try:
            doc = json.loads(data)
        except ValueError:
            doc = None
        if (
            not isinstance(doc, dict)
            or doc.get("node") != opened.sender
            or doc.get("to") != self._node
            or doc.get("id") != opened.meta.get("id")
        ):
            raise HostCallError(
                ErrorCode.NOT_PERMITTED,
                f"a transfer request from node {opened.sender} that its envelope does not "
                "match (another sender, another target or another transfer)",
                rule="cluster.trust",
            )
        if doc["node"] not in self._members():
            raise HostCallError(ErrorCode.NOT_PERMITTED, f"node {doc['node']!r} is not a member")
        return doc

    def _check(self, doc: Mapping[str, Any], receiving: bool) -> str:
        entry = next((e for e in self._registry.skills() if e.spec.id == doc["skill"]), None)
        if entry is None or entry.checker is None:
            raise HostCallError(
                ErrorCode.NOT_PERMITTED,
                f"node {self._node} has no policy for skill {doc['skill']!r}, so no transfer grant",
                rule="default-deny",
            )
        canon = self._files.canonical(str(doc["path"]))
        action = "fetch" if receiving else "send"
        decision = entry.checker.check("transfer", action, f"{doc['node']}:{canon}")
        if not decision.allowed:
            self._audit(
                {
                    **_record(
                        "in" if receiving else "out",
                        doc["skill"],
                        doc["node"],
                        doc["path"],
                        doc.get("size", 0),
                        doc.get("sha256"),
                    ),
                    "outcome": "denied",
                    "rule": decision.rule,
                    "reason": decision.reason,
                }
            )
            raise HostCallError(
                ErrorCode.NOT_PERMITTED,
                f"{doc['path']} on node {self._node}: {decision.reason}",
                rule=decision.rule,
            )
        return canon

    def _begin_put(self, data: bytes, opened: Opened) -> bool:
        doc = self._request(data, opened)
        if int(doc["size"]) > self._files.max_bytes:
            raise HostCallError("limit-exceeded", f"{doc['size']} bytes is over the transfer limit")
        canon = self._check(doc, receiving=True)
        now = time.monotonic()
        for tid, (stale, _doc, at, _n) in list(self._incoming.items()):
            if now - at > _OUTGOING_TTL_S:  # a sender that never finished: drop its file
                stale.abort()
                del self._incoming[tid]
        sink = self._files.incoming(canon, str(doc["path"]))
        self._incoming[str(doc["id"])] = (sink, doc, now, [0])
        return True

    def _end_put(self, tid: str, sender: str) -> bool:
        sink, doc, _at, _n = self._incoming[tid]
        if doc["node"] != sender:
            raise HostCallError(
                ErrorCode.NOT_PERMITTED,
                f"node {sender} may not end transfer {tid}, which node {doc['node']} began",
                rule="cluster.trust",
            )
        del self._incoming[tid]
        record = _record("in", doc["skill"], doc["node"], doc["path"], doc["size"], doc["sha256"])
        try:
            sink.commit(int(doc["size"]), str(doc["sha256"]))
        except SkilldError as exc:
            self._audit({**record, "outcome": "refused", "reason": str(exc)})
            raise
        self._audit({**record, "outcome": "ok"})
        return True

    def _begin_get(self, data: bytes, opened: Opened) -> dict[str, Any]:
        doc = self._request(data, opened)
        canon = self._check(doc, receiving=False)
        payload = self._files.read(canon, str(doc["path"]))
        now = time.monotonic()
        for tid, (_data, at, _node) in list(self._outgoing.items()):
            if now - at > _OUTGOING_TTL_S:  # a requester that never closed
                del self._outgoing[tid]
        self._outgoing[str(doc["id"])] = (payload, now, opened.sender)
        sha = hashlib.sha256(payload).hexdigest()
        size = self._chunk_size()
        self._audit(
            {
                **_record("out", doc["skill"], doc["node"], doc["path"], len(payload), sha),
                "outcome": "ok",
            }
        )
        return {"size": len(payload), "sha256": sha, "parts": max(1, -(-len(payload) // size))}


_NO_SUCH = dumps({"error": {"code": "not-found", "message": "no such transfer"}})


def _int(value: object) -> int:
    try:
        return max(0, int(str(value)))
    except ValueError:
        return 0


def _refusal(exc: ClusterError) -> bytes:
    err = {"code": ErrorCode.NOT_PERMITTED.value, "message": exc.message, "rule": "cluster.trust"}
    return dumps({"error": err})


def _record(
    direction: str, skill: str, peer: str, path: object, size: object, sha: object
) -> dict[str, Any]:
    return {
        "event": "transfer",
        "direction": direction,
        "skill": skill,
        "peer": peer,
        "path": path,
        "size": size,
        "sha256": sha,
        "start": time.time(),
    }


def _error(exc: SkilldError) -> dict[str, Any]:
    code = getattr(exc, "code", "internal")
    return {"code": code, "message": exc.message, "rule": getattr(exc, "rule", None)}
