"""The kinds of skill a node loads from its bundle, one seam each.

``Node.open`` loops over :data:`KINDS`; each kind opens the backends of its skills
from the verified bundle (``open_backend``) and registers them. A new kind of skill
is one class here (and one in ``skilld.bundle._kinds`` for the build).

- :class:`WasmComponents`: a component per skill, pre-warmed, with its kv namespace;
- :class:`AgentSkills`: ``NAME`` (instructions) and ``NAME/run_script`` backed by
  ``skilld.agentskills`` (the CPython runner shared with delegate's kits, if any);
- :class:`DelegateKits`: ``delegate``'s tools and a runner entry per kit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from skilld.bundle import LoadedBundle
    from skilld.node._node import NodeConfig
    from skilld.registry import Registry
    from skilld.sandbox import Sandbox
    from skilld.state import SqliteState
    from skilld.types import SkillSpec


# The program each warm runner instance runs once before a program takes it: constant,
# host-chosen, no tools (its compile, exec and JSON paths are what every program runs).
_RUNNER_WARM_ARGS = json.dumps(
    {"program": "values = [n * 2 for n in range(3)]\nresult = {'n': sum(values)}", "tools": {}}
)


@dataclass(frozen=True, slots=True)
class Loading:
    """What every kind loads from: the node's config, its verified bundle, sandbox and state.

    ``specs``: each wasm skill's description, from the lock (never by running guest code).
    """

    config: NodeConfig
    bundle: LoadedBundle
    sandbox: Sandbox
    state: SqliteState
    specs: dict[str, SkillSpec]


class SkillKind(Protocol):
    """What a kind of skill does at load: open its backends and register them."""

    name: str

    def register(self, loading: Loading, registry: Registry) -> None:
        """Open this kind's skills from ``loading.bundle`` and add them to ``registry``.

        Raises:
            SkilldError: a skill cannot be opened (``DelegateError`` for a bad kit).
        """
        ...


class WasmComponents:
    """The bundle's wasm components, one registry entry each (delegate's runner aside)."""

    name = "wasm component"

    def register(self, loading: Loading, registry: Registry) -> None:
        """Pre-warm each component and register it with its limits, kv and checker."""
        from skilld.permissions import SkillPermissions
        from skilld.policy import RUNNER
        from skilld.registry import SkillEntry, annotations_for

        loaded, tables, state = loading.bundle, loading.bundle.tables, loading.state
        for locked in loaded.lock.skills:
            if locked.id == RUNNER:  # delegate's runner: registered once per kit
                continue
            limits = tables.limits(locked.id)
            loaded.components[locked.id].prewarm(limits)
            grants = tables.skill(locked.id)
            kv = (
                state.store(
                    locked.id, value_limit=limits.kv_value_bytes, total_limit=limits.kv_total_bytes
                )
                if grants.get("kv")
                else None
            )
            registry.add(
                SkillEntry(
                    spec=loading.specs[locked.id],
                    component=loaded.components[locked.id],
                    limits=limits,
                    kv=kv,
                    checker=SkillPermissions.from_tables(tables, locked.id),
                    exposure=tables.exposure(locked.id),
                    annotations=annotations_for(grants),
                    description=locked.description,
                    record_arguments=tables.records_arguments(locked.id),
                )
            )


class AgentSkills:
    """The bundle's Agent Skills: the tool ``NAME`` (tiers 1 and 2), its ``NAME/run_script``,
    every file as a resource and the body as a prompt."""

    name = "Agent Skill"

    def register(self, loading: Loading, registry: Registry) -> None:
        """Open each Agent Skill's backend (``agentskills.open_backend``) and register it.

        Their workspaces go to the node's work directory (``skilld.paths.make_work_dir``);
        past ``agentskills.ACTIVATION_THRESHOLD`` skills, one activation tool whose
        ``name`` is an enum of them replaces a tool each (the client guide's advice).
        """
        from skilld import agentskills, paths
        from skilld.permissions import SkillPermissions
        from skilld.policy import Exposure
        from skilld.registry import SkillEntry, annotations_for
        from skilld.types import SkillSpec

        loaded, tables = loading.bundle, loading.bundle.tables
        lock = loaded.lock
        if not lock.agent_skills:
            return
        runner: Any = None
        if lock.runner is not None:
            # One runner component per bundle: delegate's kits may hold it as a skill already.
            shared = next((s.id for s in lock.skills if s.native == lock.runner.native), None)
            runner = (
                loaded.components[shared]
                if shared is not None
                else loading.sandbox.load_native(
                    loaded.root / lock.runner.native, lock.runner.native_sha256, name="pyrunner"
                )
            )
        work = paths.make_work_dir(loading.config.state_dir, audit=registry.emit_audit)
        # One store of kept outputs for every Agent Skill: its caps are per caller and
        # per node, not per skill.
        config = loading.config
        kept = agentskills.KeptOutputs(
            work,
            caller_bytes=config.kept_bytes_per_caller or agentskills.CALLER_KEPT_BYTES,
            total_bytes=config.kept_bytes or agentskills.TOTAL_KEPT_BYTES,
        )
        ids = {a.id for a in lock.agent_skills}
        many = len(ids) > agentskills.ACTIVATION_THRESHOLD and agentskills.ACTIVATION_ID not in ids
        backends: dict[str, Any] = {}
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
                work=work,
                kept=kept,
                plan=locked.scripts,
                digests={
                    path.removeprefix(f"{locked.root}/"): sha
                    for path, sha in lock.files.items()
                    if path.startswith(f"{locked.root}/")
                },
            )
            backends[locked.id] = backend
            exposure = tables.exposure(locked.id)
            if many:
                exposure = replace(exposure, hidden=(*exposure.hidden, agentskills.INSTRUCTIONS))
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
                    record_arguments=tables.records_arguments(locked.id),
                )
            )
        if many:
            activation = agentskills.ActivationBackend(backends)
            registry.add(
                SkillEntry(
                    spec=activation.spec,
                    component=activation,
                    exposure=Exposure(names={agentskills.ACTIVATE: agentskills.ACTIVATION_TOOL}),
                    annotations=annotations_for({}),
                    description=activation.spec.description,
                )
            )


class DelegateKits:
    """delegate's kits, when the bundle's tables hold any: its tools and the kits' runners."""

    name = "delegate kit"

    def register(self, loading: Loading, registry: Registry) -> None:
        """Register ``delegate`` over the kits (``skilld.delegate.register``)."""
        tables = loading.bundle.tables
        if not tables.kits:
            return
        from skilld.delegate import InferenceConfig
        from skilld.delegate import register as register_kits
        from skilld.permissions import SkillPermissions
        from skilld.policy import RUNNER, RUNNER_METHOD, kit_runner_id

        register_kits(
            registry,
            tables,
            loading.bundle.components[RUNNER],
            lambda sid: SkillPermissions.from_tables(tables, sid),
            loading.config.delegate or InferenceConfig.from_env(),
        )
        # The runner keeps warm instances like any skill, each warmed by a constant
        # program: without them every program instantiated the whole CPython runner and
        # ran its compiler for the first time on the call's path (docs/runtime.md,
        # "Where a Python call's time goes").
        loading.bundle.components[RUNNER].prewarm(
            tables.limits(kit_runner_id(next(iter(tables.kits)))),
            warm_call=(RUNNER_METHOD, _RUNNER_WARM_ARGS),
        )


KINDS: tuple[SkillKind, ...] = (WasmComponents(), AgentSkills(), DelegateKits())
