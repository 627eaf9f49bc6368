"""A guest that performs whatever host call the test asks for and reports the outcome.

Every method returns ``{"ok": value}`` or ``{"error": code, "rule": rule, "message": m}``,
so one test can assert exactly what the host allowed or refused, and why.
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Callable
from typing import Any

from skilld_sdk import HostError, Skill, env, fs, http, invoke, kv, mcp, shell, tcp, transfer

skill = Skill()


def _report(fn: Callable[[], Any]) -> dict[str, Any]:
    try:
        return {"ok": fn()}
    except HostError as exc:
        return {"error": exc.code, "rule": exc.rule, "message": exc.message}


@skill.method
def fs_read(path: str) -> dict[str, Any]:
    """Read a file as text."""
    return _report(lambda: fs.read(path).decode(errors="replace"))


@skill.method
def fs_write(path: str, data: str, append: bool = False) -> dict[str, Any]:
    """Write text to a file."""
    return _report(lambda: fs.write(path, data, append))


@skill.method
def fs_list(path: str) -> dict[str, Any]:
    """List a directory."""
    return _report(lambda: fs.list_dir(path))


@skill.method
def fs_stat(path: str) -> dict[str, Any]:
    """Stat a path."""
    return _report(lambda: {"size": (s := fs.stat(path)).size, "is_dir": s.is_dir})


@skill.method
def fs_mkdir(path: str) -> dict[str, Any]:
    """Make a directory."""
    return _report(lambda: fs.mkdir(path))


@skill.method
def fs_remove(path: str) -> dict[str, Any]:
    """Remove a file or empty directory."""
    return _report(lambda: fs.remove(path))


@skill.method
def fs_glob(pattern: str) -> dict[str, Any]:
    """Glob for paths."""
    return _report(lambda: fs.glob(pattern))


@skill.method
def http_request(url: str, method: str = "GET", body: str | None = None) -> dict[str, Any]:
    """Send an HTTP request; report status and body."""

    def go() -> dict[str, Any]:
        resp = http.request(method, url, body=body, timeout_ms=5000)
        return {"status": resp.status, "body": resp.body.decode(errors="replace")[:2000]}

    return _report(go)


@skill.method
def tcp_exchange(host: str, port: int, send: str = "") -> dict[str, Any]:
    """Connect, send, receive once, close."""

    def go() -> str:
        conn = tcp.connect(host, port, 3000)
        try:
            if send:
                tcp.send(conn, send.encode())
            return base64.b64encode(tcp.receive(conn, 4096, 3000)).decode()
        finally:
            tcp.close(conn)

    return _report(go)


@skill.method
def shell_run(argv: list[str], cwd: str | None = None) -> dict[str, Any]:
    """Run a command; report exit code and output."""

    def go() -> dict[str, Any]:
        out = shell.run(argv, cwd=cwd, timeout_ms=5000)
        return {
            "exit": out.exit_code,
            "stdout": out.stdout.decode(errors="replace"),
            "stderr": out.stderr.decode(errors="replace"),
            "truncated": out.truncated,
        }

    return _report(go)


@skill.method
def env_get(name: str) -> dict[str, Any]:
    """Read an environment variable."""
    return _report(lambda: env.get(name))


@skill.method
def transfer_send(node: str, local_path: str, remote_path: str) -> dict[str, Any]:
    """Send a file to another node."""
    return _report(lambda: transfer.send(node, local_path, remote_path))


@skill.method
def shell_run_timed(
    argv: list[str], timeout_ms: int, cwd: str | None = None, stdin: str | None = None
) -> dict[str, Any]:
    """Run a command with the given timeout and stdin; report exit code and output sizes."""

    def go() -> dict[str, Any]:
        data = None if stdin is None else stdin.encode()
        out = shell.run(argv, cwd=cwd, stdin=data, timeout_ms=timeout_ms)
        return {
            "exit": out.exit_code,
            "stdout": out.stdout.decode(errors="replace")[:2000],
            "stdout_bytes": len(out.stdout),
            "truncated": out.truncated,
        }

    return _report(go)


@skill.method
def kv_set(key: str, value: str) -> dict[str, Any]:
    """Store a value under a key."""
    return _report(lambda: kv.set(key, value))


@skill.method
def kv_get(key: str) -> dict[str, Any]:
    """Read the value under a key."""
    return _report(lambda: (lambda v: None if v is None else v.decode())(kv.get(key)))


@skill.method
def invoke_call(skill_id: str, method: str, args: dict[str, Any]) -> dict[str, Any]:
    """Call another skill's method (which may itself be invoke_call: a chain)."""
    return _report(lambda: invoke.call(skill_id, method, args))


@skill.method
def mcp_ask(kind: str, params: dict[str, Any]) -> dict[str, Any]:
    """Send a sampling ("sample") or elicitation ("elicit") request to the client."""
    return _report(lambda: mcp.sample(params) if kind == "sample" else mcp.elicit(params))


_FS_OPS: dict[str, Callable[[str], Any]] = {
    "read": lambda p: fs.read(p).decode(errors="replace"),
    "write": lambda p: fs.write(p, "written by the prober", False),
    "list": fs.list_dir,
    "stat": lambda p: fs.stat(p).size,
    "mkdir": fs.mkdir,
    "remove": fs.remove,
    "glob": fs.glob,
}


@skill.method
def fs_batch(op: str, paths: list[str], rounds: int = 1) -> dict[str, Any]:
    """Run one fs operation on each path, ``rounds`` times over: ``{"ok": [report, ...]}``."""
    fn = _FS_OPS[op]
    return {"ok": [_report(functools.partial(fn, p)) for _ in range(rounds) for p in paths]}


@skill.method
def tcp_hold(host: str, port: int, timeout_ms: int) -> dict[str, Any]:
    """Connect and wait for bytes with the guest's own (large) timeout."""

    def go() -> int:
        conn = tcp.connect(host, port, timeout_ms)
        try:
            received = 0
            while chunk := tcp.receive(conn, 4096, timeout_ms):
                received += len(chunk)
            return received
        finally:
            tcp.close(conn)

    return _report(go)


@skill.method
def http_timed(url: str, timeout_ms: int) -> dict[str, Any]:
    """GET with the guest's own (large) timeout; report status and body size."""

    def go() -> dict[str, Any]:
        resp = http.request("GET", url, timeout_ms=timeout_ms)
        return {"status": resp.status, "size": len(resp.body)}

    return _report(go)


@skill.method
def mcp_progress(value: str, total: str | None = None) -> dict[str, Any]:
    """Report progress with values given as text ("nan", "inf" reach the host as floats)."""
    return _report(lambda: mcp.progress(float(value), None if total is None else float(total)))


@skill.method
def mcp_log(level: str, data: str = "hello") -> dict[str, Any]:
    """Log to the client at any level name."""
    return _report(lambda: mcp.log(level, data))
