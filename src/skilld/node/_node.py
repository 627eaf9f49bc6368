"""The assembly of one node out of a bundle, and its orderly close."""

from __future__ import annotations

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
        delegate: the kits' inference tiers (``skilld.delegate.InferenceConfig``;
            ``None``: from the ``SKILLD_DELEGATE_*`` environment, templates and rules
            only when unset).
    """

    bundle: Path
    state_dir: Path
    audit_log: Path | str | None = None
    recompile: bool = False
    lock_key: Path | None = None
    cache_dir: Path = field(default_factory=paths.cache_dir)
    delegate: InferenceConfig | None = None

    def audit_target(self) -> Path | str:
        """Where the audit records go: a path, or ``"-"`` for stderr."""
        if self.audit_log is None:
            return self.state_dir / "audit.jsonl"
        return self.audit_log


def _stage(timings: dict[str, float], name: str, since: float) -> float:
    now = time.perf_counter()
    timings[name] = round((now - since) * 1000, 2)
    return now


def _register_agent_skills(registry: Any, loaded: Any, sandbox: Any, tables: Any) -> None:
    """Register the bundle's Agent Skills: the tool ``NAME`` (tiers 1 and 2), its
    ``NAME/run_script``, every file as a resource and the body as a prompt."""
    from dataclasses import replace

    from skilld import agentskills
    from skilld.permissions import SkillPermissions
    from skilld.registry import SkillEntry, annotations_for
    from skilld.types import SkillSpec

    lock = loaded.lock
    runner = None
    if lock.runner is not None:
        # One runner component per bundle: delegate's kits may hold it as a skill already.
        shared = next((s.id for s in lock.skills if s.native == lock.runner.native), None)
        runner = (
            loaded.components[shared]
            if shared is not None
            else sandbox.load_native(
                loaded.root / lock.runner.native, lock.runner.native_sha256, name="pyrunner"
            )
        )
    for locked in lock.agent_skills:
        spec = SkillSpec.from_dict({**locked.spec, "id": locked.id, "version": locked.version})
        limits = tables.limits(locked.id)
        grants = tables.skill(locked.id)
        backend = agentskills.open_backend(
            spec,
            loaded.root / locked.root,
            loaded.root / locked.env if locked.env else None,
            locked.executor,
            tables.scripts(locked.id),
            grants,
            limits,
            runner,
        )
        exposure = tables.exposure(locked.id)
        # Tier 1 is a tool named as the skill, unless the operator named it otherwise.
        names = {agentskills.INSTRUCTIONS: locked.id, **exposure.names}
        registry.add(
            SkillEntry(
                spec=spec,
                component=backend,
                limits=limits,
                checker=SkillPermissions.from_tables(tables, locked.id),
                exposure=replace(exposure, names=names),
                annotations=annotations_for(grants),
                description=locked.description,
            )
        )


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
        from skilld.permissions import SkillPermissions
        from skilld.policy import RUNNER
        from skilld.registry import Registry, SkillEntry, annotations_for
        from skilld.sandbox import Sandbox
        from skilld.state import SqliteState
        from skilld.types import SkillSpec

        if not (config.bundle / "bundle.lock").is_file():
            raise UsageError(
                f"{config.bundle} is not a bundle (no bundle.lock)",
                hint="build one with 'skilld build -o DIR'",
            )
        config.state_dir.mkdir(parents=True, exist_ok=True)
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
            tables = loaded.tables
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
            for locked in loaded.lock.skills:
                if locked.id == RUNNER:  # delegate's runner: registered once per kit below
                    continue
                limits = tables.limits(locked.id)
                loaded.components[locked.id].prewarm(limits)
                grants = tables.skill(locked.id)
                registry.add(
                    SkillEntry(
                        spec=specs[locked.id],
                        component=loaded.components[locked.id],
                        limits=limits,
                        kv=state.store(
                            locked.id,
                            value_limit=limits.kv_value_bytes,
                            total_limit=limits.kv_total_bytes,
                        )
                        if grants.get("kv")
                        else None,
                        checker=SkillPermissions.from_tables(tables, locked.id),
                        exposure=tables.exposure(locked.id),
                        annotations=annotations_for(grants),
                        description=locked.description,
                    )
                )
            _register_agent_skills(registry, loaded, sandbox, tables)
            if tables.kits:
                from skilld.delegate import InferenceConfig
                from skilld.delegate import register as register_kits

                register_kits(
                    registry,
                    tables,
                    loaded.components[RUNNER],
                    lambda sid: SkillPermissions.from_tables(tables, sid),
                    config.delegate or InferenceConfig.from_env(),
                )
            _stage(timings, "register", t)
        except BaseException:
            if state is not None:
                state.close()
            sandbox.close()
            audit.close()
            raise
        registry.mark_ready()
        return cls(config, registry, sandbox, state, audit, loaded, timings)

    def close(self) -> None:
        """Release the sandbox, the state and the audit sink (idempotent)."""
        if self._closed:
            return
        self._closed = True
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
