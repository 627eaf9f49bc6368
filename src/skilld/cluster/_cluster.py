"""A node's part in the cluster: its link, membership, served skills and remote skills."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from skilld.cluster import _announce
from skilld.cluster._announce import AnnouncedSkill, LocalSkill
from skilld.cluster._claim import StartTurn
from skilld.cluster._config import ClusterConfig
from skilld.cluster._envelope import Opener, Sealer
from skilld.cluster._kv import JetStreamKV
from skilld.cluster._link import NatsLink
from skilld.cluster._member import Membership, Peer
from skilld.cluster._remote import RemoteSkill, Router
from skilld.cluster._rounds import RoundRelay
from skilld.cluster._tasks import TaskBoard
from skilld.cluster._transfer import FileAccess, Transfers
from skilld.cluster._worker import SkillServer
from skilld.errors import ClusterError, RegistryError
from skilld.package import BoxKey, SigningKey, TrustStore
from skilld.registry import Registry, SkillEntry
from skilld.types import Limits

log = logging.getLogger("skilld.cluster")

# A remote skill's slots on the entry node: its holders enforce their own limits.
_REMOTE_CONCURRENCY = 64
_START_TIMEOUT_S = 10.0


class Cluster:
    """Joins the cluster for one node: see ``skilld.cluster``.

    Args:
        config: how to reach NATS and who this node is.
        registry: this node's registry; its local skills are served to the cluster and
            the skills of trusted peers are added to (and removed from) it.
        trust: the trust set (the bundle's) that peers' announcements must verify against.
        key: this node's signing key: its announcements and every message it sends to
            another node (the envelope).
        bundle_digest: the digest of this node's bundle, announced.
        local: the skills this node serves to the cluster.
        files: the file side of transfers (the sandbox's); None: no file transfer.
        audit: where this node's transfer records go.
        on_refused: told ``(claimed node, reason)`` of each refused announcement or
            message (audit ``cluster-refused``).
    """

    def __init__(
        self,
        config: ClusterConfig,
        registry: Registry,
        trust: TrustStore,
        key: SigningKey,
        bundle_digest: str,
        local: list[LocalSkill],
        *,
        files: FileAccess | None = None,
        audit: Callable[[dict[str, Any]], None] = lambda record: None,
        on_refused: Callable[[str, str], None] = lambda node, reason: None,
    ):
        self.config = config
        self.registry = registry
        self.bundle_digest = bundle_digest
        self._local = local
        self._local_ids = {s.entry.spec.id for s in local}
        self._remote: dict[str, RemoteSkill] = {}
        self.link = NatsLink(
            config, on_disconnect=self._disconnected, on_reconnect=self._reconnected
        )
        # entry: serves MCP clients; worker: serves skills of its own to the cluster.
        roles = tuple(r for r, has in (("entry", config.entry), ("worker", bool(local))) if has)
        # One stamper and one replay window for everything this node signs and receives.
        stamper, fresh = _announce.Stamper(), _announce.Freshness()
        # Payloads are sealed to their receiving node with this boot's key (memory only).
        self.box = BoxKey()
        sealer = Sealer(config.node, key, stamper, self.box)
        opener = Opener(config.node, trust, fresh, self.box)
        self.refused_messages = 0
        self._key, self._trust = key, trust

        def refused(node: str, reason: str) -> None:
            self.refused_messages += 1
            log.warning("cluster: %s (claimed sender %s)", reason, node)
            on_refused(node, reason)

        self._refused = refused
        self.router = Router(
            self.link, sealer, opener, self._alive, self._boot, refused, box=self._box_of
        )
        # Retries of input-required rounds between entry nodes (skilld.mcp's RoundPeers).
        self.rounds = RoundRelay(self.link, sealer, opener, self._entry, self._box_of, refused)
        self.server = SkillServer(
            self.link,
            registry,
            sealer,
            opener,
            local,
            threads=32,
            alive=self._alive,
            refused=refused,
        )
        self.membership = Membership(
            self.link,
            config,
            trust,
            key,
            _announce.payload(config.node, roles, bundle_digest, local, self.box.public_raw),
            on_join=self._joined,
            on_change=self._changed,
            on_leave=self._left,
            on_refused=on_refused,
            stamper=stamper,
            fresh=fresh,
        )
        self.transfers = (
            None
            if files is None
            else Transfers(
                self.link,
                sealer,
                opener,
                registry,
                files,
                lambda: sorted(self.membership.peers),
                audit,
                refused,
                box=self._box_of,
            )
        )
        self.started_at = time.time()
        self.withdrawn: list[str] = []
        self.open_bus = False
        self.disconnects = 0
        self._started = False
        self._task_board: TaskBoard | None = None

    def start(self) -> None:
        """Connect, serve the local skills, announce and listen for peers.

        Raises:
            UsageError: a credentials or TLS file cannot be read.
            ClusterError: NATS cannot be reached or refuses us.
        """
        self.link.start()
        try:
            self.link.run(self._start(), timeout=_START_TIMEOUT_S)
        except Exception:
            self.link.close()
            raise
        self._started = True

    async def _start(self) -> None:
        if await self.link.anonymous_can_listen():
            self.open_bus = True
            log.error(
                "cluster: INSECURE BUS: a NATS connection without credentials can subscribe "
                "to skilld.> on %s, so anyone who reaches it reads every routed call's "
                "arguments and results (signatures keep them from forging any). Run "
                "nats-server with the configuration `skilld cluster nats-config` writes "
                "(docs/cluster.md).",
                self.config.url,
            )
        async with contextlib.AsyncExitStack() as turn:
            if any(s.entry.kv is not None for s in self._local):
                # Nodes take turns from the replica check until their endpoints are up.
                await turn.enter_async_context(StartTurn(self.link, self.config.node))
            await self._serve()
        await self.membership.start()

    async def _serve(self) -> None:
        """Check who serves this node's stateful skills already, then serve."""
        await self._no_split_state()
        if self.config.kv:
            # Before this node serves anything: its skills' state moves to JetStream KV.
            for skill in self._local:
                entry = skill.entry
                if entry.kv is not None:
                    entry.kv = await JetStreamKV.open(
                        self.link,
                        entry.spec.id,
                        entry.limits.kv_value_bytes,
                        entry.limits.kv_total_bytes,
                    )
        if self.transfers is not None:
            for skill in self._local:
                skill.entry.services["transfer"] = self.transfers
            await self.transfers.start()
        await self.router.start()
        if self.config.entry:
            await self.rounds.start()
        await self.server.start()

    def close(self) -> None:
        """Leave the cluster at once (signed leave), finish calls in flight, disconnect."""
        if self._started:
            self._started = False
            try:
                self.link.run(self._stop(), timeout=35)
            except ClusterError as exc:
                log.info("cluster: leaving did not finish cleanly: %s", exc)
        self.link.close()

    async def _no_split_state(self) -> None:
        """Withdraw a skill with a kv grant that another node serves already, unless
        both keep its state in JetStream KV: two replicas with state of their own would
        answer differently (a note added on one, not found on the other)."""
        stateful = [s for s in self._local if s.entry.kv is not None]
        if not stateful:
            return
        self.server.clustered_kv = self.config.kv
        others = await self.server.serving()
        mine = "cluster" if self.config.kv else "local"
        for skill in stateful:
            sid = skill.entry.spec.id
            holders = others.get(sid, [])
            split = [node for node, kv in holders if kv != "cluster" or mine != "cluster"]
            if not split:
                continue
            log.error(
                "cluster: skill %s NOT served by this node: it keeps key-value state and "
                "node(s) %s serve it already%s; replicas with state of their own would split "
                "it (a write on one, missing on the other). Start every node holding it with "
                "--cluster-kv (JetStream KV shared by the replicas), or hold it on one node.",
                sid,
                ", ".join(sorted(split)),
                "" if mine == "local" else " with state of their own",
            )
            self._local = [s for s in self._local if s.entry.spec.id != sid]
            self._local_ids.discard(sid)
            self.server.withdraw(sid)
            self.registry.remove(sid)
            self.withdrawn.append(sid)
        if self.withdrawn:
            self.membership.announce_as(
                _announce.payload(
                    self.config.node,
                    self._roles(),
                    self.bundle_digest,
                    self._local,
                    self.box.public_raw,
                )
            )

    def task_board(self, ttl_s: float) -> TaskBoard:
        """The cluster's MCP task records (JetStream KV) for this entry node, listening.

        Raises:
            ClusterError: JetStream is not enabled, or refused the bucket.
        """
        board: TaskBoard = self.link.run(
            TaskBoard.open(
                self.link, self.config.node, self._key, self._trust, ttl_s, self._refused
            ),
            timeout=_START_TIMEOUT_S,
        )
        self._task_board = board  # told when a task's owner goes (_left, _changed)
        return board

    def _roles(self) -> tuple[str, ...]:
        return tuple(
            r for r, has in (("entry", self.config.entry), ("worker", bool(self._local))) if has
        )

    async def _stop(self) -> None:
        await self.membership.stop()
        await self.server.stop()

    # -- membership callbacks (on the link's loop) --------------------------------

    def _alive(self, node: str) -> bool:
        return node in self.membership.peers

    def _entry(self, node: str) -> bool:
        peer = self.membership.peers.get(node)
        return peer is not None and "entry" in peer.announcement.roles

    def _box_of(self, node: str) -> bytes | None:
        peer = self.membership.peers.get(node)
        return None if peer is None else peer.announcement.box

    def _boot(self, node: str) -> int | None:
        peer = self.membership.peers.get(node)
        return None if peer is None else peer.boot

    def _disconnected(self) -> None:
        self.disconnects += 1
        self.membership.disconnected()

    def _reconnected(self) -> None:
        self.membership.reconnected()

    def _joined(self, peer: Peer) -> None:
        for skill in peer.announcement.skills:
            self._attach(peer.node, skill)

    def _left(self, peer: Peer, reason: str) -> None:
        for skill in peer.announcement.skills:
            self._detach(peer.node, skill)
        if self._task_board is not None:
            self._task_board.owner_gone(peer.node, None, reason)

    def _changed(self, old: Peer, new: Peer) -> None:
        if self._task_board is not None and new.boot != old.boot:
            self._task_board.owner_gone(new.node, new.boot, "restarted")
        before = {(s.spec.id, s.digest) for s in old.announcement.skills}
        after = {(s.spec.id, s.digest) for s in new.announcement.skills}
        for skill in old.announcement.skills:
            if (skill.spec.id, skill.digest) not in after:
                self._detach(old.node, skill)
        for skill in new.announcement.skills:
            if (skill.spec.id, skill.digest) not in before:
                self._attach(new.node, skill)

    def _attach(self, node: str, skill: AnnouncedSkill) -> None:
        sid = skill.spec.id
        if sid in self._local_ids:
            return  # held here too: served locally, and this node is one of its replicas
        remote = self._remote.get(sid)
        if remote is not None:
            if remote.digest == skill.digest:
                remote.holders.add(node)
            else:
                log.warning(
                    "cluster: node %s announces skill %s with package %s, but %s serves %s; "
                    "ignored until those nodes leave",
                    node,
                    sid,
                    skill.digest[:16],
                    sorted(remote.holders),
                    remote.digest[:16],
                )
            return
        remote = RemoteSkill(self.router, sid, skill.digest)
        remote.holders.add(node)
        entry = SkillEntry(
            spec=skill.spec,
            component=remote,
            limits=Limits(
                timeout_ms=skill.limits.timeout_ms,
                max_concurrency=max(_REMOTE_CONCURRENCY, skill.limits.max_concurrency),
            ),
            exposure=skill.exposure,
            annotations=skill.annotations,
            description=skill.description,
        )
        try:
            self.registry.add(entry)
        except RegistryError as exc:
            log.warning("cluster: skill %s of node %s not added: %s", sid, node, exc)
            return
        self._remote[sid] = remote

    def _detach(self, node: str, skill: AnnouncedSkill) -> None:
        remote = self._remote.get(skill.spec.id)
        if remote is None or remote.digest != skill.digest:
            return
        remote.holders.discard(node)
        if not remote.holders:
            del self._remote[skill.spec.id]
            self.registry.remove(skill.spec.id)

    # -- operations -----------------------------------------------------------------

    def gauges(self) -> dict[str, tuple[str, float]]:
        """This node's cluster gauges for /metrics (read without the link's loop)."""
        return {
            "skilld_cluster_connected": (
                "1 while this node's NATS connection is up.",
                float(self.membership.connected_since is not None),
            ),
            "skilld_cluster_nodes": (
                "Other nodes this node sees (verified announcements).",
                float(len(self.membership.peers)),
            ),
            "skilld_cluster_remote_skills": (
                "Skills of other nodes in this node's registry.",
                float(len(self._remote)),
            ),
            "skilld_cluster_refused_announcements": (
                "Announcements refused since start (unsigned, untrusted, out of scope).",
                float(self.membership.refused),
            ),
            "skilld_cluster_disconnects": (
                "Times this node lost its NATS connection since start.",
                float(self.disconnects),
            ),
            "skilld_cluster_open_bus": (
                "1 when an anonymous NATS connection could subscribe to skilld.> at start.",
                float(self.open_bus),
            ),
            "skilld_cluster_refused_messages": (
                "Routed calls, answers, cancellations and transfer steps refused since start "
                "(unsigned, untrusted, misaddressed, replayed).",
                float(self.refused_messages),
            ),
            "skilld_cluster_routed_calls_served": (
                "Calls from other nodes this node ran since start.",
                float(self.server.served),
            ),
        }

    def status(self) -> dict[str, Any]:
        """This node's view of the cluster, JSON-ready (``skilld cluster status``, /metrics)."""
        return self.link.run(self._status(), timeout=5)

    async def _status(self) -> dict[str, Any]:
        now, wall = time.monotonic(), time.time()
        connected = self.membership.connected_since is not None
        return {
            "node": self.config.node,
            "connected": connected,
            "heartbeat_s": self.config.heartbeat_s,
            "expiry_s": self.config.expiry_s,
            "refused_announcements": self.membership.refused,
            "disconnects": self.disconnects,
            "routed_calls_served": self.server.served,
            "remote_skills": len(self._remote),
            "nodes": [
                {
                    "node": p.node,
                    "roles": list(p.announcement.roles),
                    "bundle": p.announcement.bundle,
                    "key_id": p.announcement.key_id,
                    "last_heartbeat_s": round(now - p.last_seen, 3),
                    "last_heartbeat_at": round(wall - (now - p.last_seen), 3),
                    "heartbeats": p.heartbeats,
                    "skills": [
                        {"id": s.spec.id, "version": s.spec.version, "digest": s.digest}
                        for s in p.announcement.skills
                    ],
                }
                for p in sorted(self.membership.peers.values(), key=lambda p: p.node)
            ],
        }
