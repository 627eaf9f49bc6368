"""Build time for Agent Skills: read a directory, pack it, bake its dependencies.

``skilld build`` (``skilld.bundle``) calls these for each directory of ``skills/``
that holds a ``SKILL.md`` and no ``skill.yaml``, and for each pre-packed ``.skill``
whose manifest says ``kind: agent-skill``:

1. :func:`read_source` validates ``SKILL.md`` and collects every file (regular files
   only, names the ``.skill`` format accepts), and :func:`pack` puts them in the same
   signed package format as wasm skills, every file's sha256 in the signed manifest;
2. :func:`install_requirements` installs ``requirements.txt`` (beside the scripts or
   at the top) and the policy's ``scripts.requirements`` from a local wheelhouse,
   offline, into the skill's own environment in the bundle;
3. ``_plan`` reads what the scripts need and chooses their executor (``wasm`` or
   ``native``), saying what each script lacks;
4. :func:`describe` is what the skill serves: its tier tools, resources and prompt.
"""

from __future__ import annotations

import hashlib
import mimetypes
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from skilld.agentskills._skillmd import SKILL_MD, SkillMd, parse_skill_text
from skilld.errors import AgentSkillError, PackageFormatError
from skilld.package import SigningKey, SkillMeta, build_package, check_name
from skilld.types import MethodSpec, PromptSpec, ResourceSpec, SkillSpec

SCRIPTS = "scripts/"
REQUIREMENTS = ("scripts/requirements.txt", "requirements.txt")
INSTRUCTIONS = "instructions"
RUN_SCRIPT = "run_script"
# Files a client may hand to one run_script call (their bytes are capped in _backend).
MAX_INPUT_FILES = 1024
# Files that are never part of a skill: caches and editor or OS droppings.
_SKIP_DIRS = frozenset({"__pycache__", ".git", ".pytest_cache", ".mypy_cache", ".ruff_cache"})
_SEMVER = re.compile(r"\d+\.\d+\.\d+")
_PIP_MISSING = re.compile(r"No matching distribution found for ([A-Za-z0-9._\[\]-]+)")
# Interpreter by the script's extension (what the native executor starts); a file
# under scripts/ with another extension is data, not a script.
INTERPRETERS = {
    ".py": "python",
    ".sh": "bash",
    ".bash": "bash",
    ".js": "node",
    ".mjs": "node",
    ".cjs": "node",
    ".rb": "ruby",
    ".pl": "perl",
}
# Package markers and requirement lists are not scripts either.
_NOT_SCRIPTS = frozenset({"__init__.py", "requirements.txt"})
# Extensions the mimetypes table of a minimal system may not know.
_MIME = {".md": "text/markdown", ".py": "text/x-python", ".sh": "text/x-shellscript"}


@dataclass(frozen=True, slots=True)
class AgentSkillSource:
    """A validated Agent Skills directory, read into memory: what gets packed."""

    origin: Path
    md: SkillMd
    files: Mapping[str, bytes]


def is_agent_skill(directory: Path) -> bool:
    """True for a directory holding ``SKILL.md`` and no ``skill.yaml`` (a wasm skill's)."""
    return (directory / SKILL_MD).is_file() and not (directory / "skill.yaml").is_file()


def read_source(directory: Path, *, lenient: bool = False) -> AgentSkillSource:
    """Validate ``directory`` and read its files.

    Raises:
        AgentSkillError: SKILL.md is invalid (``SKILL.md:LINE: field: ...``), or a file
            is a symbolic link, not regular, or has a name packages cannot hold.
    """
    files: dict[str, bytes] = {}
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory)
        if _SKIP_DIRS.intersection(rel.parts) or path.name == ".DS_Store":
            continue
        where = f"{directory.name}/{rel.as_posix()}"
        if path.is_symlink():
            raise AgentSkillError(
                "is a symbolic link; a skill holds regular files only",
                location=where,
                hint="copy the file in, or leave it out",
            )
        if path.is_dir():
            continue
        if not path.is_file():
            raise AgentSkillError("is not a regular file", location=where)
        try:
            check_name(rel.as_posix())
        except PackageFormatError as exc:
            raise AgentSkillError(
                exc.message, location=where, hint="rename it: letters, digits, '.', '_', '-'"
            ) from exc
        files[rel.as_posix()] = path.read_bytes()
    text = _text(files, f"{directory.name}/{SKILL_MD}")
    md = parse_skill_text(
        text, directory.name, source=f"{directory.name}/{SKILL_MD}", lenient=lenient
    )
    return AgentSkillSource(directory, md, files)


def reparse(skill_id: str, files: Mapping[str, bytes], *, lenient: bool) -> SkillMd:
    """Validate the SKILL.md of a verified package (its directory is its id).

    Raises:
        AgentSkillError: as :func:`read_source`.
    """
    source = f"{skill_id}/{SKILL_MD}"
    return parse_skill_text(_text(files, source), skill_id, source=source, lenient=lenient)


def _text(files: Mapping[str, bytes], source: str) -> str:
    try:
        return files[SKILL_MD].decode("utf-8")
    except KeyError:
        raise AgentSkillError("Missing required file: SKILL.md", location=source) from None
    except UnicodeDecodeError as exc:
        raise AgentSkillError(f"SKILL.md is not UTF-8: {exc}", location=source) from exc


def version_of(md: SkillMd, files: Mapping[str, bytes]) -> str:
    """The package version: ``metadata.version`` when it is ``X.Y.Z``, else ``0.0.0``;
    with the content's digest as build metadata, so each content has its own version."""
    h = hashlib.sha256()
    for name, data in sorted(files.items()):
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    declared = md.metadata.get("version", "")
    core = declared if _SEMVER.fullmatch(declared) else "0.0.0"
    return f"{core}+sha.{h.hexdigest()[:12]}"


def pack(
    src: AgentSkillSource, *, keys: Sequence[SigningKey], epoch: int | None = None
) -> tuple[bytes, str]:
    """The signed ``.skill`` bytes of an Agent Skill, and its version.

    Raises:
        PackageFormatError: a field the manifest cannot hold (a control character).
    """
    version = version_of(src.md, src.files)
    meta = SkillMeta(
        id=src.md.id, name=src.md.name, version=version, description=src.md.description
    )
    return build_package(meta, None, files=dict(src.files), keys=keys, epoch=epoch), version


def scripts_of(files: Mapping[str, bytes]) -> list[str]:
    """The skill's scripts: every file under ``scripts/`` but its requirements."""
    return sorted(n for n in files if n.startswith(SCRIPTS) and n not in REQUIREMENTS)


def runnable_scripts(files: Iterable[str]) -> list[str]:
    """The files under ``scripts/`` that are scripts: a known interpreter's extension,
    neither a package marker (``__init__.py``) nor data (an ``.xml``, a template)."""
    return sorted(
        n
        for n in files
        if n.startswith(SCRIPTS)
        and n not in REQUIREMENTS
        and Path(n).suffix.lower() in INTERPRETERS
        and Path(n).name not in _NOT_SCRIPTS
    )


def requirements_of(skill_id: str, files: Mapping[str, bytes], policy: Sequence[str]) -> list[str]:
    """Requirement lines from ``requirements.txt`` (beside the scripts, or at the top)
    and the policy's ``scripts.requirements``.

    Raises:
        AgentSkillError: a line is an option or a URL (pip would fetch or widen the
            index); only ``NAME``, ``NAME[extra]`` and version specifiers are taken.
    """
    out = list(policy)
    for name in REQUIREMENTS:
        if name not in files:
            continue
        for number, raw in enumerate(files[name].decode("utf-8", "replace").splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            if line.startswith("-") or "://" in line or "@" in line or "/" in line:
                raise AgentSkillError(
                    f"requirement {line!r} is an option, a path or a URL",
                    location=f"{skill_id}/{name}:{number}",
                    hint="name packages only; the build installs them from the wheelhouse",
                )
            out.append(line)
    return out


def install_requirements(
    skill_id: str, requirements: Sequence[str], wheelhouse: Path | None, target: Path
) -> None:
    """Install ``requirements`` into ``target`` from ``wheelhouse``: offline, wheels only.

    Raises:
        AgentSkillError: no wheelhouse, or a package (named) has no wheel in it, or pip
            failed (its output in the message).
    """
    if not requirements:
        return
    if wheelhouse is None or not wheelhouse.is_dir():
        raise AgentSkillError(
            f"skill '{skill_id}' needs {', '.join(requirements)} but no wheelhouse was given",
            location=skill_id,
            hint="pass 'skilld build --wheelhouse DIR' holding their wheels",
        )
    cmd = [
        sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--find-links",
        str(wheelhouse), "--only-binary", ":all:", "--no-compile", "--disable-pip-version-check",
        "--no-warn-script-location", "--target", str(target), *requirements,
    ]  # fmt: skip
    done = subprocess.run(
        cmd, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL
    )
    if done.returncode != 0:
        missing = _PIP_MISSING.search(done.stderr)
        if missing:
            raise AgentSkillError(
                f"skill '{skill_id}' needs package '{missing[1]}', which has no wheel in "
                f"{wheelhouse}",
                location=skill_id,
                hint="add its wheel: pip download --only-binary :all: "
                f"-d {wheelhouse} {missing[1]}",
            )
        raise AgentSkillError(
            f"installing the requirements of '{skill_id}' failed: {done.stderr.strip()[-2000:]}",
            location=skill_id,
        )


def mime_type(path: str) -> str:
    """The MIME type a skill file is served with (``text/markdown`` for SKILL.md)."""
    suffix = Path(path).suffix.lower()
    return _MIME.get(suffix) or mimetypes.guess_type(path)[0] or "application/octet-stream"


def resource_uri(skill_id: str, path: str) -> str:
    """``skill://NAME/PATH``: how a skill's file is addressed as an MCP resource."""
    return f"skill://{skill_id}/{path}"


def describe(md: SkillMd, version: str, files: Mapping[str, bytes]) -> SkillSpec:
    """What the skill serves: tier tools (instructions; run_script when it has scripts),
    every file as a resource and its body as a prompt."""
    methods = [MethodSpec(INSTRUCTIONS, md.description, {"type": "object", "properties": {}})]
    scripts = runnable_scripts(files)
    if scripts:
        methods.append(
            MethodSpec(
                RUN_SCRIPT,
                f"Run one of the scripts of the skill '{md.id}' (read its instructions first). "
                "Returns its exit status, stdout, stderr and the files it wrote.",
                {
                    "type": "object",
                    "properties": {
                        "script": {"enum": scripts, "description": "the script to run"},
                        "args": {
                            "type": "array",
                            "items": {"type": "string"},
                            "description": "its arguments",
                        },
                        "stdin": {"type": "string", "description": "its standard input"},
                        "input": {"description": "JSON given on standard input instead"},
                        "files": {
                            "type": "array",
                            "maxItems": MAX_INPUT_FILES,
                            "description": "files placed in the script's working directory "
                            "before it runs (32 MiB in all; an unpacked document's parts "
                            "may go as one file each, with their folders in path): each {path, "
                            "and one of content "
                            "(base64), text, or uri (a skill:// resource of this skill, such "
                            "as an earlier run's output)}",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "path": {"type": "string"},
                                    "content": {"type": "string"},
                                    "text": {"type": "string"},
                                    "uri": {"type": "string"},
                                },
                                "required": ["path"],
                                "additionalProperties": False,
                            },
                        },
                    },
                    "required": ["script"],
                    "additionalProperties": False,
                },
            )
        )
    resources = tuple(
        ResourceSpec(
            resource_uri(md.id, name),
            f"{md.id}/{name}",
            f"{name} of the skill '{md.id}' ({len(data)} bytes)",
            mime_type(name),
        )
        for name, data in sorted(files.items())
    )
    if scripts:
        resources += (
            ResourceSpec(
                resource_uri(md.id, "runs/{run}/{file}"),
                f"{md.id}/runs",
                f"a large file a run of a script of '{md.id}' wrote, kept for a while",
                None,
                template=True,
            ),
        )
    prompt = PromptSpec(md.id, md.description, {"type": "object", "properties": {}})
    return SkillSpec(md.id, version, md.description, tuple(methods), resources, (prompt,))
