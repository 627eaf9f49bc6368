"""http, tcp, shell and env host functions from a real guest, against local servers only."""

from __future__ import annotations

import base64
import http.server
import json
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from skilld.registry import NullChannel
from skilld.sandbox import CallContext, Component, Sandbox
from skilld.types import Decision, Limits
from support.checkers import TextQuestions


class SetChecker(TextQuestions):
    """Allows exactly the (capability, action, target) triples it was given."""

    def __init__(self, allowed: set[tuple[str, str, str]]):
        self.allowed = allowed

    def check(self, capability: str, action: str, target: str) -> Decision:
        if action == "address":  # "IP:PORT HOST": this checker lists addresses only
            target = target.split(" ")[0]
        ok = (capability, action, target) in self.allowed
        return Decision(
            ok,
            capability,
            action,
            target,
            "t.rule" if ok else "default-deny",
            "listed" if ok else f"{capability} {action} {target} is not listed",
        )


@pytest.fixture(scope="module")
def prober(sandbox: Sandbox, component_path: Callable[[str], Path]) -> Component:
    """The prober guest, loaded."""
    return sandbox.load(component_path("prober").read_bytes(), name="prober")


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.startswith("/redirect"):
            self.send_response(302)
            self.send_header("Location", self.path.split("to=", 1)[1])
            self.end_headers()
            return
        body = f"hello from {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def web() -> Iterator[int]:
    """An HTTP server on 127.0.0.1; yields its port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


def call(prober: Component, allowed: set[tuple[str, str, str]], method: str, **args: Any) -> Any:
    """One prober call under a SetChecker."""
    ctx = CallContext("prober", Limits(), NullChannel(), checker=SetChecker(allowed))
    return prober.call(method, json.dumps(args), ctx).value


def test_http_allowed(prober: Component, web: int) -> None:
    """A listed URL on a listed address is fetched."""
    url = f"http://127.0.0.1:{web}/x"
    out = call(
        prober,
        {("http", "GET", url), ("http", "address", f"127.0.0.1:{web}")},
        "http_request",
        url=url,
    )
    assert out == {"ok": {"status": 200, "body": "hello from /x"}}


def test_http_loopback_needs_address_rule(prober: Component, web: int) -> None:
    """A URL rule alone does not reach a loopback address: the resolved address is checked too."""
    url = f"http://localhost:{web}/x"
    out = call(prober, {("http", "GET", url)}, "http_request", url=url)
    assert out["error"] == "not-permitted" and "address" in out["message"]


def test_http_redirect_hop_checked(prober: Component, web: int) -> None:
    """A redirect to a URL outside the allowlist is refused at that hop."""
    first = f"http://127.0.0.1:{web}/redirect?to=http://127.0.0.1:{web}/secret"
    out = call(
        prober,
        {("http", "GET", first), ("http", "address", f"127.0.0.1:{web}")},
        "http_request",
        url=first,
    )
    assert out["error"] == "not-permitted" and "/secret" in out["message"]


def test_http_userinfo_refused(prober: Component, web: int) -> None:
    """URLs with userinfo are refused before any check could be confused by them."""
    url = f"http://evil.example@127.0.0.1:{web}/"
    out = call(
        prober,
        {("http", "GET", url), ("http", "address", f"127.0.0.1:{web}")},
        "http_request",
        url=url,
    )
    assert out["error"] == "not-permitted" and out["rule"] == "http.userinfo"


def test_tcp_exchange(prober: Component) -> None:
    """A listed host:port on a listed address connects, sends and receives."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]

    def serve() -> None:
        conn, _ = srv.accept()
        conn.sendall(conn.recv(100).upper())
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    allowed = {("tcp", "connect", f"127.0.0.1:{port}"), ("tcp", "address", f"127.0.0.1:{port}")}
    out = call(prober, allowed, "tcp_exchange", host="127.0.0.1", port=port, send="ping")
    assert base64.b64decode(out["ok"]) == b"PING"
    srv.close()


def test_tcp_unlisted_denied(prober: Component) -> None:
    """An unlisted host:port is refused before any connection."""
    out = call(prober, set(), "tcp_exchange", host="127.0.0.1", port=9)
    assert out["error"] == "not-permitted" and out["rule"] == "default-deny"


def test_shell_argv_only(prober: Component, tmp_path: Path) -> None:
    """An allowed argv runs without a shell: metacharacters stay literal arguments."""
    argv = ["/bin/echo", "a; rm -rf / $(id) `id` | cat"]
    allowed = {
        ("shell", "run", "/bin/echo 'a; rm -rf / $(id) `id` | cat'"),
        ("shell", "cwd", str(tmp_path)),
    }
    out = call(prober, allowed, "shell_run", argv=argv, cwd=str(tmp_path))
    assert out["ok"]["stdout"] == "a; rm -rf / $(id) `id` | cat\n"
    other = call(prober, allowed, "shell_run", argv=["/bin/echo", "a;", "rm"], cwd=str(tmp_path))
    assert other["error"] == "not-permitted" and other["rule"] == "default-deny"
    assert "shell run /bin/echo 'a;' rm is not listed" in other["message"]


def test_shell_env_is_scrubbed(prober: Component, monkeypatch: pytest.MonkeyPatch) -> None:
    """The child sees a scrubbed environment, not the host's."""
    monkeypatch.setenv("SKILLD_TEST_SECRET", "leak")
    out = call(prober, {("shell", "run", "/usr/bin/env")}, "shell_run", argv=["/usr/bin/env"])
    assert "SKILLD_TEST_SECRET" not in out["ok"]["stdout"]


def test_env_only_listed(prober: Component, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only listed variables are readable; unset ones are not-found."""
    monkeypatch.setenv("SKILLD_OK", "yes")
    monkeypatch.setenv("SKILLD_NO", "secret")
    allowed = {("env", "read", "SKILLD_OK"), ("env", "read", "SKILLD_UNSET")}
    assert call(prober, allowed, "env_get", name="SKILLD_OK") == {"ok": "yes"}
    denied = call(prober, allowed, "env_get", name="SKILLD_NO")
    assert denied["error"] == "not-permitted" and denied["rule"] == "default-deny"
    assert "env read SKILLD_NO is not listed" in denied["message"]
    assert call(prober, allowed, "env_get", name="SKILLD_UNSET") == {"ok": None}


def test_transfer_checks_the_grant_then_needs_a_cluster(prober: Component) -> None:
    """An ungranted transfer is not-permitted; a granted one outside a cluster is unavailable."""
    out = call(prober, set(), "transfer_send", node="n2", local_path="/a", remote_path="/b")
    assert out["error"] == "not-permitted" and out["rule"] == "default-deny"
    granted = {("transfer", "send", "n2:/a")}
    out = call(prober, granted, "transfer_send", node="n2", local_path="/a", remote_path="/b")
    assert out["error"] == "unavailable" and out["rule"] == "transfer.no-cluster"
    assert "not part of a cluster" in out["message"]
    # (tests/cluster/test_transfer.py moves files between two real nodes)
