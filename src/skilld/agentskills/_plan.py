"""How an Agent Skill's scripts will run: read from the scripts, decided at build.

``skilld build`` reads every script of a skill (:func:`script_needs`): its interpreter
(by extension), the modules a Python script imports that are neither the standard
library nor the skill's own (a ``.py`` file or a folder of the skill, with or without
``__init__.py``), whether it starts processes (``subprocess``, ``os.system``, ...).
:func:`plan` then chooses the executor, unless the policy's ``scripts.executor`` did:

- only standard-library Python that starts no process: ``wasm`` (the CPython runner
  component, no host process at all);
- anything else (packages, a shell script, ``subprocess``): ``native``, a confined host
  process, when the build has what it needs: the interpreter on this host, a wheel in
  the wheelhouse for each package, every declared system program.

What one script lacks makes that script *unavailable*, never the skill: in lenient
builds the skill is still served in every tier and ``run_script`` answers
``unavailable`` with the reason (:class:`Plan.unavailable`); strict builds refuse
with every finding at once, each at ``SKILL/path:line``.

System programs (``pdfinfo``, ``soffice``) are declared, never discovered: by the
operator (``scripts.programs`` in the skill's policy) or by the skill
(``metadata.system-programs``, space- or comma-separated). A program the build host
lacks is refused naming the Debian package that carries it (:data:`DEBIAN_PACKAGES`).
"""

from __future__ import annotations

import ast
import re
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skilld.agentskills._build import INTERPRETERS, SCRIPTS, runnable_scripts

# Calls that start a process (the wasm executor cannot: WASI has no processes).
_PROCESS_MODULES = frozenset({"subprocess", "multiprocessing", "pty", "concurrent.futures"})
_PROCESS_CALLS = frozenset(
    {"system", "popen", "spawnl", "spawnv", "spawnvp", "execv", "execvp", "fork", "posix_spawn"}
)
# Import name -> distribution, where they differ (the distribution's name otherwise).
DISTRIBUTIONS = {
    "yaml": "PyYAML",
    "PIL": "Pillow",
    "docx": "python-docx",
    "pptx": "python-pptx",
    "fitz": "PyMuPDF",
    "cv2": "opencv-python-headless",
    "bs4": "beautifulsoup4",
    "dateutil": "python-dateutil",
    "dotenv": "python-dotenv",
    "sklearn": "scikit-learn",
    "mcp": "mcp",
}
# Program -> the Debian package that installs it (what the refusal tells the operator).
DEBIAN_PACKAGES = {
    "pdfinfo": "poppler-utils",
    "pdftoppm": "poppler-utils",
    "pdftotext": "poppler-utils",
    "pdfimages": "poppler-utils",
    "soffice": "libreoffice-core (with libreoffice-writer, -calc, -impress)",
    "libreoffice": "libreoffice-core",
    "qpdf": "qpdf",
    "pandoc": "pandoc",
    "gs": "ghostscript",
    "convert": "imagemagick",
    "magick": "imagemagick",
    "tesseract": "tesseract-ocr",
    "node": "nodejs",
    "npm": "npm",
    "git": "git",
    "ffmpeg": "ffmpeg",
    "bash": "bash",
    "ruby": "ruby",
    "perl": "perl",
}
_PROGRAM = re.compile(r"[A-Za-z0-9_.+-]{1,64}")
METADATA_PROGRAMS = "system-programs"
# Files and trees that ordinary libraries read and a confined script may read too:
# MIME tables (mimetypes, openpyxl), CA certificates (ssl), fonts and fontconfig's
# system cache (Pillow, matplotlib, LibreOffice), the shared MIME database, the timezone
# database, glibc's locale aliases. Listed once here; docs/agent-skills.md lists them
# too. Only those present on the host are passed.
SYSTEM_FILES = (
    "/etc/mime.types",
    "/usr/share/mime",
    "/etc/ssl/certs",
    "/usr/share/ca-certificates",
    "/etc/fonts",
    "/usr/share/fonts",
    "/usr/local/share/fonts",
    "/usr/share/fontconfig",
    "/var/cache/fontconfig",
    "/usr/share/zoneinfo",
    "/usr/share/poppler",
    "/etc/locale.alias",
)


@dataclass(frozen=True, slots=True)
class ProgramNeeds:
    """What a declared system program needs beyond its own files (``program_tree``).

    ``tools``: programs its own scripts run (executable with it); ``read``: its data and
    configuration outside its installation directory; ``socket_dirs``: directories where
    it makes a listening socket of its own (the runner then refuses ``connect()`` and
    network: ``docs/confinement.md``); ``env``: variables it needs, ``{home}`` being the
    call's private home directory.
    """

    tools: tuple[str, ...] = ()
    read: tuple[str, ...] = ()
    socket_dirs: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)


# LibreOffice (Debian's packages): ``soffice`` is a shell script running the tools below;
# its data and configuration are linked from /usr/lib/libreoffice into /usr/share,
# /etc and /var; it creates its single-instance pipe in /tmp (its path is fixed: osl's
# PIPEDEFAULTPATH) and refuses to start when it cannot; and it finds its user profile
# from the passwd entry of its uid, which a skill's uid does not have, unless
# SYSUSERCONFIG names it.
_LIBREOFFICE = ProgramNeeds(
    tools=("dirname", "basename", "ls", "sed", "grep", "uname"),
    read=("/etc/libreoffice", "/usr/share/libreoffice", "/var/lib/libreoffice",
          "/var/spool/libreoffice"),
    socket_dirs=("/tmp",),  # noqa: S108 - where LibreOffice binds its pipe, not a temp file
    env={"SYSUSERCONFIG": "file://{home}/.config"},
)  # fmt: skip
PROGRAM_NEEDS: Mapping[str, ProgramNeeds] = {
    "soffice": _LIBREOFFICE,
    "libreoffice": _LIBREOFFICE,
}


@dataclass(frozen=True, slots=True)
class ScriptNeeds:
    """What one script needs to run.

    ``imports`` maps each third-party top-level module to the line of its first
    import; ``optional`` holds those imported only inside ``try: ... except
    ImportError``; ``processes`` is the line of its first process start (0: none).
    """

    path: str
    interpreter: str | None
    imports: Mapping[str, int] = field(default_factory=dict)
    optional: frozenset[str] = frozenset()
    processes: int = 0
    syntax_error: str = ""


@dataclass(frozen=True, slots=True)
class Plan:
    """How a skill's scripts run: the executor and why, what it starts, what cannot run.

    ``findings`` are what a strict build refuses (``SKILL/path:line: what``);
    ``warnings`` what a lenient build prints instead. ``unavailable`` maps a script
    to the sentence ``run_script`` answers with.
    """

    executor: str
    reason: str
    interpreters: tuple[str, ...] = ()
    programs: tuple[str, ...] = ()
    distributions: tuple[str, ...] = ()
    unavailable: Mapping[str, str] = field(default_factory=dict)
    findings: tuple[str, ...] = ()

    def as_lock(self) -> dict[str, Any]:
        """What the lock keeps of it (``scripts`` of the skill's lock entry)."""
        return {
            "reason": self.reason,
            "interpreters": list(self.interpreters),
            "programs": list(self.programs),
            "unavailable": dict(sorted(self.unavailable.items())),
        }


def local_modules(files: Iterable[str]) -> set[str]:
    """Top-level names a script of the skill may import from the skill itself: every
    ``.py`` file's stem and every folder holding Python (``__init__.py`` or not: a
    folder without one is a namespace package, the skill's own ``scripts/office``)."""
    out: set[str] = set()
    for name in files:
        if not name.endswith(".py"):
            continue
        parts = name.split("/")
        out.add(Path(parts[-1]).stem)
        out.update(parts[:-1])
    return out


def script_needs(path: str, data: bytes, local: set[str]) -> ScriptNeeds:
    """Read one script (see :class:`ScriptNeeds`)."""
    interpreter = INTERPRETERS.get(Path(path).suffix.lower())
    if interpreter != "python":
        return ScriptNeeds(path, interpreter)
    try:
        tree = ast.parse(data, filename=path)
    except (SyntaxError, ValueError) as exc:
        line = getattr(exc, "lineno", 0) or 0
        return ScriptNeeds(path, interpreter, syntax_error=f"{line}: not valid Python: {exc}")
    guarded = _import_error_guarded(tree)
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    imports: dict[str, int] = {}
    optional: set[str] = set()
    required: set[str] = set()
    processes = 0
    for node in ast.walk(tree):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        elif isinstance(node, ast.Call):
            func = node.func
            if (
                isinstance(func, ast.Attribute)
                and func.attr in _PROCESS_CALLS
                and isinstance(func.value, ast.Name)
                and func.value.id == "os"
            ):
                processes = min(processes or node.lineno, node.lineno)
            continue
        line = getattr(node, "lineno", 0)
        for module in modules:
            if module in _PROCESS_MODULES or module.split(".")[0] in {"subprocess", "pty"}:
                processes = min(processes or line, line)
            top = module.split(".")[0]
            if top in stdlib or top in local:
                continue
            imports.setdefault(top, line)
            imports[top] = min(imports[top], line)
            (optional if id(node) in guarded else required).add(top)
    return ScriptNeeds(
        path,
        interpreter,
        dict(sorted(imports.items())),
        frozenset(optional - required),
        processes,
    )


def _import_error_guarded(tree: ast.AST) -> set[int]:
    """ids of import nodes inside ``try`` bodies that catch ImportError (optional imports)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try):
            continue
        names = {
            n.id
            for h in node.handlers
            if h.type is not None
            for n in ast.walk(h.type)
            if isinstance(n, ast.Name)
        }
        if any(h.type is None for h in node.handlers) or names & {
            "ImportError",
            "ModuleNotFoundError",
            "Exception",
        }:
            for stmt in node.body:
                out.update(
                    id(n) for n in ast.walk(stmt) if isinstance(n, ast.Import | ast.ImportFrom)
                )
    return out


def declared_programs(metadata: Mapping[str, str], policy: Sequence[str]) -> list[str]:
    """The system programs named by the policy and by ``metadata.system-programs``."""
    named = list(policy)
    named += re.split(r"[\s,]+", metadata.get(METADATA_PROGRAMS, "").strip(" []\"'"))
    return sorted({p.strip("\"'") for p in named if p.strip("\"'")})


def missing_program_message(programs: Sequence[str]) -> str:
    """``'pdfinfo' (Debian: poppler-utils)`` for each program, joined."""
    return ", ".join(
        f"'{p}' (Debian package: {DEBIAN_PACKAGES.get(p, 'unknown; see docs/agent-skills.md')})"
        for p in programs
    )


def wheel_names(wheelhouse: Path | None) -> set[str]:
    """Normalized distribution names with a wheel in ``wheelhouse``."""
    if wheelhouse is None or not wheelhouse.is_dir():
        return set()
    return {normalize(p.name.split("-", 1)[0]) for p in wheelhouse.glob("*.whl")}


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """The distribution a requirement line names (``pypdf>=4`` -> ``pypdf``)."""
    return normalize(re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0])


def plan(
    skill_id: str,
    files: Mapping[str, bytes],
    *,
    policy_executor: str | None,
    requirements: Sequence[str],
    programs: Sequence[str],
    policy_interpreters: Sequence[str] | None = None,
    wheelhouse: Path | None,
    which: Any = shutil.which,
) -> Plan:
    """Choose the executor of a skill's scripts and say what each one lacks.

    ``requirements`` are the packages named in ``requirements.txt`` or the policy;
    packages a script imports beyond those are installed too when the wheelhouse has
    a wheel for them. ``programs`` are the declared system programs;
    ``policy_interpreters`` the policy's ``scripts.interpreters`` when it names them (a
    script needing another is unavailable). ``which`` finds a program on this host.
    """
    scripts = runnable_scripts(files)
    if not scripts:
        return Plan("none", "no scripts")
    local = local_modules(files)
    needs = [script_needs(s, files[s], local) for s in scripts]
    findings: list[str] = []
    unavailable: dict[str, str] = {}

    def lack(script: str, line: int, what: str) -> None:
        findings.append(
            f"{skill_id}/{script}:{line}: {what}" if line else f"{skill_id}/{script}: {what}"
        )
        unavailable.setdefault(script, what)

    for n in needs:
        if n.syntax_error:
            at, _, what = n.syntax_error.partition(": ")
            lack(n.path, int(at or 0), what)
    wants_native = [n for n in needs if n.interpreter != "python" or n.imports or n.processes]
    if policy_executor is not None:
        executor = policy_executor
        reason = f"the policy says scripts.executor: {executor}"
    elif wants_native:
        executor = "native"
        first = wants_native[0]
        why = (
            f"{first.path} imports {', '.join(first.imports)}"
            if first.imports
            else f"{first.path} starts processes"
            if first.processes
            else f"{first.path} is a {first.interpreter or 'non-Python'} script"
        )
        reason = why + (f" (and {len(wants_native) - 1} more)" if len(wants_native) > 1 else "")
    else:
        executor = "wasm"
        reason = "standard-library Python only, no processes"

    interpreters = sorted({n.interpreter for n in needs if n.interpreter})
    if policy_interpreters is not None:
        for n in needs:
            if n.interpreter and n.interpreter not in policy_interpreters:
                lack(
                    n.path,
                    0,
                    f"its interpreter '{n.interpreter}' is not in the policy's "
                    f"scripts.interpreters ({', '.join(policy_interpreters) or 'none'})",
                )
        interpreters = sorted(set(policy_interpreters))
    distributions: list[str] = []
    if executor == "wasm":
        for n in needs:
            if n.interpreter != "python":
                lack(n.path, 0, "a shell or non-Python script; the wasm executor runs Python only")
            for module, line in n.imports.items():
                if module not in n.optional:
                    lack(
                        n.path,
                        line,
                        f"imports '{module}', which the wasm executor lacks "
                        "(standard library only)",
                    )
            if n.processes:
                lack(n.path, n.processes, "starts a process, which wasm cannot (WASI has none)")
        if requirements:
            findings.append(
                f"{skill_id}: needs {', '.join(requirements)}, but the wasm executor has the "
                "standard library only"
            )
        interpreters = ["python"]
    else:
        for n in needs:
            if n.interpreter is None:
                lack(n.path, 0, "no interpreter is known for this kind of script")
            elif n.interpreter != "python" and which(n.interpreter) is None:
                lack(
                    n.path,
                    0,
                    f"needs '{n.interpreter}', which this host lacks "
                    f"(Debian package: {DEBIAN_PACKAGES.get(n.interpreter, n.interpreter)})",
                )
        wheels = wheel_names(wheelhouse)
        declared = {requirement_name(r) for r in requirements}
        for r in requirements:
            if requirement_name(r) not in wheels:
                where = str(wheelhouse) if wheelhouse else "no wheelhouse (--wheelhouse DIR)"
                for n in needs:
                    if n.interpreter == "python":
                        unavailable.setdefault(
                            n.path, f"needs package '{r}', which has no wheel in {where}"
                        )
                findings.append(
                    f"{skill_id}: skill '{skill_id}' needs package '{r}', which has no wheel "
                    f"in {where}"
                )
        distributions = [r for r in requirements if requirement_name(r) in wheels]
        for n in needs:
            for module, line in n.imports.items():
                dist = DISTRIBUTIONS.get(module, module)
                if normalize(dist) in declared:
                    continue
                if normalize(dist) in wheels:
                    if dist not in distributions:
                        distributions.append(dist)
                elif module not in n.optional:
                    where = f"the wheelhouse {wheelhouse}" if wheelhouse else "no wheelhouse"
                    lack(
                        n.path,
                        line,
                        f"imports '{module}' (package '{dist}'), which has no wheel in {where}",
                    )
    missing = [p for p in programs if which(p) is None]
    if missing:
        what = f"needs the system program(s) {missing_program_message(missing)}, not installed"
        for s in scripts:
            unavailable.setdefault(s, what)
        findings.append(f"{skill_id}: {what}")
    return Plan(
        executor,
        reason,
        tuple(interpreters),
        tuple(programs),
        tuple(distributions),
        unavailable,
        tuple(findings),
    )


__all__ = [
    "DEBIAN_PACKAGES",
    "INTERPRETERS",
    "PROGRAM_NEEDS",
    "SCRIPTS",
    "SYSTEM_FILES",
    "Plan",
    "ProgramNeeds",
    "ScriptNeeds",
    "declared_programs",
    "local_modules",
    "plan",
    "runnable_scripts",
    "script_needs",
]
