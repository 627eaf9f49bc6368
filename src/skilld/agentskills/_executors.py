"""The two script executors of Agent Skills, chosen per skill by its policy (``scripts``).

``wasm`` (:class:`WasmExecutor`): the script runs in the CPython runner component
(``skilld/sandbox/pyrunner``), an instance of its own per call, with WASI preopens for
that call only: the skill directory read-only at ``/skill``, a fresh workspace at
``/workspace`` and the directories its fs grants name (read-only unless ``rw``). The
component has no sockets; its memory cap and deadline are the sandbox's.

``native`` (:class:`NativeExecutor`): the script runs as a host process through
``skilld.confine``: Landlock allows reading the skill directory, its baked environment
and the system's libraries, writing only the workspace (its ``TMPDIR`` and ``HOME``)
and the ``rw`` grants, executing only the interpreter and the programs its shell
grants name; no network unless tcp is granted (then its ports), or http (then only the
port of a local egress proxy that asks the http tables, named by ``HTTP_PROXY`` and
``HTTPS_PROXY``: ``sandbox/_egress.py``); ``no_new_privs``; rlimits; the
environment cleared to an allowlist; the whole process tree killed at the deadline.
Where the kernel cannot do all of that, nothing runs
(:class:`~skilld.errors.ConfinementUnavailable`).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from skilld.agentskills._backend import ScriptRun
from skilld.agentskills._build import INTERPRETERS
from skilld.agentskills._plan import PROGRAM_NEEDS, SYSTEM_FILES, ProgramNeeds
from skilld.call import CallContext
from skilld.confine import ProgramNotStarted, ResourceLimits, from_grants, program_files, run
from skilld.errors import (
    CallCancelled,
    DeadlineExceeded,
    ErrorCode,
    GuestError,
    MemoryExhausted,
)
from skilld.paths import scratch_prefix
from skilld.policy import patterns as patterns
from skilld.sandbox import egress_route
from skilld.types import CallOutput, Decision, Limits

# Each of stdout and stderr keeps this much; the rest is read and dropped.
OUTPUT_CAP = 256 * 1024
# Started as `python -I -S -B -c BOOT ENV SCRIPT ARGS...`: isolated (no PYTHON* variables,
# no user site, no script directory on sys.path before ours), the baked environment
# and the script's directory first on sys.path, the script run as __main__.
_BOOT = (
    "import runpy,sys;e,s=sys.argv[1],sys.argv[2];sys.argv=sys.argv[2:];"
    "sys.path[:0]=[p for p in (e,s.rsplit('/',1)[0]) if p];"
    "runpy.run_path(s,run_name='__main__')"
)
_ENV_KEEP = ("LANG", "LC_ALL")


def python_libraries() -> tuple[str, ...]:
    """Where this Python's standard library and libpython are (read-only for scripts).

    Under /usr they are among the system libraries already; a Python installed
    elsewhere (pyenv, a Nix store path, a container's /opt) needs its own rules.
    """
    found = {str(Path(os.__file__).parent), str(sysconfig.get_config_var("LIBDIR") or "")}
    return tuple(sorted(d for d in found if d and Path(d).is_dir()))


# Directories of programs shared by every package: a program here gets itself only.
_SHARED_BIN = frozenset(
    ("/bin", "/sbin", "/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin")
)


def program_tree(found: Iterable[str]) -> tuple[str, ...]:
    """What executing the declared programs (found on ``PATH``) takes: each program as
    the kernel runs it (``program_files``: through its links, a ``#!`` script's
    interpreter, the ELF loader), and the directory of one installed in a directory of
    its own (``soffice`` is a script in ``/usr/lib/libreoffice/program/`` that executes
    ``oosplash`` and ``soffice.bin`` beside it). A program in a shared ``bin``
    directory gets only itself."""
    out: list[str] = []
    for program in found:
        try:
            files = program_files(program, os.defpath)
        except ProgramNotStarted:
            continue
        out += files
        home = str(Path(files[0]).parent) if files else "/"
        if home not in _SHARED_BIN and home != "/":
            out.append(home)
    return tuple(dict.fromkeys(out))


def system_files() -> tuple[str, ...]:
    """The :data:`~skilld.agentskills._plan.SYSTEM_FILES` present here, as real paths.

    A grant path through a symbolic link gives no access (the runner opens grants
    without following links), so a linked entry is granted at its target.
    """
    found = {str(Path(p).resolve()) for p in SYSTEM_FILES if Path(p).exists()}
    return tuple(sorted(found))


def _present(paths: Iterable[str]) -> tuple[str, ...]:
    """Those of ``paths`` that exist, as real paths (a grant through a link gives nothing)."""
    return tuple(dict.fromkeys(str(Path(p).resolve()) for p in paths if Path(p).exists()))


def _merged(needs: Sequence[ProgramNeeds]) -> ProgramNeeds:
    """What the declared programs need together (paths present on this host only)."""
    env: dict[str, str] = {}
    for need in needs:
        env.update(need.env)
    return ProgramNeeds(
        read=_present(p for n in needs for p in n.read),
        socket_dirs=_present(p for n in needs for p in n.socket_dirs),
        env=env,
    )


class _Runner(Protocol):
    def call(self, method: str, args_json: str, ctx: CallContext) -> CallOutput: ...


def _cap(data: bytes) -> tuple[bytes, int]:
    return data[:OUTPUT_CAP], max(0, len(data) - OUTPUT_CAP)


def _record(ctx: CallContext, skill_id: str, script: str, executor: str) -> None:
    ctx.record(
        Decision(
            allowed=True,
            capability="scripts",
            action=f"run:{executor}",
            target=script,
            rule=f"{skill_id}.scripts",
            reason=f"a script of the skill, run by the {executor} executor",
        )
    )


def _deadline(ctx: CallContext) -> float:
    if ctx.deadline is None:
        # A host backend starts the call's clock itself (the sandbox does for guests).
        ctx.deadline = time.monotonic() + ctx.limits.timeout_ms / 1000
    return ctx.deadline


def tree_grants(
    fs: Iterable[Mapping[str, Any]],
) -> tuple[list[dict[str, Any]], list[str]]:
    """The fs grants a kernel rule can hold exactly: directory trees (``/data`` or
    ``/data/**``), as ``{"path", "mode"}``; and the ids of the others (globs such as
    ``/data/**/*.md``), which scripts do not get: a Landlock rule or a WASI preopen
    names a directory, and widening a glob to its directory would grant more than the
    operator wrote."""
    kept: list[dict[str, Any]] = []
    left: list[str] = []
    for rule in fs:
        segments = patterns.parse_path_pattern(str(rule["path"]))
        tree = segments[:-1] if segments and segments[-1] == "**" else segments
        if patterns.is_literal(tree):
            kept.append({"path": patterns.join_path(tree), "mode": rule.get("mode", "ro")})
        else:
            left.append(str(rule.get("id", rule["path"])))
    return kept, left


def _directory_rules(fs: Iterable[Mapping[str, Any]]) -> list[tuple[str, bool]]:
    """(directory, writable) for each tree grant that names an existing directory."""
    return [(r["path"], r["mode"] == "rw") for r in tree_grants(fs)[0] if Path(r["path"]).is_dir()]


class WasmExecutor:
    """Python scripts in the CPython runner component (see the module docstring).

    Args:
        skill_id: the skill whose scripts these are.
        root: the skill's read-only directory.
        runner: the loaded runner component.
        fs: the skill's effective fs grants (policy table rules).
    """

    name = "wasm"

    def __init__(
        self, skill_id: str, root: Path, runner: _Runner, fs: Iterable[Mapping[str, Any]] = ()
    ):
        self.skill_id = skill_id
        self.root = root
        self.runner = runner
        self.grants = _directory_rules(fs)
        self.writable = tuple(d for d, rw in self.grants if rw)

    def run(
        self,
        script: str,
        argv: Sequence[str],
        stdin: bytes,
        workspace: Path,
        ctx: CallContext,
        *,
        private: Path | None = None,
    ) -> ScriptRun:
        """Run ``script`` in a fresh runner instance (``private`` is not used: the
        runner's temporary files stay in its own memory).

        Raises:
            GuestError: the runner refused the arguments.
            GuestFault: deadline, memory or a trap of the runner (costs this call only).
        """
        _record(ctx, self.skill_id, script, self.name)
        ctx.preopens = (
            (str(self.root), "/skill", False),
            (str(workspace), "/workspace", True),
            *((d, d, rw) for d, rw in self.grants),
        )
        args = {"path": script, "argv": list(argv), "stdin": stdin.decode("utf-8", "replace")}
        out = self.runner.call("run_script", json.dumps(args), ctx).value
        stdout, dropped_out = _cap(str(out["stdout"]).encode())
        stderr, dropped_err = _cap(str(out["stderr"]).encode())
        return ScriptRun(int(out["exit_status"]), stdout, stderr, None, dropped_out + dropped_err)


class NativeExecutor:
    """Scripts as confined host processes (see the module docstring).

    Args:
        skill_id: the skill whose scripts these are.
        root: the skill's read-only directory.
        env: its baked environment (site-packages), or ``None``.
        interpreters: program names its scripts may be started with (the policy's, or
            those the build found its scripts need).
        grants: the skill's effective policy table (``fs``, ``tcp``, ``shell``).
        limits: the skill's limits (memory becomes the address-space rlimit).
        work: the node's work directory (the root-owned copies of the skill go there).
        programs: the system programs declared for it (``pdfinfo``): executable, on
            ``PATH``, with what ``PROGRAM_NEEDS`` says they need.
        operator_programs: those of them the operator's policy names: only these may
            widen the walls (a socket directory); one the skill names in its own
            metadata brings its tools, files and variables, not that.
        temp_paths: the fixed directories under /tmp the operator's policy declares
            (``scripts.temp_paths``): made fresh for each call, removed after it, one
            call at a time (docs/confinement.md).
    """

    name = "native"

    def __init__(
        self,
        skill_id: str,
        root: Path,
        env: Path | None,
        interpreters: Sequence[str],
        grants: Mapping[str, Any],
        limits: Limits,
        work: Path,
        programs: Sequence[str] = (),
        *,
        operator_programs: Sequence[str] = (),
        temp_paths: Sequence[str] = (),
    ):
        self.skill_id = skill_id
        self.temp_paths = tuple(temp_paths)
        self.work = work
        self._copies: tempfile.TemporaryDirectory[str] | None = None
        # Absolute: the script starts in its workspace (``--bundle bundle`` is relative).
        root, env = root.absolute(), (env.absolute() if env is not None else None)
        root, env = self._unowned_copy(root, env)
        self.root = root
        self.env = env
        self.interpreters = tuple(interpreters)
        self.confinement = from_grants(
            tree_grants(grants.get("fs") or ())[0],
            grants.get("tcp") or (),
            limits=ResourceLimits(
                # CPython maps ~100 MiB of address space before it runs a line.
                address_space=max(limits.memory_bytes, 512 << 20),
                # The whole tree together: a script's children are each under the
                # address-space limit, their sum is not.
                memory=limits.memory_bytes,
                processes=32,
                file_size=64 << 20,
                open_files=128,
            ),
            skill=skill_id,
        )
        self.writable = tuple(self.confinement.read_write)
        needs = [
            PROGRAM_NEEDS[n]
            if n in operator_programs
            else replace(PROGRAM_NEEDS[n], socket_dirs=())
            for n in dict.fromkeys(programs)
            if n in PROGRAM_NEEDS
        ]
        named = [str(r["program"]) for r in grants.get("shell") or ()] + list(programs)
        named += [tool for need in needs for tool in need.tools]
        self.programs = program_tree(p for p in map(shutil.which, named) if p)
        self.system_files = system_files()
        self.needs = _merged(needs)

    def _unowned_copy(self, root: Path, env: Path | None) -> tuple[Path, Path | None]:
        """The skill's files and environment, copied once, owned by skilld (root or its
        own uid) with the modes of a checkout (``0644``, directories ``0755``).

        Landlock does not govern metadata: a process owning a file may chmod or utime
        it. A script never owns these files: with a separate identity it runs as its
        skill's uid, and where it shares skilld's uid the seccomp filter refuses every
        metadata call. Not ``nobody``: other processes of the host run as ``nobody``,
        and one could rewrite a skill's code between its runs. The bundle was verified
        when it was opened and is read-only (``0444``); a script that copies one of its
        own files into its workspace (``shutil.copy`` of a template, as docx's
        ``comment.py`` does) gets the copy's mode, and a ``0444`` copy could not be
        edited. Writes to these files stay refused: Landlock gives the script read and
        execute beneath them, and (with a separate identity) the file's owner is not it.
        """
        self._copies = tempfile.TemporaryDirectory(
            prefix=scratch_prefix("copies", self.skill_id), dir=self.work
        )
        base = Path(self._copies.name)
        base.chmod(0o755)
        out: list[Path] = []
        for name, tree in (("files", root), ("env", env)):
            if tree is None:
                continue
            dest = base / name
            shutil.copytree(tree, dest, symlinks=True)
            for path in [dest, *dest.rglob("*")]:
                if not path.is_symlink():
                    path.chmod(0o755 if path.is_dir() else 0o644)
            out.append(dest)
        return out[0], (out[1] if env is not None else None)

    def _interpreter(self, script: str) -> list[str]:
        name = INTERPRETERS.get(Path(script).suffix.lower())
        if name is None or name not in self.interpreters:
            granted = ", ".join(self.interpreters) or "none"
            raise GuestError(
                ErrorCode.NOT_PERMITTED,
                f"no interpreter for '{script}' is granted to '{self.skill_id}' "
                f"(granted: {granted})",
                rule=f"{self.skill_id}.scripts",
            )
        path = os.path.realpath(sys.executable) if name == "python" else shutil.which(name)
        if path is None:
            raise GuestError("unavailable", f"interpreter '{name}' is not installed on this host")
        target = str(self.root / script)
        if name == "python":
            return [path, "-I", "-S", "-B", "-c", _BOOT, str(self.env or ""), target]
        return [path, target]

    def run(
        self,
        script: str,
        argv: Sequence[str],
        stdin: bytes,
        workspace: Path,
        ctx: CallContext,
        *,
        private: Path | None = None,
    ) -> ScriptRun:
        """Run ``script`` as a confined process in ``workspace``; its ``HOME``, ``TMPDIR``
        and ``XDG_CACHE_HOME`` are ``private`` (a directory of the call that is not
        collected: caches and profiles do not come back as outputs), else the workspace.

        Raises:
            ConfinementUnavailable: the kernel lacks what the confinement needs (named);
                nothing ran.
            DeadlineExceeded: the script ran past the call's deadline; its whole process
                tree was killed.
            CallCancelled: the client cancelled the call; the tree was killed too.
            MemoryExhausted: its process tree together went over the skill's memory
                limit (code ``limit-exceeded``); the tree was killed.
            GuestError: no interpreter granted for it, or it could not be started.
        """
        command = self._interpreter(script)
        _record(ctx, self.skill_id, script, self.name)
        readable = [str(self.root), *([str(self.env)] if self.env else [])]
        home = private or workspace
        # Both live in the call's one directory (its mount and its cap), handed to the
        # call's uid for the call and back after it.
        call_dir = workspace if private is None else workspace.parent
        if private is not None and private.parent != call_dir:
            raise GuestError(
                "internal", "a script's private directory must sit beside its workspace"
            )
        confinement = replace(
            self.confinement,
            read_only=(
                *self.confinement.read_only, *readable, *self.system_files, *self.needs.read
            ),
            read_write=(*self.confinement.read_write, str(call_dir)),
            libraries=(*self.confinement.libraries, *python_libraries()),
            executables=(*self.confinement.executables, command[0], *self.programs),
            socket_dirs=self.needs.socket_dirs,
            temp_paths=self.temp_paths,
            workspace=str(call_dir),
        )  # fmt: skip
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(home),
            "TMPDIR": str(home),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "LANG": "C.UTF-8",
            "SKILL_DIR": str(self.root),
        }
        env.update({k: v.replace("{home}", str(home)) for k, v in self.needs.env.items()})
        env.update({k: os.environ[k] for k in _ENV_KEEP if k in os.environ})
        try:
            with egress_route(ctx, confinement, env, _deadline(ctx)) as (confinement, env):
                done = run(
                    [*command, *argv],
                    confinement=confinement,
                    deadline=_deadline(ctx),
                    cwd=str(workspace),
                    env=env,
                    stdin=stdin,
                    output_cap=OUTPUT_CAP,
                    cancelled=ctx.channel.cancelled,
                )
        except ProgramNotStarted as exc:
            raise GuestError("unavailable", f"'{script}' could not be started: {exc}") from exc
        if done.cancelled:
            raise CallCancelled(
                f"the client cancelled script '{script}' of '{self.skill_id}'; its whole "
                "process tree was killed"
            )
        if done.memory:
            raise MemoryExhausted(
                f"script '{script}' of '{self.skill_id}' held {done.memory >> 20} MiB of "
                f"memory with its processes together, over the skill's memory limit of "
                f"{(confinement.limits.memory or 0) >> 20} MiB; its whole process tree was killed",
                location=self.skill_id,
            )
        if done.tasks:
            raise GuestError(
                ErrorCode.LIMIT_EXCEEDED,
                f"script '{script}' of '{self.skill_id}' ran {done.tasks} processes and "
                f"threads together, over the skill's limit of {confinement.limits.processes}; "
                "its whole process tree was killed",
            )
        if done.timed_out:
            raise DeadlineExceeded(
                f"script '{script}' of '{self.skill_id}' ran past its deadline of "
                f"{ctx.limits.timeout_ms} ms; its whole process tree was killed"
            )
        return ScriptRun(
            done.exit_code, done.stdout, done.stderr, done.signal, done.dropped, done.timed_out
        )
