"""``shell``: allowlisted commands run as argv, never through a shell.

The check is ``check("shell", "run", shlex.join(argv))`` (an unambiguous quoting
of the argv, so metacharacters are data) plus ``check("shell", "cwd", DIR)`` for
the working directory, which must also lie under the deciding rule's ``cwd``
list (a rule with a list runs in its first directory when no cwd is given).
An argument whose pattern holds a path (``/data/out/*``,
``--target-directory=/data/out/*``, ``/dev/zero``; not a URL) is checked again, through
the tables, with its path part (from its first ``/``) made canonical: ``*`` matches
any characters, so ``/data/out/../x``, ``--target-directory=/data/out/..`` or a
path through a symlink out of ``/data/out`` would otherwise satisfy the pattern
and let the command write outside the directory the operator meant.

The child gets a scrubbed environment: PATH, LANG, and the variables the rule's
``env`` names. That list is the operator's grant of those variables to that
program, apart from the skill's own ``env`` grants, so a token can go to a trusted
tool without the skill reading it (unless the tool prints it). The child gets no
stdin unless given, its own process group, the smaller of the rule's and the
request's timeout, and the rule's output cap: output past the cap is read and
dropped, so a chatty child can neither block nor fill the host's memory.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from typing import IO, Any

from skilld.errors import HostCallError
from skilld.sandbox._context import CallContext
from skilld.sandbox.abi import Functions, decide, rule_settings
from skilld.sandbox.abi.fs import canonical
from skilld.types import Decision

DEFAULT_TIMEOUT_MS = 10_000
MAX_TIMEOUT_MS = 300_000
OUTPUT_CAP = 1 << 20
SCRUBBED_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
# After the child exits, how long its pipes may stay open (held by a grandchild).
_DRAIN_GRACE_S = 1.0


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
            "not-permitted", f"shell.cwd {cwd} denied: {reason}", rule=decision.rule
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


def _check_path_args(ctx: CallContext, argv: list[str], rule: Mapping[str, Any]) -> None:
    canon = _canonical_args(argv, rule)
    if canon != argv:
        shown = f"{shlex.join(argv)} (resolves to {shlex.join(canon)})"
        decide(ctx, "shell", "run", shlex.join(canon), shown=shown)


def _environment(rule: Mapping[str, Any]) -> dict[str, str]:
    env = dict(SCRUBBED_ENV)
    for name in rule.get("env") or ():
        value = os.environ.get(str(name))
        if value is not None:
            env[str(name)] = value
    return env


def _drain(stream: IO[bytes], cap: int, out: bytearray, over: list[bool]) -> None:
    while chunk := stream.read1(65536):  # type: ignore[attr-defined]
        room = cap - len(out)
        if room > 0:
            out += chunk[:room]
        if len(chunk) > room:
            over[0] = True
    stream.close()


def _feed(stream: IO[bytes], data: bytes) -> None:
    # A child that closes its stdin early gets what it read.
    with contextlib.suppress(OSError):
        stream.write(data)
    with contextlib.suppress(OSError):
        stream.close()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def run(ctx: CallContext, cmd: dict[str, object]) -> dict[str, object]:
    """Run one command to completion (or its timeout).

    Raises:
        HostCallError: ``not-permitted`` for an argv or cwd the tables refuse,
            ``invalid-argument``, ``not-found``, ``timeout``, ``io``.
    """
    argv = [str(a) for a in cmd["argv"]]  # type: ignore[attr-defined]
    if not argv or not argv[0]:
        raise HostCallError("invalid-argument", "argv must name a program")
    if any("\x00" in a for a in argv):
        raise HostCallError("invalid-argument", "argv must not contain NUL bytes")
    decision = decide(ctx, "shell", "run", shlex.join(argv))
    rule = rule_settings(ctx, decision)
    _check_path_args(ctx, argv, rule)
    cwd = _working_dir(ctx, cmd.get("cwd"), decision, rule)
    timeout_ms = min(int(cmd.get("timeout_ms") or DEFAULT_TIMEOUT_MS), MAX_TIMEOUT_MS)  # type: ignore[call-overload]
    if rule.get("timeout_ms"):
        timeout_ms = min(timeout_ms, int(rule["timeout_ms"]))
    cap = int(rule.get("output_bytes") or OUTPUT_CAP)
    stdin = cmd.get("stdin")
    data = bytes(stdin) if isinstance(stdin, (bytes, bytearray, list)) else b""
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=_environment(rule),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            shell=False,
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        raise HostCallError("not-found", f"program {argv[0]!r} not found") from exc
    except OSError as exc:
        raise HostCallError("io", f"cannot run {argv[0]!r}: {exc.strerror or exc}") from exc
    assert proc.stdin is not None
    assert proc.stdout is not None
    assert proc.stderr is not None
    out, err = bytearray(), bytearray()
    over = [False]
    workers = [
        threading.Thread(target=_feed, args=(proc.stdin, data), daemon=True),
        threading.Thread(target=_drain, args=(proc.stdout, cap, out, over), daemon=True),
        threading.Thread(target=_drain, args=(proc.stderr, cap, err, over), daemon=True),
    ]
    for worker in workers:
        worker.start()
    deadline = time.monotonic() + timeout_ms / 1000
    try:
        code = proc.wait(timeout=timeout_ms / 1000)
    except subprocess.TimeoutExpired as exc:
        _kill_group(proc)
        proc.wait()
        raise HostCallError(
            "timeout", f"{argv[0]} ran past {timeout_ms} ms and was killed"
        ) from exc
    finally:
        for worker in workers:
            worker.join(max(deadline - time.monotonic(), 0) + _DRAIN_GRACE_S)
        # A grandchild that kept the pipes open goes with its group.
        if any(worker.is_alive() for worker in workers):
            _kill_group(proc)
    return {
        "exit_code": code,
        "stdout": bytes(out),
        "stderr": bytes(err),
        "truncated": over[0],
    }


FUNCTIONS: Functions = {"run": (run, "result-tagged")}
