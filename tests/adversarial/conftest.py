"""The adversarial suite's harness: the real prober guest under real compiled tables.

Each module writes policy YAML into a temporary ``policies/`` directory, compiles it
with :func:`skilld.policy.compile_policies` and runs prober methods through the real
host functions with :class:`~skilld.permissions.SkillPermissions` as the checker.
Servers listen on 127.0.0.1 only and are bound before any call reaches them; names
under ``.test`` (reserved, never in DNS) resolve through a table the test controls.
"""

from __future__ import annotations

import http.server
import shutil
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from skilld.package.build import build_component
from skilld.sandbox import Component, Sandbox
from support.adversarial import WebHandler
from support.env import SKILLS, cache_dir

# name → addresses (getaddrinfo order); the only names the tests resolve besides literals.
FAKE_DNS: dict[str, tuple[str, ...]] = {
    "loop.test": ("127.0.0.1",),
    "api.test": ("127.0.0.1",),
    "db.test": ("127.0.0.1",),
    "cache.test": ("127.0.0.1",),
    "mapped.test": ("::ffff:127.0.0.1",),
    "six.test": ("::1",),
    "meta.test": ("169.254.169.254",),
    "ten.test": ("10.1.2.3",),
    "xn--bcher-kva.test": ("127.0.0.1",),
    "range.test": ("127.0.0.1",),
}


@pytest.fixture(autouse=True)
def fake_dns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Resolve ``*.test`` names from FAKE_DNS; everything else as the host does."""
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        name = str(host).lower().rstrip(".")
        if not name.isascii():
            name = name.encode("idna").decode("ascii")
        if name.endswith(".test"):
            if name not in FAKE_DNS:
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
            out = []
            for ip in FAKE_DNS[name]:
                family = socket.AF_INET6 if ":" in ip else socket.AF_INET
                sockaddr = (ip, int(port), 0, 0) if ":" in ip else (ip, int(port))
                out.append((family, socket.SOCK_STREAM, 6, "", sockaddr))
            return out
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.fixture(scope="module")
def prober(sandbox: Sandbox, component_path: Callable[[str], Path]) -> Component:
    """The prober guest, loaded once per module."""
    return sandbox.load(component_path("prober").read_bytes(), name="prober")


@pytest.fixture(scope="module")
def prober_mcp(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Component:
    """The prober built with the ``mcp`` need too (its own skill.yaml does not import mcp)."""
    src = tmp_path_factory.mktemp("prober-mcp") / "prober"
    shutil.copytree(SKILLS["prober"], src, ignore=shutil.ignore_patterns("__pycache__"))
    meta = (src / "skill.yaml").read_text()
    (src / "skill.yaml").write_text(meta.replace("needs:\n", "needs:\n  mcp: {}\n", 1))
    wasm = build_component(src, cache_dir=cache_dir())
    return sandbox.load(wasm.read_bytes(), name="prober-mcp")


@pytest.fixture(scope="module")
def web() -> Iterator[int]:
    """An HTTP server on 127.0.0.1 (bound before the fixture returns); yields its port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), WebHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def echo_server() -> Iterator[int]:
    """A TCP server on 127.0.0.1 that answers every connection with its first line, upper-cased."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.sendall(conn.recv(100).upper() or b"HELLO")
                except OSError:
                    continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield srv.getsockname()[1]
    stop.set()
    srv.close()
