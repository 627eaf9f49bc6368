"""File transfer between nodes: chunked request/reply on ``skilld.transfer.NODE``.

``send`` (push): a signed ``put`` names the skill, the destination path, the size and
the sha256; the receiver checks that the sender is a member, that the signature is by
a key trusted for the sender's name, and that *its own* policy of the same skill
grants receiving into that directory from that node (an ``rw`` transfer rule); then
chunks follow, each acknowledged, and ``end`` makes the receiver verify and rename the
file into place. ``fetch`` (pull): a signed ``get``; the holder checks its own grant to
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

from skilld.cluster import _announce
from skilld.cluster._link import NatsLink
from skilld.cluster._wire import PART_HEADROOM, dumps
from skilld.errors import ClusterError, ErrorCode, HostCallError, SkilldError
from skilld.package import SigningKey, TrustStore
from skilld.registry import CallContext, Registry

log = logging.getLogger("skilld.cluster")

TRANSFER_PREFIX = "skilld.transfer"
CONTEXT = b"skilld-cluster-transfer-v1\0"
H_OP = "Skilld-Op"
H_ID = "Skilld-Transfer"
H_SEQ = "Skilld-Seq"
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
        node: str,
        key: SigningKey,
        trust: TrustStore,
        registry: Registry,
        files: FileAccess,
        members: Callable[[], list[str]],
        audit: Callable[[dict[str, Any]], None],
    ):
        self._link = link
        self._node = node
        self._key = key
        self._trust = trust
        self._registry = registry
        self._files = files
        self._members = members
        self._audit = audit
        self._stamp = _announce.Stamper()
        self._fresh = _announce.Freshness()
        self._incoming: dict[str, tuple[Sink, dict[str, Any], float]] = {}
        self._outgoing: dict[str, tuple[bytes, float]] = {}

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
        body = dumps(doc)
        self._ask(node, body, {H_OP: "put", **self._sign(body)}, ctx)
        size = self._chunk_size()
        for seq, start in enumerate(range(0, len(data), size)):
            self._ask(
                node, data[start : start + size], {H_OP: "chunk", H_ID: tid, H_SEQ: str(seq)}, ctx
            )
        self._ask(node, b"", {H_OP: "end", H_ID: tid}, ctx)
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
        body = dumps(doc)
        meta = self._ask(node, body, {H_OP: "get", **self._sign(body)}, ctx)
        try:
            size, sha, parts = int(meta["size"]), str(meta["sha256"]), int(meta["parts"])
            for seq in range(parts):
                chunk = self._ask(
                    node, b"", {H_OP: "read", H_ID: tid, H_SEQ: str(seq)}, ctx, raw=True
                )
                sink.write(chunk)
            sink.commit(size, sha)
        finally:
            self._link.publish(transfer_subject(node), b"", {H_OP: "close", H_ID: tid})
        self._audit({**_record("in", ctx.skill_id, node, remote_path, size, sha), "outcome": "ok"})
        return size

    def _sign(self, body: bytes) -> dict[str, str]:
        return _announce.sign(body, self._key, self._stamp(), CONTEXT)

    def _member(self, node: str) -> None:
        if node == self._node:
            raise HostCallError("invalid-argument", f"{node} is this node: use fs to copy files")
        if node not in self._members():
            raise HostCallError("unavailable", f"node {node!r} is not a member of the cluster now")

    def _chunk_size(self) -> int:
        return max(1024, self._link.nc.max_payload - PART_HEADROOM)

    def _ask(
        self, node: str, body: bytes, headers: dict[str, str], ctx: CallContext, raw: bool = False
    ) -> Any:
        wait = min(_STEP_TIMEOUT_S, max(0.05, ctx.remaining()))
        try:
            msg = self._link.run(
                self._link.nc.request(transfer_subject(node), body, timeout=wait, headers=headers),
                timeout=wait + 1,
            )
        except Exception as exc:  # nats-py timeouts and no responders, ClusterError
            raise HostCallError(
                "unavailable", f"node {node} did not answer the transfer: {exc!r}"
            ) from exc
        if raw and (msg.headers or {}).get(H_OP) == "data":
            return msg.data
        doc = json.loads(msg.data or b"{}")
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
        headers = msg.headers or {}
        op = headers.get(H_OP, "")
        if op == "read" and msg.reply:
            try:
                data, _at = self._outgoing[headers.get(H_ID, "")]
            except KeyError:
                await self._link.nc.publish(msg.reply, _NO_SUCH)
                return
            size, seq = self._chunk_size(), _seq(headers)
            chunk = data[seq * size : (seq + 1) * size]
            await self._link.nc.publish(msg.reply, chunk, headers={H_OP: "data"})
            return
        if op == "close":
            self._outgoing.pop(headers.get(H_ID, ""), None)
            return
        # Files are opened, written, synced and read on a thread, not on the link's loop
        # (routed calls share it); a subscription's messages are handled one at a time,
        # so the chunks of a transfer still arrive in order.
        answer = await asyncio.get_running_loop().run_in_executor(
            None, self._answer, op, msg.data, headers
        )
        if msg.reply:
            await self._link.nc.publish(msg.reply, answer)

    def _answer(self, op: str, data: bytes, headers: Mapping[str, str]) -> bytes:
        try:
            if op == "put":
                reply: Any = self._begin_put(data, headers)
            elif op == "chunk":
                sink, _doc, _at = self._incoming[headers.get(H_ID, "")]
                sink.write(data)
                reply = True
            elif op == "end":
                reply = self._end_put(headers.get(H_ID, ""))
            elif op == "get":
                reply = self._begin_get(data, headers)
            else:
                raise HostCallError("invalid-argument", f"unknown transfer operation {op!r}")
            return dumps({"ok": reply})
        except KeyError:
            return _NO_SUCH
        except SkilldError as exc:
            tid = headers.get(H_ID)
            if tid in self._incoming:
                self._incoming.pop(tid)[0].abort()
            return dumps({"error": _error(exc)})

    def _addressed_here(self, doc: Mapping[str, Any]) -> None:
        if doc.get("to") != self._node:
            # Signed for another node: replayed here, it would act on this one's files.
            raise ClusterError(
                f"a transfer request from node {doc['node']!r} addressed to "
                f"{doc.get('to')!r}, not to this node"
            )

    def _signed(self, data: bytes, headers: Mapping[str, str]) -> dict[str, Any]:
        try:
            doc, _kid = _announce.check_signature(data, headers, self._trust, CONTEXT)
            self._addressed_here(doc)
            # Once only: a recorded request replayed would move the file again.
            self._fresh.accept(str(doc["node"]), _announce.parse_stamp(headers))
        except ClusterError as exc:
            raise HostCallError(ErrorCode.NOT_PERMITTED, exc.message, rule="cluster.trust") from exc
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

    def _begin_put(self, data: bytes, headers: Mapping[str, str]) -> bool:
        doc = self._signed(data, headers)
        if int(doc["size"]) > self._files.max_bytes:
            raise HostCallError("limit-exceeded", f"{doc['size']} bytes is over the transfer limit")
        canon = self._check(doc, receiving=True)
        now = time.monotonic()
        for tid, (stale, _doc, at) in list(self._incoming.items()):
            if now - at > _OUTGOING_TTL_S:  # a sender that never finished: drop its file
                stale.abort()
                del self._incoming[tid]
        self._incoming[str(doc["id"])] = (self._files.incoming(canon, str(doc["path"])), doc, now)
        return True

    def _end_put(self, tid: str) -> bool:
        sink, doc, _at = self._incoming.pop(tid)
        record = _record("in", doc["skill"], doc["node"], doc["path"], doc["size"], doc["sha256"])
        try:
            sink.commit(int(doc["size"]), str(doc["sha256"]))
        except SkilldError as exc:
            self._audit({**record, "outcome": "refused", "reason": str(exc)})
            raise
        self._audit({**record, "outcome": "ok"})
        return True

    def _begin_get(self, data: bytes, headers: Mapping[str, str]) -> dict[str, Any]:
        doc = self._signed(data, headers)
        canon = self._check(doc, receiving=False)
        payload = self._files.read(canon, str(doc["path"]))
        now = time.monotonic()
        for tid, (_data, at) in list(self._outgoing.items()):
            if now - at > _OUTGOING_TTL_S:  # a requester that never closed
                del self._outgoing[tid]
        self._outgoing[str(doc["id"])] = (payload, now)
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


def _seq(headers: Mapping[str, str]) -> int:
    try:
        return max(0, int(headers.get(H_SEQ, "0")))
    except ValueError:
        return 0


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
