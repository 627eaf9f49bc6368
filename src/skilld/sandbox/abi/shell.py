"""``shell``: allowlisted commands run as argv, never through a shell.

The check is ``check("shell", "run", shlex.join(argv))`` (an unambiguous quoting
of the argv, so metacharacters are data) plus ``check("shell", "cwd", DIR)`` for
the working directory. The child gets a scrubbed environment, no stdin unless
given, a timeout and an output cap.
"""

from __future__ import annotations

import shlex
import subprocess

from skilld.errors import HostCallError
from skilld.sandbox._context import CallContext
from skilld.sandbox.abi import Functions, decide
from skilld.sandbox.abi.fs import canonical

DEFAULT_TIMEOUT_MS = 10_000
MAX_TIMEOUT_MS = 300_000
OUTPUT_CAP = 1 << 20
SCRUBBED_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


def run(ctx: CallContext, cmd: dict[str, object]) -> dict[str, object]:
    """Run one command to completion (or its timeout)."""
    argv = [str(a) for a in cmd["argv"]]  # type: ignore[attr-defined]
    if not argv or not argv[0]:
        raise HostCallError("invalid-argument", "argv must name a program")
    if any("\x00" in a for a in argv):
        raise HostCallError("invalid-argument", "argv must not contain NUL bytes")
    decide(ctx, "shell", "run", shlex.join(argv))
    cwd = None
    if cmd.get("cwd") is not None:
        cwd = canonical(str(cmd["cwd"]))
        decide(ctx, "shell", "cwd", cwd)
    timeout_ms = min(int(cmd.get("timeout_ms") or DEFAULT_TIMEOUT_MS), MAX_TIMEOUT_MS)  # type: ignore[call-overload]
    stdin = cmd.get("stdin")
    try:
        proc = subprocess.run(
            argv,
            cwd=cwd or "/",
            env=dict(SCRUBBED_ENV),
            input=bytes(stdin) if isinstance(stdin, (bytes, bytearray, list)) else b"",
            capture_output=True,
            timeout=timeout_ms / 1000,
            check=False,
            shell=False,
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        raise HostCallError("not-found", f"program {argv[0]!r} not found") from exc
    except subprocess.TimeoutExpired as exc:
        raise HostCallError(
            "timeout", f"{argv[0]} ran past {timeout_ms} ms and was killed"
        ) from exc
    except OSError as exc:
        raise HostCallError("io", f"cannot run {argv[0]!r}: {exc.strerror or exc}") from exc
    truncated = len(proc.stdout) > OUTPUT_CAP or len(proc.stderr) > OUTPUT_CAP
    return {
        "exit_code": proc.returncode,
        "stdout": proc.stdout[:OUTPUT_CAP],
        "stderr": proc.stderr[:OUTPUT_CAP],
        "truncated": truncated,
    }


FUNCTIONS: Functions = {"run": (run, "result-tagged")}
