"""The assembly of one node out of a bundle, and its orderly close."""

from __future__ import annotations

import hashlib
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from skilld import paths
from skilld.errors import UsageError

if TYPE_CHECKING:
    from skilld.audit import JsonLinesSink
    from skilld.bundle import LoadedBundle
    from skilld.cluster import Cluster, ClusterConfig, RoundRelay, TaskBoard
    from skilld.delegate import InferenceConfig
    from skilld.registry import Registry
    from skilld.sandbox import Sandbox
    from skilld.state import SqliteState


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """What a node is made of; one frozen value, passed down explicitly.

    Attributes:
        bundle: the bundle directory (holding ``bundle.lock``).
        state_dir: where key-value state (``state.sqlite3``) and, by default, the audit
            log live; created when missing.
        audit_log: the audit log as JSON lines: a file, ``"-"`` for stderr, or ``None``
            for ``STATE_DIR/audit.jsonl``.
        recompile: compile native code into the cache when the engine changed.
        lock_key: require ``bundle.lock`` to be signed by this trust key.
        cache_dir: built components and native code (default ``$SKILLD_CACHE``).
        cluster: join this cluster (``skilld serve --cluster``); None: a node on its own.
        serve_skills: register the bundle's skills; False makes an entry-only node of a
            cluster, which verifies the bundle (its trust set decides which peers are
            accepted) but serves only the skills of other nodes.
        delegate: the kits' inference tiers (``skilld.delegate.InferenceConfig``;
            ``None``: from the ``SKILLD_DELEGATE_*`` environment, templates and rules
            only when unset).
        kept_bytes_per_caller: what one caller's Agent Skill runs may keep as
            ``skill://NAME/runs/...`` outputs at once (``None``: 256 MiB).
        kept_bytes: what the node keeps for all callers together (``None``: 1 GiB).
    """

    bundle: Path
    state_dir: Path
    audit_log: Path | str | None = None
    recompile: bool = False
    lock_key: Path | None = None
    cache_dir: Path = field(default_factory=paths.cache_dir)
    cluster: ClusterConfig | None = None
    serve_skills: bool = True
    delegate: InferenceConfig | None = None
    kept_bytes_per_caller: int | None = None
    kept_bytes: int | None = None

    def audit_target(self) -> Path | str:
        """Where the audit records go: a path, or ``"-"`` for stderr."""
        if self.audit_log is None:
            return self.state_dir / "audit.jsonl"
        return self.audit_log


@dataclass(frozen=True, slots=True)
class Serving:
    """What serving a node is wired to besides its registry and the serve configuration's
    values (``skilld.mcp.Wiring``); built by :meth:`Node.serving` for every way of serving.

    Attributes:
        round_peers: the cluster's other entry nodes, which forward retries of
            input-required rounds to the node that parked the call; None on its own.
        task_board: the cluster's shared task records (JetStream KV), so that any entry
            node answers ``tasks/*``; None: tasks in the server's memory.
    """

    round_peers: RoundRelay | None = None
    task_board: TaskBoard | None = None


def _stage(timings: dict[str, float], name: str, since: float) -> float:
    now = time.perf_counter()
    timings[name] = round((now - since) * 1000, 2)
    return now


class Node:
    """A running node: the verified bundle's skills registered and ready to call.

    Build one with :meth:`open`; it owns its sandbox, state and audit sink and
    releases them in :meth:`close` (also as a context manager). After close, the
    registry must not be called.

    Attributes:
        config: what it was opened with.
        registry: the skills, tools, resources and prompts; the MCP layer's dispatcher.
        sandbox: the wasm engine the skills run in.
        state: the key-value state of every skill with a ``kv`` grant.
        audit: the audit sink every call's record goes to.
        bundle: the loaded bundle (its verified lock, tables and components).
        timings: milliseconds spent in each stage of opening.
        cluster: the node's part in its cluster, when it joined one.
    """

    def __init__(
        self,
        config: NodeConfig,
        registry: Registry,
        sandbox: Sandbox,
        state: SqliteState,
        audit: JsonLinesSink,
        bundle: LoadedBundle,
        timings: dict[str, float],
    ):
        self.config = config
        self.registry = registry
        self.sandbox = sandbox
        self.state = state
        self.audit = audit
        self.bundle = bundle
        self.timings = timings
        self.cluster: Cluster | None = None
        self._closed = False

    @classmethod
    def open(cls, config: NodeConfig, *, prehash: Any = None) -> Node:
        """Verify and load ``config.bundle`` into a ready node.

        ``prehash`` is the bundle's files already being hashed (``prehash_bundle``);
        nothing is trusted from it before the lock is verified.

        Raises:
            UsageError: ``config.bundle`` holds no ``bundle.lock``.
            AuditError: the audit log cannot be opened.
            BundleError: the bundle is damaged, holds unknown content, or is for another engine.
            PolicyError: its tables are malformed.
            DelegateError: a kit names an unknown method or holds a refused program.
        """
        from skilld.audit import JsonLinesSink
        from skilld.bundle import open_bundle
        from skilld.node._kinds import KINDS, Loading
        from skilld.permissions import CallerPolicy
        from skilld.registry import Registry
        from skilld.sandbox import Sandbox
        from skilld.state import SqliteState
        from skilld.types import SkillSpec

        if not (config.bundle / "bundle.lock").is_file():
            raise UsageError(
                f"{config.bundle} is not a bundle (no bundle.lock)",
                hint="build one with 'skilld build -o DIR'",
            )
        if not config.serve_skills and config.cluster is None:
            raise UsageError("a node that serves no skill of its own must join a cluster")
        paths.private_dir(config.state_dir)
        target = config.audit_target()
        audit = JsonLinesSink(sys.stderr if target == "-" else target)
        timings: dict[str, float] = {}
        sandbox = Sandbox(config.cache_dir)
        state: SqliteState | None = None
        try:
            verify = None
            if config.lock_key is not None:
                # The build side (and cryptography) only when a lock key asks for it.
                from skilld.bundle import verify_lock_signature

                verify = verify_lock_signature(config.lock_key)
            loaded = open_bundle(
                config.bundle,
                sandbox,
                recompile=config.recompile,
                verify_lock=verify,
                prehash=prehash,
            )
            timings.update({k: round(v, 2) for k, v in loaded.timings_ms.items()})
            t = time.perf_counter()
            # describe: what each skill's describe export returned at build time, from the
            # lock (verified above), so serving never runs guest code before the first call.
            specs = {
                locked.id: SkillSpec.from_dict(
                    {**locked.spec, "id": locked.id, "version": locked.version}
                )
                for locked in loaded.lock.skills
            }
            t = _stage(timings, "describe", t)
            state = SqliteState(config.state_dir / "state.sqlite3")
            registry = Registry(audit=audit)
            registry.use_callers(CallerPolicy.from_tables(loaded.tables))
            if config.serve_skills:
                loading = Loading(config, loaded, sandbox, state, specs)
                for kind in KINDS:
                    kind.register(loading, registry)
            _stage(timings, "register", t)
        except BaseException:
            if state is not None:
                state.close()
            sandbox.close()
            audit.close()
            raise
        registry.mark_ready()
        node = cls(config, registry, sandbox, state, audit, loaded, timings)
        if config.cluster is not None:
            t = time.perf_counter()
            try:
                node._join(config.cluster)
            except BaseException:
                node.close()
                raise
            _stage(timings, "join", t)
        return node

    def _join(self, cluster: ClusterConfig) -> None:
        """Join the cluster: serve this bundle's skills to it and add its peers' skills.

        Raises:
            TrustError: the bundle's trust set is malformed.
            UsageError: the announcement key cannot be read.
            ClusterError: NATS cannot be reached or refuses the credentials.
        """
        from skilld.cluster import Cluster, FileAccess, LocalSkill
        from skilld.package import canonical_json, load_private_key, load_trust
        from skilld.sandbox.abi import fs, transfer

        trust = load_trust(self.config.bundle / "trust")
        key = load_private_key(cluster.key_file)
        digests = {locked.id: locked.component_sha256 for locked in self.bundle.lock.skills}
        # A skill the host implements (a delegate kit) has no package: its replicas are
        # the nodes describing it the same way.
        local = [
            LocalSkill(
                e,
                digests.get(e.spec.id)
                or hashlib.sha256(canonical_json(e.spec.as_dict())).hexdigest(),
            )
            for e in self.registry.skills()
        ]

        def refused(node: str, reason: str) -> None:
            self.audit.emit(
                {"event": "cluster-refused", "node": node, "reason": reason, "start": time.time()}
            )

        self.cluster = Cluster(
            cluster,
            self.registry,
            trust,
            key,
            self.bundle.lock.bundle_digest,
            local,
            files=FileAccess(
                canonical=fs.canonical,
                read=transfer.read_file,
                incoming=transfer.Incoming,
                max_bytes=transfer.MAX_TRANSFER,
            ),
            audit=self.audit.emit,
            on_refused=refused,
        )
        self.cluster.start()
        self.registry.add_gauges(self.cluster.gauges)

    def serving(self, task_ttl_s: float) -> Serving:
        """The live objects an MCP server of this node is wired to: ``skilld serve``, the
        tests and the benchmarks all take them from here, so they serve alike.

        A node in a cluster relays input-required rounds between entry nodes; one whose
        cluster keeps state in JetStream KV also keeps its tasks there (``task_ttl_s``:
        how long a task's record stays), and the cluster marks a task failed when its
        owner leaves.

        Raises:
            ClusterError: JetStream refused the task bucket.
            UsageError: the node is closed, or serves no MCP (``--no-mcp``).
        """
        if self._closed:
            raise UsageError("this node is closed", hint="open a new one with Node.open")
        cluster, clustered = self.cluster, self.config.cluster
        if cluster is None or clustered is None:
            return Serving()
        if not clustered.entry:
            raise UsageError("a node that joined its cluster with --no-mcp serves no MCP")
        board = cluster.task_board(task_ttl_s) if clustered.kv else None
        return Serving(round_peers=cluster.rounds, task_board=board)

    def close(self) -> None:
        """Leave the cluster; release the sandbox, the state and the audit sink (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.cluster is not None:
                self.cluster.close()
        finally:
            self._release()

    def _release(self) -> None:
        try:
            self.sandbox.close()
            self.state.close()
        finally:
            self.audit.close()

    def __enter__(self) -> Node:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
