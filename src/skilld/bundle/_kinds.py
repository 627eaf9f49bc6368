"""The kinds of skill a build takes from source, one seam each.

A kind finds its sources in the skills directory (:meth:`SkillKind.find`) and packs
each into a signed ``.skill`` (:attr:`Source.pack`); ``_build.py`` loops over
:data:`KINDS` instead of branching on them. A new kind of skill is one class here.

- :class:`WasmComponents`: ``NAME/skill.yaml`` (+ ``skill.py`` or ``skill.wat``),
  compiled to a component;
- :class:`AgentSkills`: ``NAME/SKILL.md`` directories, validated and packed;
- :class:`DelegateKits`: with kits in ``policies/kits/``, the CPython runner their
  programs run in, built like a source skill.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from skilld import agentskills, package, paths
from skilld.package.build import build_component

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
    progress: Progress = field(default=lambda _msg: None, compare=False)


@dataclass(frozen=True, slots=True)
class Source:
    """One skill a kind builds from source: its id, where it comes from, how to pack it.

    ``pack(key, epoch)`` returns the signed package's bytes and its version.
    """

    id: str
    origin: Path
    pack: Callable[[package.SigningKey, int], tuple[bytes, str]]


class SkillKind(Protocol):
    """What a kind of skill does at build time: find its sources (then pack each)."""

    name: str

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


class DelegateKits:
    """delegate's kits: their programs run in the CPython runner, built like a source skill."""

    name = "delegate kit"

    def find(self, skills_dir: Path, policies_dir: Path, options: BuildOptions) -> Sequence[Source]:
        """The runner, when ``policies/kits/`` holds a kit."""
        kits = policies_dir / "kits"
        if kits.is_dir() and any(p.suffix in (".yaml", ".yml") for p in kits.iterdir()):
            return [_component_source(paths.runner_dir(), options)]
        return []


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


KINDS: tuple[SkillKind, ...] = (WasmComponents(), DelegateKits(), AgentSkills())
