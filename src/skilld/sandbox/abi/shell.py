"""``shell``: allowlisted commands run as argv, never through a shell.

The check is ``check_argv(argv)``, asked as the argv itself (every argument is data;
``shlex.join`` only names the command in a refusal) plus ``check("shell", "cwd", DIR)`` for
the working directory, which must also lie under the deciding rule's ``cwd``
list (a rule with a list runs in its first directory when no cwd is given).
An argument whose pattern holds a path (``/data/out/*``,
``--target-directory=/data/out/*``, ``/dev/zero``; not a URL) is checked again, through
the tables, with its path part (from its first ``/``) made canonical: ``*`` matches
any characters, so ``/data/out/../x``, ``--target-directory=/data/out/..`` or a
path through a symlink out of ``/data/out`` would otherwise satisfy the pattern
and let the command write outside the directory the operator meant.

The argv check is the first wall; the kernel is the second. The command runs
through :func:`skilld.confine.run`: Landlock confines it to the skill's fs grants
(read-only and read-write directories; a glob grant gives its directory prefix, and
the argv check keeps the glob's precision) plus its own binary and libraries, with
no network unless the skill has tcp grants (then only their ports) or http grants
(then only the port of a local egress proxy that asks the http tables, see
``sandbox/_egress.py``: its ``HTTP_PROXY`` and ``HTTPS_PROXY`` are set), in its own PID
namespace, without privileges, under rlimits. A path argument that a symlink sends
elsewhere between the check and the program's ``open`` reaches nothing outside the
grants. Where the kernel cannot confine the command it is refused (``unavailable``),
never run unconfined.

The child gets a scrubbed environment: PATH, LANG, and the variables the rule's
``env`` names. That list is the operator's grant of those variables to that
program, apart from the skill's own ``env`` grants, so a token can go to a trusted
tool without the skill reading it (unless the tool prints it). The child gets no
stdin unless given, the smallest of the rule's timeout, the request's and what is
left of the call's deadline, and the rule's output cap: output past the cap is read
and dropped, so a chatty child can neither block nor fill the host's memory. When the
program exits, at the deadline or when the client cancels the call, every process it
started is killed.
"""

from __future__ import annotations

import errno
import os
import shlex
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from skilld import confine
from skilld.call import CallContext
from skilld.confine import Confinement, from_grants
from skilld.errors import ConfinementUnavailable, ErrorCode, HostCallError, ProgramNotStarted
from skilld.sandbox import _egress as egress
from skilld.sandbox.abi import Functions, decide, rule_settings
from skilld.sandbox.abi.fs import canonical
from skilld.types import Decision

DEFAULT_TIMEOUT_MS = 10_000
MAX_TIMEOUT_MS = 300_000
OUTPUT_CAP = confine.OUTPUT_CAP
SCRUBBED_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


def _under(path: str, directory: str) -> bool:
    root = directory.rstrip("/") or "/"
    return path == root or path.startswith("/" if root == "/" else root + "/")


def _working_dir(
    ctx: CallContext, requested: object, decision: Decision, rule: Mapping[str, Any]
) -> str:
    allowed = [str(d) for d in rule.get("cwd") or ()]
    if requested is None:
        return allowed[0] if allowed else "/"
    cwd = canonical(str(requested))
    decide(ctx, "shell", "cwd", cwd)
    if rule and not any(_under(cwd, d) for d in allowed):
        # check("shell", "cwd") accepts a directory any rule lists; the command's
        # own rule must list it too.
        listed = ", ".join(allowed) or "no directory"
        reason = f"{decision.rule} allows running in {listed}, not {cwd}"
        ctx.record(Decision(False, "shell", "cwd", cwd, decision.rule, reason))
        raise HostCallError(
            ErrorCode.NOT_PERMITTED, f"shell.cwd {cwd} denied: {reason}", rule=decision.rule
        )
    return cwd


def _path_start(pattern: str) -> int | None:
    """Where an absolute path begins in ``pattern``: at 0, or right after a ``FLAG=``."""
    if pattern.startswith("/"):
        return 0
    eq = pattern.find("=")
    if eq > 0 and pattern[eq + 1 : eq + 2] == "/" and "/" not in pattern[:eq]:
        return eq + 1
    return None


def _canonical_args(argv: list[str], rule: Mapping[str, Any]) -> list[str]:
    """``argv`` with the path part of each argument whose pattern names an absolute path
    (``/data/out/*``, ``--target-directory=/data/out/*``) made canonical.

    Literal patterns (``/dev/zero``) are included: the guest may have planted a
    symlink at the very path the operator named. Patterns that are not absolute paths
    (``s/a/b/g``, ``application/json``, a relative ``out/*``) are matched as text, so
    the policy language tells operators to write path arguments as absolute patterns.
    """
    patterns = [str(a) for a in rule.get("args") or ()]
    fixed = patterns[:-1] if patterns and patterns[-1] == "**" else patterns
    out = list(argv)
    for i, (pattern, arg) in enumerate(zip(fixed, argv[1:], strict=False), start=1):
        start = _path_start(pattern)
        if start is not None and arg[:start] == pattern[:start] and arg[start:].startswith("/"):
            out[i] = arg[:start] + canonical(arg[start:])
    return out


def _check_path_args(
    ctx: CallContext, argv: list[str], rule: Mapping[str, Any], decision: Decision
) -> None:
    try:
        canon = _canonical_args(argv, rule)
    except HostCallError:
        # A path argument another process keeps swapping cannot be checked: refused.
        reason = "a path argument changed while it was resolved"
        ctx.record(Decision(False, "shell", "run", shlex.join(argv), decision.rule, reason))
        raise HostCallError(
            ErrorCode.NOT_PERMITTED,
            f"shell.run {shlex.join(argv)} denied: {reason}",
            rule=decision.rule,
        ) from None
    if canon != argv:
        # The refusal names the argv as the guest wrote it, never where its paths lead
        # (a planted link's target is the host's business); the audit keeps both.
        shown = f"{shlex.join(argv)} (a path argument, resolved, is outside the pattern)"
        decide(ctx, "shell", "run", shlex.join(canon), shown, lambda c: c.check_argv(tuple(canon)))


def _environment(rule: Mapping[str, Any]) -> dict[str, str]:
    env = dict(SCRUBBED_ENV)
    for name in rule.get("env") or ():
        value = os.environ.get(str(name))
        if value is not None:
            env[str(name)] = value
    return env


def _confinement(ctx: CallContext, rule: Mapping[str, Any], cwd: str) -> Confinement:
    """The kernel's walls for this command: the skill's fs and tcp grants, and its
    working directory read-only when the rule lists working directories (the
    operator named them for this program).

    A checker that is not built from compiled tables (tests' plain checkers) has no
    grants to give: the command then reaches no file but its own runtime.
    """
    grants = getattr(ctx.checker, "grants", None)
    walls = (
        Confinement(skill=ctx.skill_id)
        if grants is None
        else from_grants(grants("fs"), grants("tcp"), skill=ctx.skill_id)
    )
    if rule.get("cwd"):
        walls = replace(walls, read_only=(*walls.read_only, cwd))
    return walls


def run(ctx: CallContext, cmd: dict[str, object]) -> dict[str, object]:
    """Run one command, confined by the kernel, to completion (or its deadline).

    Raises:
        HostCallError: ``not-permitted`` for an argv or cwd the tables refuse,
            ``unavailable`` when the kernel cannot confine it (nothing ran),
            ``cancelled`` when the client cancelled the call (the command was killed),
            ``invalid-argument``, ``not-found``, ``timeout``, ``io``.
    """
    argv = [str(a) for a in cmd["argv"]]  # type: ignore[attr-defined]
    if not argv or not argv[0]:
        raise HostCallError("invalid-argument", "argv must name a program")
    if any("\x00" in a for a in argv):
        raise HostCallError("invalid-argument", "argv must not contain NUL bytes")
    # Asked as the argv itself; the quoted text only names it in a refusal or the audit.
    decision = decide(
        ctx, "shell", "run", shlex.join(argv), question=lambda c: c.check_argv(tuple(argv))
    )
    rule = rule_settings(ctx, decision)
    _check_path_args(ctx, argv, rule, decision)
    cwd = _working_dir(ctx, cmd.get("cwd"), decision, rule)
    timeout_ms = min(int(cmd.get("timeout_ms") or DEFAULT_TIMEOUT_MS), MAX_TIMEOUT_MS)  # type: ignore[call-overload]
    if rule.get("timeout_ms"):
        timeout_ms = min(timeout_ms, int(rule["timeout_ms"]))
    seconds = min(timeout_ms / 1000, ctx.remaining())
    stdin = cmd.get("stdin")
    data = bytes(stdin) if isinstance(stdin, (bytes, bytearray, list)) else b""
    deadline = time.monotonic() + seconds
    walls, env = _confinement(ctx, rule, cwd), _environment(rule)
    try:
        with egress.route(ctx, walls, env, deadline) as (walls, env):
            result = confine.run(
                argv,
                confinement=walls,
                deadline=deadline,
                cwd=cwd,
                env=env,
                stdin=data,
                output_cap=int(rule.get("output_bytes") or OUTPUT_CAP),
                cancelled=ctx.channel.cancelled,
            )
    except ConfinementUnavailable as exc:
        raise HostCallError(
            "unavailable", f"shell.run {argv[0]} refused: {exc}", rule=decision.rule
        ) from exc
    except ProgramNotStarted as exc:
        kind = "not-found" if exc.errno == errno.ENOENT else "io"
        raise HostCallError(kind, f"shell.run: {exc.message}", rule=decision.rule) from exc
    if result.cancelled:
        raise HostCallError("cancelled", f"{argv[0]} was killed: the client cancelled the call")
    if result.timed_out:
        limit = f"{timeout_ms} ms" if seconds * 1000 >= timeout_ms else "the call's deadline"
        raise HostCallError("timeout", f"{argv[0]} ran past {limit} and was killed")
    code = result.exit_code if result.exit_code is not None else -(result.signal or 0)
    return {
        "exit_code": code,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "truncated": result.dropped > 0,
    }


FUNCTIONS: Functions = {"run": (run, "result-tagged")}
