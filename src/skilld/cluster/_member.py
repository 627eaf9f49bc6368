"""Membership: heartbeats out, peers' announcements in, silent peers expired.

Everything here runs on the link's event loop. There is no protocol of our own
beyond "publish your signed announcement every H seconds": a peer is a member while
its announcements keep arriving, and is removed once it has been silent for the
expiry window (2H-3H) or has sent a signed leave. Each heartbeat is signed afresh with
the next stamp, and each stamp of a peer is accepted once: a recorded heartbeat replayed
cannot keep a dead node listed, nor a recorded leave remove a live one.

A node that lost its own NATS connection hears nobody, through no fault of theirs.
It therefore expires peers only once its connection has been up again for a full
expiry window (wasmCloud once removed a whole fleet over exactly this, PR #5502):
while it is disconnected, and for one window after, nobody is dropped.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nats.aio.msg import Msg

from skilld.cluster import _announce
from skilld.cluster._config import ClusterConfig
from skilld.cluster._link import NatsLink
from skilld.cluster._wire import ANNOUNCE, LEAVE
from skilld.errors import ClusterError
from skilld.package import SigningKey, TrustStore

log = logging.getLogger("skilld.cluster")


@dataclass
class Peer:
    """Another node, as its latest verified announcement shows it."""

    announcement: _announce.Announcement
    last_seen: float  # monotonic
    last_seen_wall: float
    heartbeats: int = 1
    # The boot in its stamps (when it started): calls made for it name it.
    boot: int = 0
    # The announcement's bytes: a heartbeat repeating them is not read again.
    raw: bytes = field(default=b"", repr=False)

    @property
    def node(self) -> str:
        """The peer's name."""
        return self.announcement.node


class Membership:
    """This node's view of the cluster; calls back when peers join, change or go.

    ``on_join(peer)``, ``on_change(old, new)`` and ``on_leave(peer, reason)`` run on
    the link's loop and must not block.
    """

    def __init__(
        self,
        link: NatsLink,
        config: ClusterConfig,
        trust: TrustStore,
        key: SigningKey,
        announcement: bytes,
        *,
        on_join: Callable[[Peer], None],
        on_change: Callable[[Peer, Peer], None],
        on_leave: Callable[[Peer, str], None],
        on_refused: Callable[[str, str], None] = lambda node, reason: None,
        stamper: _announce.Stamper | None = None,
        fresh: _announce.Freshness | None = None,
    ):
        self._link = link
        self._config = config
        self._trust = trust
        self._key = key
        self._announcement = announcement
        # The node's one stamper and window, shared with its calls and transfers.
        self._stamp = stamper or _announce.Stamper()
        self._fresh = fresh or _announce.Freshness()
        self._on_join, self._on_change, self._on_leave = on_join, on_change, on_leave
        self._on_refused = on_refused
        self.peers: dict[str, Peer] = {}
        # None while disconnected; expiry waits for a full window after this.
        self.connected_since: float | None = None
        self.refused = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._refusals_logged: dict[str, float] = {}

    def announce_as(self, announcement: bytes) -> None:
        """Announce ``announcement`` from now on (before :meth:`start`)."""
        self._announcement = announcement

    async def start(self) -> None:
        """Subscribe, announce and start the heartbeat and expiry timers."""
        nc = self._link.nc
        await nc.subscribe(ANNOUNCE, cb=self._on_announce)
        await nc.subscribe(LEAVE, cb=self._on_leave_msg)
        self.connected_since = time.monotonic()
        await self._publish()
        await nc.flush()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._heartbeat()), loop.create_task(self._sweep())]

    async def stop(self) -> None:
        """Stop the timers and leave the cluster at once (a signed leave)."""
        for task in self._tasks:
            task.cancel()
        data = _announce.leave_payload(self._config.node, secrets.token_hex(8))
        headers = _announce.sign(data, self._key, self._stamp(), _announce.LEAVE_CONTEXT)
        try:
            await self._link.nc.publish(LEAVE, data, headers=headers)
            await self._link.nc.flush(timeout=2)
        except Exception as exc:  # noqa: BLE001 - leaving: peers will expire us instead
            log.info("cluster: could not say goodbye: %r", exc)

    def disconnected(self) -> None:
        """Our own NATS connection dropped: stop judging peers."""
        self.connected_since = None

    def reconnected(self) -> None:
        """The connection is back: re-announce, and judge peers only a window from now."""
        self.connected_since = time.monotonic()
        asyncio.get_running_loop().create_task(self._publish())

    async def _publish(self) -> None:
        headers = _announce.sign(self._announcement, self._key, self._stamp())
        try:
            await self._link.nc.publish(ANNOUNCE, self._announcement, headers=headers)
        except Exception as exc:  # noqa: BLE001 - the next heartbeat tries again
            log.info("cluster: heartbeat not sent: %r", exc)

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self._config.heartbeat_s)
            await self._publish()

    async def _sweep(self) -> None:
        # A quarter of H: a silent peer goes between expiry and expiry + H/4.
        while True:
            await asyncio.sleep(self._config.heartbeat_s / 4)
            self.expire(time.monotonic())

    def expire(self, now: float) -> list[str]:
        """Remove peers silent for the expiry window, unless our connection is too fresh."""
        window = self._config.expiry_s
        if self.connected_since is None or now - self.connected_since < window:
            return []
        gone = [p for p in self.peers.values() if now - p.last_seen > window]
        for peer in gone:
            del self.peers[peer.node]
            log.warning(
                "cluster: node %s expired (silent for %.1fs)", peer.node, now - peer.last_seen
            )
            self._on_leave(peer, "expired")
        return [p.node for p in gone]

    async def _on_announce(self, msg: Msg) -> None:
        if msg.data == self._announcement:
            return  # our own heartbeat, echoed back by NATS
        now, wall = time.monotonic(), time.time()
        headers = msg.headers or {}
        known = next((p for p in self.peers.values() if p.raw == msg.data), None)
        try:
            if known is not None:
                # The same announcement as before: a heartbeat. Only its signature (over
                # the new stamp) is checked; the document is not read again.
                known.boot = self._check_heartbeat(known, msg.data, headers)
                known.last_seen, known.last_seen_wall = now, wall
                known.heartbeats += 1
                return
            ann = _announce.verify(msg.data, headers, self._trust)
            if ann.node != self._config.node:
                self._fresh.accept(ann.node, _announce.parse_stamp(headers))
        except ClusterError as exc:
            self._refuse(msg.data, exc)
            return
        if ann.node == self._config.node:
            if ann.fingerprint != _fingerprint(self._announcement):
                log.error("cluster: another node announces itself as %s (this node)", ann.node)
            return
        peer = Peer(ann, now, wall, raw=msg.data, boot=_announce.parse_stamp(headers)[0])
        old = self.peers.get(ann.node)
        self.peers[ann.node] = peer
        if old is None:
            log.info("cluster: node %s joined (%d skills)", ann.node, len(ann.skills))
            self._on_join(peer)
            # A newcomer learns about us now rather than a heartbeat from now.
            await self._publish()
        else:
            peer.heartbeats = old.heartbeats + 1
            self._on_change(old, peer)

    def _check_heartbeat(self, known: Peer, data: bytes, headers: dict[str, str]) -> int:
        key = _announce.check_bytes(data, headers, self._trust, _announce.CONTEXT)
        if key.key_id != known.announcement.key_id:
            raise ClusterError(
                f"node {known.node}'s announcement signed by another key ({key.key_id})"
            )
        stamp = _announce.parse_stamp(headers)
        self._fresh.accept(known.node, stamp)
        return stamp[0]

    async def _on_leave_msg(self, msg: Msg) -> None:
        try:
            doc, _kid = _announce.check_signature(
                msg.data, msg.headers, self._trust, _announce.LEAVE_CONTEXT
            )
            self._fresh.accept(str(doc["leave"]), _announce.parse_stamp(msg.headers or {}))
        except ClusterError as exc:
            self._refuse(msg.data, exc)
            return
        peer = self.peers.pop(str(doc["leave"]), None)
        if peer is not None:
            log.info("cluster: node %s left", peer.node)
            self._on_leave(peer, "left")

    def _refuse(self, data: bytes, exc: ClusterError) -> None:
        self.refused += 1
        node = _claimed_node(data)
        self._on_refused(node, str(exc))
        # Once per claimed node and heartbeat: a flood must not flood the log as well.
        now = time.monotonic()
        if now - self._refusals_logged.get(node, -1e9) >= self._config.heartbeat_s:
            self._refusals_logged[node] = now
            log.warning(
                "cluster: announcement refused: %s",
                json.dumps({"event": "cluster-refused", "node": node, "reason": str(exc)}),
            )


def _fingerprint(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _claimed_node(data: bytes) -> str:
    try:
        doc: Any = json.loads(data)
    except ValueError:
        return "?"
    node = doc.get("node", doc.get("leave", "?")) if isinstance(doc, dict) else "?"
    return str(node)[:64]
