"""A guest that misbehaves on request: the sandbox tests' adversary."""

from __future__ import annotations

import os
import sys
from typing import Any

from skilld_sdk import HostError, Skill, fs, invoke, kv, mcp

skill = Skill()


@skill.method
def ok(text: str = "fine") -> str:
    """Behave."""
    return text


@skill.method
def loop() -> None:
    """Spin forever."""
    n = 0
    while True:
        n += 1


@skill.method
def alloc(chunk_mb: int = 8) -> int:
    """Allocate until memory runs out."""
    hoard = []
    while True:
        hoard.append(bytearray(chunk_mb << 20))


@skill.method
def recurse(depth: int = 10_000_000) -> int:
    """Recurse without end (past Python's own limit)."""
    sys.setrecursionlimit(depth + 100)

    def down(n: int) -> int:
        return down(n + 1) + 1

    return down(0)


@skill.method
def trap() -> None:
    """Abort: a wasm trap."""
    os.abort()


@skill.method
def shout(megabytes: int = 8) -> int:
    """Print megabytes to stdout and stderr."""
    line = "x" * 1023 + "\n"
    for _ in range(megabytes * 1024):
        sys.stdout.write(line)
        sys.stderr.write(line)
    return megabytes


@skill.method
def write_keys(count: int, prefix: str = "k") -> int:
    """Write ``count`` keys in a loop."""
    for i in range(count):
        kv.set(f"{prefix}{i:06d}", str(i))
    return count


@skill.method
def forbidden() -> str:
    """Try a capability its policy does not grant; report the denial."""
    try:
        fs.read("/etc/passwd")
    except HostError as exc:
        return f"{exc.code}:{exc.rule}"
    return "read it!"


@skill.method
def relay(skill_id: str, method: str, args: dict[str, Any]) -> Any:
    """Call another skill through the host (or itself, for cycles)."""
    try:
        return invoke.call(skill_id, method, args)
    except HostError as exc:
        return {"denied": exc.code, "rule": exc.rule, "message": exc.message}


@skill.method
def chatty(steps: int = 3) -> int:
    """Report progress and log to the MCP client."""
    for i in range(steps):
        mcp.progress(i + 1, steps, f"step {i + 1}")
    mcp.log("info", {"done": steps})
    return steps


@skill.method
def read_file(path: str) -> str:
    """Read a file without catching a denial (it becomes the call's typed error)."""
    return fs.read(path).decode(errors="replace")


_kept: list[str] = []


@skill.method
def remember(secret: str) -> int:
    """Keep a secret in module state and in a large buffer; return how many are kept."""
    _kept.append(secret)
    _kept.append(secret * (1 << 16))  # spread over many memory pages
    return len(_kept)


@skill.method
def recall() -> list[str]:
    """Whatever an earlier call left in module state (a fresh instance has nothing)."""
    return [s[:64] for s in _kept]
