"""Serving an Agent Skill: its tiers, resources and prompt, and its script tool.

:class:`AgentSkillBackend` is a registry backend (``skilld.registry.SkillBackend``):
the registry takes the skill's slot, builds the ``CallContext`` and writes the
audit record, exactly as for a wasm skill; this class answers in that context.

- tier 1 is the tool list itself (the tool ``NAME`` with the skill's description);
- tier 2: calling it returns the ``SKILL.md`` body once, wrapped as the client
  implementation guide shows (``<skill_content name=...>`` with a
  ``<skill_resources>`` index of its files);
- tier 3: each file is the resource ``skill://NAME/PATH``, read on demand;
- the body is also the prompt ``NAME``;
- ``run_script`` runs one of its scripts through the skill's executor
  (``_executors``), in a fresh workspace per call. The client hands it files
  (``files``: inline base64 or text, or the URI of a resource this skill serves, such
  as an earlier run's output), capped in size. What the script wrote comes back as
  embedded resources (``_collect``: the workspace is hostile input, budgeted by size
  before it is read); a file too large to embed is kept as the resource
  ``skill://NAME/runs/RUN/FILE`` for its caller only (``_kept``). A script the build
  found cannot run here answers ``unavailable`` with the reason.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import html
import json
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from skilld.agentskills._build import (
    INSTRUCTIONS,
    MAX_INPUT_FILES,
    RUN_SCRIPT,
    resource_uri,
)
from skilld.agentskills._collect import collect, file_block
from skilld.agentskills._kept import KeptOutputs, TooLarge, digest_uri
from skilld.agentskills._quota import Quota, mount_tmpfs
from skilld.agentskills._skillmd import SKILL_MD, jsonable, split_frontmatter
from skilld.call import CallContext
from skilld.errors import CallCancelled, GuestError
from skilld.paths import remove_tree, scratch_prefix
from skilld.types import Caller, CallOutput, ContentBlock, SkillSpec

log = logging.getLogger("skilld.agentskills")

# Files a client hands to one run: at most MAX_INPUT_FILES (an unpacked presentation is
# 40 parts and more, each one file), this many bytes in all.
MAX_INPUT_BYTES = 32 << 20


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
    # The rw grant directories its scripts may write (their per-call write budget).
    writable: tuple[str, ...]

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
        """Run ``script`` (a path inside the skill) with ``argv`` and ``stdin`` in
        ``workspace`` (what it leaves there is collected); ``private``, beside it in the
        same call directory, is for its home, temporary files and caches (not
        collected)."""
        ...


class AgentSkillBackend:
    """One Agent Skill, served from its read-only directory in the bundle.

    Args:
        spec: what the skill serves (from the lock).
        root: the skill's files (``agentskills/NAME/files`` in the bundle).
        executor: runs its scripts; ``None`` when it has none.
        work: where each call's workspace is made (``skilld.paths.make_work_dir``).
        kept: where outputs too large to embed are kept for their callers (one store per
            node; without it, one of this backend's own in ``work``).
    """

    def __init__(
        self,
        spec: SkillSpec,
        root: Path,
        executor: ScriptExecutor | None,
        work: Path,
        *,
        unavailable: Mapping[str, str] | None = None,
        digests: Mapping[str, str] | None = None,
        kept: KeptOutputs | None = None,
    ):
        self.spec = spec
        self.root = root
        self.executor = executor
        self.work = work
        self.unavailable = dict(unavailable or {})
        self.digests = dict(digests or {})
        self._files = {r.uri: r for r in spec.resources if not r.template}
        self._paths = {r.uri: r.name.split("/", 1)[1] for r in spec.resources if not r.template}
        text = self._read(SKILL_MD).decode("utf-8")
        front, body, _line = split_frontmatter(text, f"{spec.id}/{SKILL_MD}")
        self.frontmatter_text = front
        self.body = body.strip()
        self.kept = kept if kept is not None else KeptOutputs(work)
        self._entry: dict[str, Any] | None = None

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
        """Tier 3: one file of the skill, or an output kept for ``ctx.caller``, text or
        bytes, with its MIME type.

        Raises:
            GuestError: ``not-found`` for a URI that is not one of the skill's files nor
                kept for this caller (the same error whether another caller keeps it or
                nobody does).
        """
        if self._is_run(uri):
            # A kept output's URI is all it takes to read it: the audit record names a
            # digest of it, never the URI (found or not, the record looks the same).
            if ctx.recorder is not None:
                ctx.recorder.target = digest_uri(uri)
            kept = self.kept_output(ctx.caller, uri)
            if kept is None:
                raise GuestError(
                    "not-found",
                    f"no resource {digest_uri(uri)} in skill '{self.spec.id}' (a kept "
                    "output is read by the caller that ran it, while it is kept)",
                )
            return [CallOutput(None, (file_block(uri, kept[0], kept[1]),))]
        spec = self._files.get(uri)
        if spec is None:
            raise GuestError("not-found", f"no resource '{uri}' in skill '{self.spec.id}'")
        data = self._read(self._paths[uri])
        return [CallOutput(None, (file_block(uri, spec.mime_type or "", data),))]

    def kept_output(self, caller: Caller, uri: str) -> tuple[str, bytes] | None:
        """An output kept for ``caller`` (MIME type, bytes); ``None`` for a URI kept for
        another caller exactly as for one never kept."""
        return self.kept.open(caller, uri)

    def skill_entry(self) -> dict[str, Any]:
        """The skill's entry of the MCP skills extension (SEP-2640): its SKILL.md URI,
        its frontmatter as the author wrote it, and each file's sha256 (from the bundle
        lock) and size.

        Raises:
            SkilldError: SKILL.md's frontmatter no longer parses (it did at build).
        """
        if self._entry is not None:
            return self._entry
        from skilld.policy import load_yaml

        doc = load_yaml("\n" + self.frontmatter_text, f"{self.spec.id}/{SKILL_MD}") or {}
        resources = []
        for uri, rel in self._paths.items():
            digest = self.digests.get(rel)
            size = (self.root / rel).stat().st_size
            if digest is None:  # a backend opened without the lock's digests (tests)
                digest = hashlib.sha256(self._read(rel)).hexdigest()
            resources.append({"uri": uri, "digest": f"sha256:{digest}", "size": size})
        self._entry = {
            "uri": resource_uri(self.spec.id, SKILL_MD),
            "frontmatter": jsonable(doc),
            "resources": resources,
        }
        return self._entry

    def get_prompt(self, name: str, args_json: str, ctx: CallContext) -> list[dict[str, Any]]:
        """The ``SKILL.md`` body as one user message.

        Raises:
            GuestError: ``not-found`` for another prompt name.
        """
        if name != self.spec.id:
            raise GuestError("not-found", f"skill '{self.spec.id}' has no prompt '{name}'")
        return [{"role": "user", "content": {"type": "text", "text": self.body}}]

    # -- tiers ---------------------------------------------------------------

    def activation_text(self) -> str:
        """Tier 2 as the client implementation guide wraps it: the body once, where its
        relative paths resolve, and the index of its other files."""
        name = html.escape(self.spec.id, quote=True)
        base = resource_uri(self.spec.id, "")
        files = "\n".join(
            f"<file>{html.escape(p)}</file>" for p in sorted(self._paths.values()) if p != SKILL_MD
        )
        scripts = ""
        if self.executor is not None:
            scripts = (
                f"\nRun a script of scripts/ with the tool '{self.spec.id}/{RUN_SCRIPT}'; "
                "hand it your files in 'files'."
            )
        return (
            f'<skill_content name="{name}">\n{self.body}\n\n'
            f"Skill directory: {base}\nRelative paths in this skill are relative to the "
            f"skill directory; read a file as the MCP resource {base}PATH.{scripts}\n"
            + (f"<skill_resources>\n{files}\n</skill_resources>\n" if files else "")
            + "</skill_content>"
        )

    def _instructions(self) -> CallOutput:
        # The text only: a JSON copy of the body beside it doubled what a client reads.
        return CallOutput(None, (ContentBlock("text", text=self.activation_text()),))

    def _run_script(self, args: Mapping[str, Any], ctx: CallContext) -> CallOutput:
        assert self.executor is not None
        script = str(args.get("script", ""))
        if script not in self._script_names():
            raise GuestError(
                "invalid-argument", f"'{script}' is not a script of skill '{self.spec.id}'"
            )
        if script in self.unavailable:
            raise GuestError(
                "unavailable",
                f"script '{script}' of skill '{self.spec.id}' cannot run on this server: "
                f"{self.unavailable[script]}",
            )
        inputs = self._inputs(args.get("files"), ctx.caller)
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
        # A fresh private directory (mode 0700) per call in the node's work directory
        # (never an implicit /tmp), removed when the call ends however it ends (a call
        # that cannot start leaves nothing): ``work/`` is the script's workspace
        # (collected), ``home/`` its HOME and TMPDIR (not collected).
        call_dir = Path(tempfile.mkdtemp(prefix=scratch_prefix("ws", self.spec.id), dir=self.work))
        ctx.audit.update(executor=self.executor.name, script=script, files_given=len(inputs))
        reservation = self.kept.reserve(ctx.caller)
        try:
            run = self._run_capped(script, argv, stdin, call_dir, inputs, ctx)
            given = {rel: (len(data), hashlib.sha256(data).digest()) for rel, data in inputs}
            try:
                got = collect(call_dir / _WORK, self.spec.id, given, self.kept, reservation)
            except OSError as exc:
                raise GuestError(
                    "unavailable",
                    f"the outputs of script '{script}' of '{self.spec.id}' could not be kept: "
                    f"{exc.strerror or exc} in {self.kept.directory.parent} (free some space "
                    "there, or set SKILLD_WORK_DIR to a larger disk)",
                ) from exc
            kept = self.kept.commit(reservation, self.spec.id, got.spooled)
        finally:
            self.kept.release(reservation)
            if not remove_tree(call_dir):
                log.warning("could not remove the call directory %s", call_dir)
                ctx.audit.update(work_left=call_dir.name)
        # What a later sweep or eviction took is not listed: only what is kept now.
        omitted = got.omitted + len(got.spooled) - len(kept)
        ctx.audit.update(
            exit_status=run.exit_status,
            signal=run.signal,
            output_dropped_bytes=run.dropped_bytes,
            files_written=len(got.embedded),
            files_kept=len(kept),
        )
        value: dict[str, Any] = {
            "exit_status": run.exit_status,
            "signal": run.signal,
            "stdout": run.stdout.decode("utf-8", "replace"),
            "stderr": run.stderr.decode("utf-8", "replace"),
            "output_truncated": run.dropped_bytes > 0,
            "timed_out": run.timed_out,
            "executor": self.executor.name,
            "files": [b.uri for b in got.embedded],
        }
        if kept:
            value["resources"] = kept
        if omitted:
            value["files_omitted"] = omitted
        if got.refused:
            value["files_refused"] = got.refused
        if got.removed:
            value["files_removed"] = got.removed
        return CallOutput(value, tuple(got.embedded))

    def _run_capped(
        self,
        script: str,
        argv: Sequence[str],
        stdin: bytes,
        call_dir: Path,
        inputs: Sequence[tuple[str, bytes]],
        ctx: CallContext,
    ) -> ScriptRun:
        """Run the script with its call directory (workspace and private home) capped (a
        tmpfs where skilld may mount, else accounted) and its rw grants accounted
        (``_quota``): past a cap the call's channel says cancelled, the executor ends the
        run, and the call is answered ``limit-exceeded`` naming the cap. The client's
        ``inputs`` are placed once the directory is mounted (a tmpfs would hide them)."""
        assert self.executor is not None
        cap = ctx.limits.workspace_bytes
        quota = Quota(
            call_dir,
            self.executor.writable,
            workspace_bytes=cap,
            write_bytes=ctx.limits.write_bytes,
            channel=ctx.channel,
            tmpfs=mount_tmpfs(call_dir, cap),
        )
        workspace, private = call_dir / _WORK, call_dir / _HOME
        for made in (workspace, private):
            made.mkdir(mode=0o700)
        _place(workspace, inputs)
        channel, ctx.channel = ctx.channel, quota.channel
        try:
            with quota:
                run = self.executor.run(script, argv, stdin, workspace, ctx, private=private)
        except CallCancelled:
            if quota.exceeded is None:
                raise
        finally:
            ctx.channel = channel
        if quota.exceeded is not None:
            ctx.audit.update(limit_exceeded=quota.exceeded)
            raise GuestError(
                "limit-exceeded",
                f"script '{script}' of '{self.spec.id}' was ended: {quota.exceeded}",
                rule=f"{self.spec.id}.limits",
            )
        return run

    # -- files in and out ------------------------------------------------------

    def _inputs(self, raw: Any, caller: Caller) -> list[tuple[str, bytes]]:
        """The client's files for this run: ``[{"path", "content" (base64) | "text" |
        "uri"}]``, each path relative and inside the workspace, within the caps.

        Raises:
            GuestError: ``invalid-argument`` for a malformed entry, a path outside the
                workspace, a URI this skill does not serve, or more than the caps.
        """
        if raw is None:
            return []
        if not isinstance(raw, list) or len(raw) > MAX_INPUT_FILES:
            raise GuestError(
                "invalid-argument", f"'files' must be a list of at most {MAX_INPUT_FILES} files"
            )
        out: list[tuple[str, bytes]] = []
        total = 0
        for item in raw:
            if not isinstance(item, dict):
                raise GuestError("invalid-argument", "each of 'files' must be an object")
            rel = _workspace_path(item.get("path"))
            given = [k for k in ("content", "text", "uri") if k in item]
            if len(given) != 1:
                raise GuestError(
                    "invalid-argument", f"file '{rel}': give one of content, text or uri"
                )
            data = self._input_bytes(rel, given[0], item[given[0]], caller, MAX_INPUT_BYTES - total)
            total += len(data)
            if total > MAX_INPUT_BYTES:
                raise GuestError(
                    "invalid-argument",
                    f"the files given exceed {MAX_INPUT_BYTES >> 20} MiB in all",
                )
            out.append((rel, data))
        return out

    def _input_bytes(self, rel: str, kind: str, value: Any, caller: Caller, room: int) -> bytes:
        """One file's bytes; a kept output larger than ``room`` (what is left of
        :data:`MAX_INPUT_BYTES`) is refused before it is read."""
        if not isinstance(value, str):
            raise GuestError("invalid-argument", f"file '{rel}': {kind} must be a string")
        if kind == "text":
            return value.encode("utf-8")
        if kind == "content":
            if len(value) > MAX_INPUT_BYTES * 4 // 3 + 4:
                raise GuestError("invalid-argument", f"file '{rel}' is too large")
            try:
                return base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise GuestError(
                    "invalid-argument", f"file '{rel}': content is not base64"
                ) from None
        if self._is_run(value):
            # Another caller's kept output is refused exactly as a URI never kept.
            try:
                kept = self.kept.open(caller, value, room)
            except TooLarge as exc:
                raise GuestError(
                    "invalid-argument",
                    f"file '{rel}': the kept output is {exc.size} bytes, more than the "
                    f"{room} left of the {MAX_INPUT_BYTES >> 20} MiB a run's files may take",
                ) from None
            if kept is not None:
                return kept[1]
            value = digest_uri(value)
        elif value in self._paths:
            return self._read(self._paths[value])
        raise GuestError(
            "invalid-argument",
            f"file '{rel}': '{value}' is not a resource of skill '{self.spec.id}' "
            "(send other files inline, as content)",
        )

    def _is_run(self, uri: str) -> bool:
        """Whether ``uri`` names an output of a run (kept, expired or never kept)."""
        return uri.startswith(resource_uri(self.spec.id, "runs/"))

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


# The two directories of a call: the script's workspace and its private home.
_WORK, _HOME = "work", "home"


def _workspace_path(raw: Any) -> str:
    """A client's file path, relative and inside the workspace.

    Raises:
        GuestError: ``invalid-argument`` for anything else.
    """
    if not isinstance(raw, str) or not raw or len(raw) > 255:
        raise GuestError("invalid-argument", "each file needs a 'path' (1-255 characters)")
    parts = raw.split("/")
    if raw.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in raw:
        raise GuestError(
            "invalid-argument", f"file path {raw!r} must be relative, inside the workspace"
        )
    return raw


def _place(workspace: Path, inputs: Sequence[tuple[str, bytes]]) -> None:
    """Write the client's files into a workspace no script has touched yet.

    Raises:
        GuestError: ``invalid-argument`` when two paths collide (the same file twice,
            or a file where another needs a directory).
    """
    for rel, data in inputs:
        target = workspace / rel
        try:
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except OSError:
            raise GuestError(
                "invalid-argument", f"file path '{rel}' collides with another file given"
            ) from None
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)


__all__ = ["AgentSkillBackend", "ScriptExecutor", "ScriptRun", "resource_uri"]
