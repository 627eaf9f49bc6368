"""Serving an Agent Skill: its tiers, resources and prompt, and its script tool.

:class:`AgentSkillBackend` is a registry backend (``skilld.registry.SkillBackend``):
the registry takes the skill's slot, builds the ``CallContext`` and writes the
audit record, exactly as for a wasm skill; this class answers in that context.

- tier 1 is the tool list itself (the tool ``NAME`` with the skill's description);
- tier 2: calling it returns the ``SKILL.md`` body and an index of the skill's files;
- tier 3: each file is the resource ``skill://NAME/PATH``, read on demand;
- the body is also the prompt ``NAME``;
- ``run_script`` runs one of its scripts through the skill's executor
  (``_executors``), in a fresh workspace per call; what the script wrote there
  comes back as embedded resources.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from skilld.agentskills._build import INSTRUCTIONS, RUN_SCRIPT, mime_type, resource_uri
from skilld.agentskills._skillmd import SKILL_MD, split_frontmatter
from skilld.call import CallContext
from skilld.errors import GuestError
from skilld.types import CallOutput, ContentBlock, SkillSpec

# Workspace files returned with a result: at most this many, each at most this large.
MAX_RETURNED_FILES = 16
MAX_RETURNED_FILE = 1 << 20
_TEXT_MIME = ("text/", "application/json", "application/xml")


@dataclass(frozen=True, slots=True)
class ScriptRun:
    """How one script run ended: its exit status (``None`` when a signal ended it), its
    capped output, and whether the cap or the deadline cut it short."""

    exit_status: int | None
    stdout: bytes
    stderr: bytes
    signal: int | None = None
    dropped_bytes: int = 0
    timed_out: bool = False


class ScriptExecutor(Protocol):
    """Runs one script of a skill in a workspace; ``wasm`` and ``native`` are the two.

    ``run`` ends by ``ctx.deadline``, records its permission decisions on ``ctx`` and
    raises only ``SkilldError`` subclasses (``ConfinementUnavailable`` when the kernel
    cannot confine it: nothing then runs).
    """

    name: str

    def run(
        self, script: str, argv: Sequence[str], stdin: bytes, workspace: Path, ctx: CallContext
    ) -> ScriptRun:
        """Run ``script`` (a path inside the skill) with ``argv`` and ``stdin``."""
        ...


class AgentSkillBackend:
    """One Agent Skill, served from its read-only directory in the bundle.

    Args:
        spec: what the skill serves (from the lock).
        root: the skill's files (``agentskills/NAME/files`` in the bundle).
        executor: runs its scripts; ``None`` when it has none.
    """

    def __init__(self, spec: SkillSpec, root: Path, executor: ScriptExecutor | None):
        self.spec = spec
        self.root = root
        self.executor = executor
        self._files = {r.uri: r for r in spec.resources}
        self._paths = {r.uri: r.name.split("/", 1)[1] for r in spec.resources}
        text = self._read(SKILL_MD).decode("utf-8")
        _front, body, _line = split_frontmatter(text, f"{spec.id}/{SKILL_MD}")
        self.body = body.strip()

    # -- the SkillBackend protocol ----------------------------------------

    def call(self, method: str, args_json: str, ctx: CallContext) -> CallOutput:
        """Tier 2 (``instructions``) or a script run (``run_script``).

        Raises:
            GuestError: an unknown method, a malformed argument, a script not in the skill.
            RunOnThread: an inline attempt at a script run (it blocks).
            SkilldError: from the executor (``ConfinementUnavailable``, a deadline).
        """
        if method == INSTRUCTIONS:
            return self._instructions()
        if method == RUN_SCRIPT and self.executor is not None:
            ctx.thread_only()
            return self._run_script(json.loads(args_json), ctx)
        raise GuestError("not-found", f"skill '{self.spec.id}' has no method '{method}'")

    def read_resource(self, uri: str, ctx: CallContext) -> list[CallOutput]:
        """Tier 3: one file of the skill, text or bytes, with its MIME type.

        Raises:
            GuestError: ``not-found`` for a URI that is not one of the skill's files.
        """
        spec = self._files.get(uri)
        if spec is None:
            raise GuestError("not-found", f"no resource '{uri}' in skill '{self.spec.id}'")
        data = self._read(self._paths[uri])
        return [CallOutput(None, (_file_block(uri, spec.mime_type or "", data),))]

    def get_prompt(self, name: str, args_json: str, ctx: CallContext) -> list[dict[str, Any]]:
        """The ``SKILL.md`` body as one user message.

        Raises:
            GuestError: ``not-found`` for another prompt name.
        """
        if name != self.spec.id:
            raise GuestError("not-found", f"skill '{self.spec.id}' has no prompt '{name}'")
        return [{"role": "user", "content": {"type": "text", "text": self.body}}]

    # -- tiers ---------------------------------------------------------------

    def _instructions(self) -> CallOutput:
        index = [
            {"path": self._paths[r.uri], "uri": r.uri, "mime_type": r.mime_type}
            for r in self.spec.resources
        ]
        listing = "\n".join(f"- {f['path']} ({f['uri']})" for f in index)
        scripts = (
            f"\n\nRun a script with the tool '{self.spec.id}/{RUN_SCRIPT}'."
            if self.executor is not None
            else ""
        )
        text = (
            f"{self.body}\n\n---\nFiles of this skill (read one as an MCP resource):\n"
            f"{listing}{scripts}"
        )
        value = {"name": self.spec.id, "instructions": self.body, "files": index}
        return CallOutput(value, (ContentBlock("text", text=text),))

    def _run_script(self, args: Mapping[str, Any], ctx: CallContext) -> CallOutput:
        assert self.executor is not None
        script = str(args.get("script", ""))
        if script not in self._script_names():
            raise GuestError(
                "invalid-argument", f"'{script}' is not a script of skill '{self.spec.id}'"
            )
        raw_argv = args.get("args") or []
        if not isinstance(raw_argv, list) or not all(isinstance(a, str) for a in raw_argv):
            raise GuestError("invalid-argument", "'args' must be a list of strings")
        argv = list(raw_argv)
        if "input" in args and args.get("stdin") is not None:
            raise GuestError("invalid-argument", "give stdin or input, not both")
        stdin = (
            json.dumps(args["input"]).encode()
            if "input" in args
            else str(args.get("stdin") or "").encode()
        )
        # A fresh private directory (mode 0700) per call, removed when the call ends.
        workspace = Path(tempfile.mkdtemp(prefix=f"skilld-ws-{self.spec.id}-"))
        ctx.audit.update(executor=self.executor.name, script=script)
        try:
            run = self.executor.run(script, argv, stdin, workspace, ctx)
            files = _collect(workspace, self.spec.id)
        finally:
            _remove(workspace)
        ctx.audit.update(
            exit_status=run.exit_status,
            signal=run.signal,
            output_dropped_bytes=run.dropped_bytes,
            files_written=len(files),
        )
        value: dict[str, Any] = {
            "exit_status": run.exit_status,
            "signal": run.signal,
            "stdout": run.stdout.decode("utf-8", "replace"),
            "stderr": run.stderr.decode("utf-8", "replace"),
            "output_truncated": run.dropped_bytes > 0,
            "timed_out": run.timed_out,
            "executor": self.executor.name,
            "files": [b.uri for b in files],
        }
        return CallOutput(value, tuple(files))

    def _script_names(self) -> set[str]:
        for method in self.spec.methods:
            if method.name == RUN_SCRIPT:
                return set(method.params_schema["properties"]["script"]["enum"])
        return set()

    def _read(self, rel: str) -> bytes:
        """A file of the skill, opened beneath its root without following links."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for part in rel.split("/")[:-1]:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = nxt
            leaf = os.open(rel.split("/")[-1], os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
        finally:
            os.close(fd)
        with os.fdopen(leaf, "rb") as fh:
            return fh.read()


def _file_block(uri: str, mime: str, data: bytes) -> ContentBlock:
    if mime.startswith(_TEXT_MIME):
        try:
            return ContentBlock("embedded", text=data.decode("utf-8"), mime_type=mime, uri=uri)
        except UnicodeDecodeError:
            pass
    return ContentBlock("embedded", data=data, mime_type=mime or None, uri=uri)


def _collect(workspace: Path, skill_id: str) -> list[ContentBlock]:
    """Regular files the script left in its workspace (links are not followed)."""
    out: list[ContentBlock] = []
    for dirpath, _dirs, names in os.walk(workspace):
        for name in sorted(names):
            path = Path(dirpath) / name
            info = path.lstat()
            if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_RETURNED_FILE:
                continue
            if len(out) >= MAX_RETURNED_FILES:
                return out
            rel = path.relative_to(workspace).as_posix()
            uri = f"workspace://{skill_id}/{rel}"
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as fh:
                out.append(_file_block(uri, mime_type(rel), fh.read(MAX_RETURNED_FILE)))
    return out


def _remove(workspace: Path) -> None:
    # A script may have left a directory without write permission: give it back first.
    for dirpath, dirs, _names in os.walk(workspace):
        for d in dirs:
            p = Path(dirpath) / d
            if not p.is_symlink():
                p.chmod(0o700)
    shutil.rmtree(workspace, ignore_errors=True)


__all__ = ["AgentSkillBackend", "ScriptExecutor", "ScriptRun", "resource_uri"]
