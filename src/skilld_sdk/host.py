"""Thin wrappers over the host interfaces of the ``skilld:skill`` world.

Each wrapper imports its WIT binding on first use. A skill built without a need
does not import that interface at all (the host refuses such a component at
load when the policy does not grant it), so calling the wrapper then raises
:class:`HostError` ``not-permitted`` instead of an ImportError.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

from skilld_sdk._skill import HostError

T = TypeVar("T")


def _load_bindings() -> dict[str, ModuleType]:
    # Imported now, at build time: componentize-py snapshots the interpreter after
    # the module-level code ran, and a module not imported by then is not in it.
    found = {}
    for name in ("log", "kv", "fs", "http", "tcp", "shell", "invoke", "transfer", "env", "mcp"):
        try:
            found[name] = importlib.import_module(f"wit_world.imports.{name}")
        except ImportError:
            continue
    return found


_BINDINGS = _load_bindings()


def _binding(name: str) -> ModuleType:
    try:
        return _BINDINGS[name]
    except KeyError:
        raise HostError(
            "not-permitted",
            f"this skill was built without the '{name}' interface; declare it under "
            f"'needs' in skill.yaml",
        ) from None


def _call(fn: Callable[..., T], *args: Any) -> T:
    try:
        return fn(*args)
    except Exception as exc:  # componentize_py_types.Err carries the WIT error record
        err = getattr(exc, "value", None)
        code = getattr(getattr(err, "code", None), "name", None)
        if code is None:
            raise
        raise HostError(code.lower().replace("_", "-"), err.message, err.rule) from None


class _Log:
    """Messages to the host's log (never to stdout)."""

    def _write(self, level: str, message: str) -> None:
        mod = _binding("log")
        mod.write(getattr(mod.Level, level.upper()), message)

    def debug(self, message: str) -> None:
        """Log at debug level."""
        self._write("debug", message)

    def info(self, message: str) -> None:
        """Log at info level."""
        self._write("info", message)

    def warn(self, message: str) -> None:
        """Log at warning level."""
        self._write("warn", message)

    def error(self, message: str) -> None:
        """Log at error level."""
        self._write("error", message)


class _KV:
    """This skill's private key-value state."""

    def get(self, key: str) -> bytes | None:
        """The value under ``key`` or None."""
        try:
            return _call(_binding("kv").get, key)
        except HostError as exc:
            if exc.code == "not-found":
                return None
            raise

    def set(self, key: str, value: bytes | str) -> None:
        """Store ``value`` durably under ``key``."""
        data = value.encode() if isinstance(value, str) else value
        _call(_binding("kv").set, key, data)

    def delete(self, key: str) -> bool:
        """Remove ``key``; True when it existed."""
        return _call(_binding("kv").delete, key)

    def keys(self, prefix: str = "", limit: int = 1000) -> list[str]:
        """Keys starting with ``prefix``, in order."""
        return _call(_binding("kv").keys, prefix, limit)

    def get_json(self, key: str) -> Any:
        """The JSON value under ``key`` or None."""
        raw = self.get(key)
        return None if raw is None else json.loads(raw)

    def set_json(self, key: str, value: Any) -> None:
        """Store a JSON value under ``key``."""
        self.set(key, json.dumps(value))


class _FS:
    """Files inside the directories the policy grants."""

    def read(self, path: str) -> bytes:
        """The bytes of a file."""
        return _call(_binding("fs").read, path)

    def read_text(self, path: str) -> str:
        """A file as UTF-8 text."""
        return self.read(path).decode()

    def write(self, path: str, data: bytes | str, append: bool = False) -> None:
        """Write (or append to) a file."""
        raw = data.encode() if isinstance(data, str) else data
        _call(_binding("fs").write, path, raw, append)

    def list_dir(self, path: str) -> list[str]:
        """Names in a directory."""
        return _call(_binding("fs").list_dir, path)

    def stat(self, path: str) -> Any:
        """Size, is_dir and modified_ms of a path."""
        return _call(_binding("fs").stat, path)

    def mkdir(self, path: str) -> None:
        """Create a directory (and its parents)."""
        _call(_binding("fs").mkdir, path)

    def remove(self, path: str) -> None:
        """Remove a file or an empty directory."""
        _call(_binding("fs").remove, path)

    def glob(self, pattern: str) -> list[str]:
        """Paths matching a glob (``*`` one segment, ``**`` any depth)."""
        return _call(_binding("fs").glob, pattern)


@dataclass(frozen=True)
class Response:
    """An HTTP response."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def text(self) -> str:
        """The body as UTF-8 text."""
        return self.body.decode()

    def json(self) -> Any:
        """The body as JSON."""
        return json.loads(self.body)


class _HTTP:
    """Outgoing HTTP to allowlisted URLs."""

    def request(
        self,
        method: str,
        url: str,
        *,
        headers: dict[str, str] | None = None,
        body: bytes | str | None = None,
        timeout_ms: int | None = None,
    ) -> Response:
        """Send a request; every redirect hop is checked by the host."""
        mod = _binding("http")
        raw = body.encode() if isinstance(body, str) else body
        req = mod.Request(method.upper(), url, list((headers or {}).items()), raw, timeout_ms)
        resp = _call(mod.fetch, req)
        return Response(resp.status, list(resp.headers), resp.body)

    def get(self, url: str, **kw: Any) -> Response:
        """GET ``url``."""
        return self.request("GET", url, **kw)

    def post(self, url: str, **kw: Any) -> Response:
        """POST to ``url``."""
        return self.request("POST", url, **kw)


class _TCP:
    """Outgoing TCP connections (handles)."""

    def connect(self, host: str, port: int, timeout_ms: int = 5000) -> int:
        """Open a connection; returns its handle."""
        return _call(_binding("tcp").connect, host, port, timeout_ms)

    def send(self, conn: int, data: bytes) -> int:
        """Send bytes; returns how many were sent."""
        return _call(_binding("tcp").send, conn, data)

    def receive(self, conn: int, max_bytes: int = 65536, timeout_ms: int = 5000) -> bytes:
        """Receive up to ``max_bytes`` (empty at end of stream)."""
        return _call(_binding("tcp").receive, conn, max_bytes, timeout_ms)

    def close(self, conn: int) -> None:
        """Close a connection."""
        _binding("tcp").close(conn)


@dataclass(frozen=True)
class Completed:
    """A finished command."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    truncated: bool


class _Shell:
    """Allowlisted commands, as argv only."""

    def run(
        self,
        argv: list[str],
        *,
        cwd: str | None = None,
        stdin: bytes | None = None,
        timeout_ms: int | None = None,
    ) -> Completed:
        """Run a command (never through a shell)."""
        mod = _binding("shell")
        out = _call(mod.run, mod.Command(list(argv), cwd, stdin, timeout_ms))
        return Completed(out.exit_code, out.stdout, out.stderr, out.truncated)


class _Invoke:
    """Calls to other skills."""

    def call(self, skill: str, method: str, args: dict[str, Any] | None = None) -> Any:
        """Call ``skill``'s ``method``; returns its JSON value."""
        return json.loads(_call(_binding("invoke").call, skill, method, json.dumps(args or {})))


class _Transfer:
    """Files between cluster nodes."""

    def nodes(self) -> list[str]:
        """Nodes this skill may transfer to or from."""
        return _call(_binding("transfer").nodes)

    def send(self, node: str, local_path: str, remote_path: str) -> int:
        """Send a file to ``node``; returns bytes sent."""
        return _call(_binding("transfer").send, node, local_path, remote_path)

    def fetch(self, node: str, remote_path: str, local_path: str) -> int:
        """Fetch a file from ``node``; returns bytes received."""
        return _call(_binding("transfer").fetch, node, remote_path, local_path)


class _Env:
    """Environment variables the policy lets this skill read."""

    def get(self, name: str) -> str | None:
        """The variable's value or None."""
        try:
            return _call(_binding("env").get, name)
        except HostError as exc:
            if exc.code == "not-found":
                return None
            raise


class _MCP:
    """The MCP client of the current call."""

    def progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        """Report progress."""
        _binding("mcp").progress(float(progress), None if total is None else float(total), message)

    def log(self, level: str, data: Any) -> None:
        """Send a log message to the client."""
        _binding("mcp").notify_log(level, json.dumps(data))

    def sample(self, params: dict[str, Any]) -> dict[str, Any]:
        """Ask the client's model (``sampling/createMessage`` params)."""
        return json.loads(_call(_binding("mcp").sample, json.dumps(params)))

    def elicit(self, params: dict[str, Any]) -> dict[str, Any]:
        """Ask the user (``elicitation/create`` params)."""
        return json.loads(_call(_binding("mcp").elicit, json.dumps(params)))

    def cancelled(self) -> bool:
        """True once the client cancelled this call."""
        return bool(_binding("mcp").cancelled())


env = _Env()
fs = _FS()
http = _HTTP()
invoke = _Invoke()
kv = _KV()
log = _Log()
mcp = _MCP()
shell = _Shell()
tcp = _TCP()
transfer = _Transfer()
