"""Agent Skills (``SKILL.md`` directories): validated at build, disclosed in tiers, run confined.

An Agent Skill (agentskills.io) is a directory with a ``SKILL.md`` (YAML frontmatter
and Markdown instructions) and optional ``scripts/``, ``references/`` and ``assets/``.
skilld treats one as a first-class skill of the sealed bundle:

- build time (``_skillmd``, ``_tools``, ``_build``; called by ``skilld build``):
  the frontmatter validated to the specification (strict, or ``--lenient`` as its
  client guide says), ``allowed-tools`` mapped onto needs that the policy compiler
  intersects with the operator's grants, the directory packed into a signed
  ``.skill``, its Python requirements installed offline into its own environment;
- build time, scripts (``_plan``): what each script needs (packages, an interpreter,
  processes, declared system programs), the executor chosen from it unless the policy
  chose, and what cannot run here (served ``unavailable`` leniently, refused strictly);
- run time (``_backend``, ``_executors``): a registry backend serving the three
  disclosure tiers (the tool, its instructions, each file as ``skill://NAME/PATH``),
  the body as a prompt, ``run_script`` through the ``wasm`` or ``native`` executor with
  the client's files in and large outputs kept as resources, and the skill's entry of
  the MCP skills extension; ``_activation``: one activation tool for many skills.

``docs/agent-skills.md`` describes the format, the tiers and what each executor confines.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from skilld import paths
from skilld.agentskills._activation import (
    ACTIVATE,
    ACTIVATION_ID,
    ACTIVATION_THRESHOLD,
    ACTIVATION_TOOL,
    ActivationBackend,
)
from skilld.agentskills._backend import AgentSkillBackend, ScriptExecutor, ScriptRun
from skilld.agentskills._build import (
    INSTRUCTIONS,
    RUN_SCRIPT,
    AgentSkillSource,
    describe,
    install_requirements,
    is_agent_skill,
    mime_type,
    pack,
    read_source,
    reparse,
    requirements_of,
    resource_uri,
    runnable_scripts,
    scripts_of,
)
from skilld.agentskills._executors import NativeExecutor, WasmExecutor, tree_grants
from skilld.agentskills._kept import CALLER_KEPT_BYTES, TOTAL_KEPT_BYTES, KeptOutputs
from skilld.agentskills._listing import available_skills_xml
from skilld.agentskills._plan import (
    DEBIAN_PACKAGES,
    SYSTEM_FILES,
    Plan,
    declared_programs,
    missing_program_message,
    plan,
)
from skilld.agentskills._skillmd import SKILL_MD, SkillMd, parse_skill_md, parse_skill_text
from skilld.agentskills._tools import ToolNeeds, tools_to_needs
from skilld.errors import BundleError
from skilld.types import Limits, SkillSpec


def open_backend(
    spec: SkillSpec,
    root: Path,
    env: Path | None,
    executor: str,
    scripts: Mapping[str, Any],
    grants: Mapping[str, Any],
    limits: Limits,
    runner: Any = None,
    *,
    work: Path | None = None,
    plan: Mapping[str, Any] | None = None,
    digests: Mapping[str, str] | None = None,
    kept: KeptOutputs | None = None,
) -> AgentSkillBackend:
    """The backend serving one Agent Skill of a verified bundle.

    ``executor`` is the lock's (``wasm``, ``native``, ``none`` without scripts);
    ``scripts`` and ``grants`` are the skill's policy tables; ``runner`` the loaded
    CPython runner component (``wasm`` only); ``work`` the node's work directory
    (``skilld.paths.make_work_dir``), where each call's workspace is made; without it,
    the ``work`` directory of ``skilld.paths.state_dir("scratch")``; ``plan`` the lock's
    record of how its scripts run (``Plan.as_lock``: interpreters, programs, what is
    unavailable); ``digests`` the lock's sha256 of each of its files, by path inside the
    skill; ``kept`` the node's store of outputs kept for their callers (without it, one
    of the backend's own).

    Raises:
        BundleError: a ``wasm`` skill in a bundle without the runner component.
    """
    if work is None:
        work = paths.make_work_dir(paths.state_dir("scratch"))
    chosen: ScriptExecutor | None = None
    plan = plan or {}
    if executor == "wasm":
        if runner is None:
            raise BundleError(
                f"skill '{spec.id}' runs its scripts in the wasm executor, but the bundle "
                "holds no runner component",
                location=spec.id,
            )
        chosen = WasmExecutor(spec.id, root, runner, grants.get("fs") or ())
    elif executor == "native":
        interpreters = scripts.get("interpreters")
        if interpreters is None:
            interpreters = plan.get("interpreters") or ("python",)
        chosen = NativeExecutor(
            spec.id, root, env, interpreters, grants, limits, work, plan.get("programs") or (),
            operator_programs=scripts.get("programs") or (),
            temp_paths=scripts.get("temp_paths") or (),
        )  # fmt: skip
    return AgentSkillBackend(
        spec,
        root,
        chosen,
        work,
        unavailable=plan.get("unavailable") or {},
        digests=digests,
        kept=kept,
    )


__all__ = [
    "ACTIVATE",
    "ACTIVATION_ID",
    "ACTIVATION_THRESHOLD",
    "ACTIVATION_TOOL",
    "CALLER_KEPT_BYTES",
    "DEBIAN_PACKAGES",
    "INSTRUCTIONS",
    "RUN_SCRIPT",
    "SKILL_MD",
    "SYSTEM_FILES",
    "TOTAL_KEPT_BYTES",
    "ActivationBackend",
    "AgentSkillBackend",
    "AgentSkillSource",
    "KeptOutputs",
    "NativeExecutor",
    "Plan",
    "ScriptExecutor",
    "ScriptRun",
    "SkillMd",
    "ToolNeeds",
    "WasmExecutor",
    "available_skills_xml",
    "declared_programs",
    "describe",
    "install_requirements",
    "is_agent_skill",
    "mime_type",
    "missing_program_message",
    "open_backend",
    "pack",
    "parse_skill_md",
    "parse_skill_text",
    "plan",
    "read_source",
    "reparse",
    "requirements_of",
    "resource_uri",
    "runnable_scripts",
    "scripts_of",
    "tools_to_needs",
    "tree_grants",
]
