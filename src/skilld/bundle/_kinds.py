"""The kinds of skill a build takes, one seam each.

Each step of ``_build.py`` is a loop over :data:`KINDS`, never a branch on them, and
no kind depends on the order of the others:

1. :meth:`SkillKind.find`: its sources in the skills directory, each packed into a
   signed ``.skill`` (:attr:`Source.pack`);
2. :meth:`SkillKind.needs`: once every package is verified, the needs each of its
   skills declares, for the policy compile (an Agent Skill's come from its
   ``allowed-tools`` mapped against its grants);
3. :meth:`SkillKind.stage`: with the policy compiled, its own skills into the bundle;
4. :meth:`SkillKind.finish`: once every kind staged, what depends on other kinds'
   skills (a kit's tools are methods of staged components; the CPython runner is
   shared with a component that is the runner).

A new kind of skill is one class here.

- :class:`WasmComponents`: ``NAME/skill.yaml`` (+ ``skill.py`` or ``skill.wat``),
  compiled to a component;
- :class:`AgentSkills`: ``NAME/SKILL.md`` directories, validated and packed;
- :class:`DelegateKits`: with kits in ``policies/kits/``, the CPython runner their
  programs run in, built like a source skill.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from skilld import agentskills, package, paths
from skilld.bundle._lock import LockedAgentSkill, LockedRunner, LockedSkill
from skilld.call import CallContext, NullChannel
from skilld.errors import AgentSkillError, BundleError
from skilld.package.build import build_component
from skilld.policy import RUNNER, CompileResult, check_kit_methods
from skilld.sandbox import Sandbox, write_native
from skilld.types import Limits

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class BuildOptions:
    """How ``skilld build`` builds a bundle (everything but its inputs and the sandbox).

    Attributes:
        skill_key: signs skills built from source; without it an ephemeral key does,
            and its public half (scoped to exactly those skills) joins the trust set.
        bundle_key: signs ``bundle.lock`` (``bundle.lock.sig``).
        previous: an earlier ``bundle.lock``; lower skill versions are refused
            unless ``allow_downgrade``.
        allow_downgrade: accept lower versions than ``previous``'s.
        strict: needs that no grant covers are errors (otherwise warnings).
        cache_dir: the build and native-code cache (default: ``skilld.paths.cache_dir()``).
        lenient: load Agent Skills the way the specification's client guide allows
            (a name that differs from its directory, over-long name or description:
            warnings).
        wheelhouse: where Agent Skills' Python requirements are installed from
            (offline; a missing wheel is an error naming the skill and package).
        sources: the ``sources.yaml`` listing packages in registries and image layouts
            (default: the skills directory's, when it has one).
        locked: an earlier ``bundle.lock`` whose digests the sources are fetched at
            (a moved tag stays pinned; an entry the lock lacks is refused).
        progress: told each step, one line at a time.
    """

    skill_key: Path | None = None
    bundle_key: Path | None = None
    previous: Path | None = None
    allow_downgrade: bool = False
    strict: bool = True
    cache_dir: Path | None = None
    lenient: bool = False
    wheelhouse: Path | None = None
    sources: Path | None = None
    locked: Path | None = None
    progress: Progress = field(default=lambda _msg: None, compare=False)


@dataclass(frozen=True, slots=True)
class BuildSummaryRow:
    """One line of the build's summary table."""

    id: str
    version: str
    methods: int
    grants: str
    package_bytes: int
    native_bytes: int


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(0o444)


@dataclass(frozen=True, slots=True)
class Verified:
    """What every kind works from once the packages are verified: the stage directory,
    the sandbox, the options and every verified package (``(collected, verified)``)."""

    stage: Path
    sandbox: Sandbox
    options: BuildOptions
    packages: list[tuple[Any, package.VerifiedPackage]]


@dataclass(frozen=True, slots=True)
class Staging(Verified):
    """What every kind stages from: :class:`Verified`, and the compiled policy."""

    compiled: CompileResult


@dataclass(frozen=True, slots=True)
class Declared:
    """One skill's declared needs for the policy compile (``None``: none declared, its
    grants are taken as they are) and where they were read, for findings."""

    needs: Mapping[str, Any] | None
    source: str | None = None


# A skill's grants as its policy states them, compiled without anyone's needs.
Grants = Callable[[str], Mapping[str, Any]]


@dataclass(slots=True)
class Staged:
    """What the kinds staged, for ``bundle.lock`` and the summary."""

    locked: list[LockedSkill] = field(default_factory=list)
    agents: list[LockedAgentSkill] = field(default_factory=list)
    runner: LockedRunner | None = None
    rows: list[BuildSummaryRow] = field(default_factory=list)
    # An Agent Skill runs scripts in the CPython runner (``AgentSkills.finish`` provides it).
    wants_runner: bool = False


@dataclass(frozen=True, slots=True)
class Source:
    """One skill a kind builds from source: its id, where it comes from, how to pack it.

    ``pack(key, epoch)`` returns the signed package's bytes and its version.
    """

    id: str
    origin: Path
    pack: Callable[[package.SigningKey, int], tuple[bytes, str]]


class SkillKind(Protocol):
    """What a kind of skill does at build time (the module's four steps)."""

    name: str

    def needs(self, verified: Verified, grants: Grants) -> dict[str, Declared]:
        """The declared needs of this kind's skills among the verified packages, by id.

        Raises:
            SkilldError: a package's declaration cannot be read (names its file).
        """
        ...

    def stage(self, staging: Staging, staged: Staged) -> None:
        """Stage this kind's packages of ``staging`` into the bundle; record them in ``staged``.

        Raises:
            SkilldError: a package cannot be staged (names its origin).
        """
        ...

    def finish(self, staging: Staging, staged: Staged) -> None:
        """After every kind staged: what needs other kinds' staged skills.

        Raises:
            SkilldError: what was staged does not fit together (names the file).
        """
        ...

    def find(self, skills_dir: Path, policies_dir: Path, options: BuildOptions) -> Sequence[Source]:
        """The sources of this kind under ``skills_dir`` (announced through ``progress``).

        Raises:
            SkilldError: a source is invalid (names its file and line).
        """
        ...


def _component_source(d: Path, options: BuildOptions) -> Source:
    meta = package.read_skill_meta(d)

    def pack(key: package.SigningKey, epoch: int) -> tuple[bytes, str]:
        options.progress(f"building {meta.id} {meta.version} from {d}")
        component = build_component(d, cache_dir=options.cache_dir).read_bytes()
        return package.pack_directory(d, component, keys=[key], epoch=epoch), meta.version

    return Source(meta.id, d, pack)


class WasmComponents:
    """Source skills (``skill.yaml``): built with componentize-py or from WebAssembly text."""

    name = "wasm component"

    def find(self, skills_dir: Path, policies_dir: Path, options: BuildOptions) -> Sequence[Source]:
        """Every ``NAME/skill.yaml`` directory."""
        dirs = [d for d in sorted(skills_dir.iterdir()) if (d / "skill.yaml").is_file()]
        return [_component_source(d, options) for d in dirs]

    def needs(self, verified: Verified, grants: Grants) -> dict[str, Declared]:
        """Each component's manifest ``needs`` (the runner's grants are the kits', no policy's)."""
        return {
            v.manifest.id: Declared(dict(v.manifest.needs))
            for _c, v in verified.packages
            if v.manifest.kind != package.KIND_AGENT_SKILL and v.manifest.id != RUNNER
        }

    def stage(self, staging: Staging, staged: Staged) -> None:
        """AOT-compile each component, ask it to describe itself, lock both."""
        stage, compiled, progress = staging.stage, staging.compiled, staging.options.progress
        for c, v in staging.packages:
            if v.manifest.kind == package.KIND_AGENT_SKILL:
                continue
            sid, version = v.manifest.id, v.manifest.version
            progress(f"compiling {sid} {version} to native code")
            granted = compiled.grants_of(sid)
            comp = staging.sandbox.load(v.component, name=sid, granted=granted)
            native_rel = f"native/{sid}.cwasm"
            native_sha = write_native(comp.native, stage / native_rel)
            (stage / native_rel).chmod(0o444)
            no_client = NullChannel("describe may not ask the client")
            spec = comp.describe(CallContext(sid, Limits(), no_client))
            if (spec.id, spec.version) != (sid, version):
                raise BundleError(
                    f"the component describes itself as {spec.id} {spec.version}, but its "
                    f"signed manifest says {sid} {version}",
                    location=str(c.origin),
                )
            staged.locked.append(
                LockedSkill(
                    id=sid,
                    version=version,
                    package=c.path.relative_to(stage).as_posix(),
                    component_sha256=_sha256(v.component),
                    native=native_rel,
                    native_sha256=native_sha,
                    signers=tuple(v.signers),
                    description=v.manifest.description or spec.description,
                    imports=tuple(sorted(comp.imports)),
                    spec=spec.as_dict(),
                )
            )
            staged.rows.append(
                BuildSummaryRow(
                    sid,
                    version,
                    len(spec.methods),
                    ", ".join(sorted(granted - {"log", "mcp"})) or "-",
                    c.path.stat().st_size,
                    (stage / native_rel).stat().st_size,
                )
            )

    def finish(self, staging: Staging, staged: Staged) -> None:
        """Nothing: components stand alone."""


class DelegateKits:
    """delegate's kits: their programs run in the CPython runner, built like a source skill."""

    name = "delegate kit"

    def find(self, skills_dir: Path, policies_dir: Path, options: BuildOptions) -> Sequence[Source]:
        """The runner, when ``policies/kits/`` holds a kit."""
        kits = policies_dir / "kits"
        if kits.is_dir() and any(p.suffix in (".yaml", ".yml") for p in kits.iterdir()):
            return [_component_source(paths.runner_dir(), options)]
        return []

    def needs(self, verified: Verified, grants: Grants) -> dict[str, Declared]:
        """None: the kits are policy (``policies/kits/``); their runner is a component."""
        return {}

    def stage(self, staging: Staging, staged: Staged) -> None:
        """Nothing of its own: the runner is staged as a component."""

    def finish(self, staging: Staging, staged: Staged) -> None:
        """Check that every kit's tools are methods the staged components describe."""
        check_kit_methods(
            staging.compiled.tables.kits,
            {s.id: {m["name"] for m in s.spec.get("methods", ())} for s in staged.locked},
        )


class AgentSkills:
    """Agent Skills (``SKILL.md``): validated, then packed with their files."""

    name = "Agent Skill"

    def find(self, skills_dir: Path, policies_dir: Path, options: BuildOptions) -> Sequence[Source]:
        """Every Agent Skills directory; its SKILL.md warnings go to ``progress``."""
        out = []
        for d in sorted(skills_dir.iterdir()):
            if not (d.is_dir() and agentskills.is_agent_skill(d)):
                continue
            source = agentskills.read_source(d, lenient=options.lenient)
            for warning in source.md.warnings:
                options.progress(f"warning: {warning}")

            def pack(
                key: package.SigningKey, epoch: int, a: agentskills.AgentSkillSource = source
            ) -> tuple[bytes, str]:
                options.progress(f"packing Agent Skill {a.md.id} from {a.origin}")
                return agentskills.pack(a, keys=[key], epoch=epoch)

            out.append(Source(source.md.id, source.origin, pack))
        return out

    def needs(self, verified: Verified, grants: Grants) -> dict[str, Declared]:
        """Each Agent Skill's ``allowed-tools``, mapped to needs against its grants
        (``Read``: the fs paths the operator granted); the findings go to ``progress``.
        """
        out = {}
        progress = verified.options.progress
        for sid, md in _parsed(verified.packages, verified.options).items():
            mapped = agentskills.tools_to_needs(
                md.allowed_tools, grants(sid), md.allowed_tools_line
            )
            for note in mapped.findings:
                progress(f"warning: {sid}/SKILL.md: {note}")
            out[sid] = Declared(mapped.needs, f"{sid}/SKILL.md")
        return out

    def stage(self, staging: Staging, staged: Staged) -> None:
        """Unpack each Agent Skill and bake its requirements; say whether one needs the
        CPython runner (``finish`` provides it).

        Raises:
            AgentSkillError: a system program the policy names is missing; or, unless
                ``lenient``, any script cannot run under its executor (every finding at
                once, each at ``SKILL/path:line``: a package without a wheel, a shell
                script or a process under wasm, a program the host lacks).
        """
        agents = [
            (c, v) for c, v in staging.packages if v.manifest.kind == package.KIND_AGENT_SKILL
        ]
        if not agents:
            return
        stage, mds = staging.stage, _parsed(agents, staging.options)
        tables, progress = staging.compiled.tables, staging.options.progress
        wheelhouse = staging.options.wheelhouse
        findings: list[str] = []
        for c, v in agents:
            sid, version = v.manifest.id, v.manifest.version
            scripts = tables.scripts(sid)
            _trees, globs = agentskills.tree_grants(tables.skill(sid).get("fs") or ())
            runnable = agentskills.runnable_scripts(v.files)
            if globs and runnable:
                progress(
                    f"warning: {sid}: scripts do not get the glob fs grant(s) {', '.join(globs)} "
                    "(the kernel names directories); grant a directory tree instead"
                )
            root = f"agentskills/{sid}/files"
            for name, data in v.files.items():
                _write(stage / root / name, data)
            requirements = agentskills.requirements_of(sid, v.files, scripts["requirements"])
            # Programs the operator named must be here, whatever the mode: the policy is
            # the operator's word. Those the skill names alone make its scripts unavailable.
            missing = [p for p in scripts["programs"] if shutil.which(p) is None]
            if missing:
                raise AgentSkillError(
                    f"skill '{sid}' needs the system program(s) "
                    f"{agentskills.missing_program_message(missing)}, which this image lacks",
                    location=f"policies/{sid}.yaml",
                    hint="install them in the image (docs/agent-skills.md, 'System programs')",
                )
            planned = agentskills.plan(
                sid,
                v.files,
                policy_executor=scripts["executor"],
                requirements=requirements,
                programs=agentskills.declared_programs(mds[sid].metadata, scripts["programs"]),
                policy_interpreters=scripts["interpreters"],
                wheelhouse=wheelhouse,
            )
            findings += planned.findings
            env = ""
            if planned.executor == "wasm":
                staged.wants_runner = True
            elif planned.executor == "native" and planned.distributions:
                env = f"agentskills/{sid}/env"
                progress(
                    f"installing {', '.join(planned.distributions)} for {sid} from {wheelhouse}"
                )
                try:
                    agentskills.install_requirements(
                        sid, planned.distributions, wheelhouse, stage / env
                    )
                except AgentSkillError as exc:
                    findings.append(f"{sid}: {exc.message}")
                    planned = replace(
                        planned,
                        unavailable=dict.fromkeys(runnable, exc.message)
                        | dict(planned.unavailable),
                    )
                    env = ""
            if runnable:
                progress(f"{sid}: scripts run {planned.executor}: {planned.reason}")
            if runnable and planned.programs:
                # The operator sees what a skill's own metadata made executable for it.
                progress(f"{sid}: scripts may start {', '.join(planned.programs)}")
            for script, why in sorted(planned.unavailable.items()):
                progress(f"warning: {sid}/{script}: unavailable: {why}")
            spec = agentskills.describe(mds[sid], version, v.files)
            staged.agents.append(
                LockedAgentSkill(
                    id=sid,
                    version=version,
                    package=c.path.relative_to(stage).as_posix(),
                    root=root,
                    env=env,
                    executor=planned.executor,
                    signers=tuple(v.signers),
                    description=mds[sid].description,
                    spec=spec.as_dict(),
                    scripts=planned.as_lock() if runnable else {},
                )
            )
        if findings and not staging.options.lenient:
            raise AgentSkillError(
                "scripts that cannot run here:\n  " + "\n  ".join(findings),
                location=findings[0].split(": ", 1)[0],
                hint="give them what they need (a wheel, a program, "
                "'scripts: {executor: native}'), or build with --lenient to serve the skills "
                "with those scripts unavailable",
            )
        for c, v in agents:
            # The grants column says, for an Agent Skill, which executor and why.
            a = next(a for a in staged.agents if a.id == v.manifest.id)
            gaps = len(a.scripts.get("unavailable", ()))
            staged.rows.append(
                BuildSummaryRow(
                    v.manifest.id,
                    v.manifest.version,
                    len(mds[v.manifest.id].allowed_tools),
                    f"{a.executor} ({a.scripts.get('reason', 'no scripts')})"
                    + (f"; {gaps} script(s) unavailable" if gaps else ""),
                    c.path.stat().st_size,
                    0,
                )
            )

    def finish(self, staging: Staging, staged: Staged) -> None:
        """The CPython runner, when a wasm-executor skill needs it: the staged component
        when the bundle holds the runner as a skill (delegate's kits), else built here."""
        if not staged.wants_runner:
            return
        built = next((s for s in staged.locked if s.id == RUNNER), None)
        if built is not None:
            staged.runner = LockedRunner(built.component_sha256, built.native, built.native_sha256)
            return
        staging.options.progress("building the CPython runner component for the wasm executor")
        cache_dir = staging.options.cache_dir
        wasm = build_component(paths.runner_dir(), cache_dir=cache_dir).read_bytes()
        comp = staging.sandbox.load(wasm, name="pyrunner")
        native_rel = "native/_pyrunner.cwasm"
        native_sha = write_native(comp.native, staging.stage / native_rel)
        staged.runner = LockedRunner(_sha256(wasm), native_rel, native_sha)


def _parsed(
    packages: Sequence[tuple[Any, package.VerifiedPackage]], options: BuildOptions
) -> dict[str, agentskills.SkillMd]:
    """The Agent Skills among ``packages``: their SKILL.md, parsed from the verified files."""
    return {
        v.manifest.id: agentskills.reparse(v.manifest.id, v.files, lenient=options.lenient)
        for _c, v in packages
        if v.manifest.kind == package.KIND_AGENT_SKILL
    }


KINDS: tuple[SkillKind, ...] = (WasmComponents(), DelegateKits(), AgentSkills())
