"""A guest that performs whatever host call the test asks for and reports the outcome.

Every method returns ``{"ok": value}`` or ``{"error": code, "rule": rule, "message": m}``,
so one test can assert exactly what the host allowed or refused, and why.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

from skilld_sdk import HostError, Skill, env, fs, http, shell, tcp, transfer

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
