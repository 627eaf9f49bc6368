"""The egress proxy of native scripts: their http grants reached, nothing else.

Real confined processes (``curl`` through ``shell.run``, a Python ``urllib`` script
through the native Agent Skill executor) against real servers on 127.0.0.1: a plain
HTTP server and a TLS server whose certificate comes from a CA the tests generate
(``skilld.package.write_server_tls``, as for the cluster bus).
Names under ``.test`` resolve through the suite's ``fake_dns`` table, in the host
process, where the proxy resolves them.
"""

from __future__ import annotations

import http.server
import importlib.util
import socket
import ssl
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skilld import agentskills
from skilld.errors import HostCallError
from skilld.package import write_server_tls
from skilld.permissions import SkillPermissions
from skilld.policy import compile_policies
from skilld.registry import Call, NullChannel, Registry, SkillEntry
from skilld.sandbox import CallContext
from skilld.sandbox._egress import BAD_REQUEST, TUNNEL_SLACK, EgressProxy
from skilld.sandbox.abi import shell
from skilld.types import Decision, Limits
from support.adversarial import compile_dir

CURL = "/usr/bin/curl"
CAP = 1000


class Upstream(http.server.BaseHTTPRequestHandler):
    """``/big?n=N`` (N bytes, with a length), ``/stream?n=N`` (chunked), ``/slow`` (one
    byte, then holds the line until the client goes: the time it went is kept),
    ``/redirect`` (a 302 to ``/secret``), anything else: ``METHOD PATH HOST BODY``."""

    protocol_version = "HTTP/1.1"
    closed_at: list[float] = []  # noqa: RUF012 - the servers' shared record, read by tests
    closed = threading.Condition()

    def _answer(self) -> None:
        path, _, query = self.path.partition("?")
        size = int(query[2:]) if query.startswith("n=") else 0
        if path == "/slow":
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b"x")
            self.wfile.flush()
            self.rfile.read(1)  # returns when the proxy closes the connection
            with Upstream.closed:
                Upstream.closed_at.append(time.monotonic())
                Upstream.closed.notify_all()
            return
        if path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "/secret")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if path == "/stream":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for _ in range(size // 100):
                self.wfile.write(b"64\r\n" + b"y" * 100 + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
            return
        sent = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        text = f"{self.command} {path} {self.headers['Host']} {sent.decode()}".strip()
        body = b"z" * size if path == "/big" else text.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_HEAD = _answer

    def log_message(self, *args: Any) -> None:
        """Quiet."""


def _serve(server: http.server.ThreadingHTTPServer) -> Iterator[int]:
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def web() -> Iterator[int]:
    """A plain HTTP server on 127.0.0.1; its port."""
    yield from _serve(http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream))


class _TLSServer(http.server.ThreadingHTTPServer):
    context: ssl.SSLContext

    def get_request(self) -> tuple[Any, Any]:
        sock, addr = super().get_request()
        return self.context.wrap_socket(sock, server_side=True), addr


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    """A TLS server on 127.0.0.1 with a test CA's certificate; its port and the CA file."""
    directory = tmp_path_factory.mktemp("tls")
    files = write_server_tls(directory, ["127.0.0.1"])
    server = _TLSServer(("127.0.0.1", 0), Upstream)
    server.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.context.load_cert_chain(files.cert, files.key)
    files.key.unlink()
    for port in _serve(server):
        yield port, files.ca


def context(tmp_path: Path, policy: str, seconds: float = 10.0) -> CallContext:
    """A call of skill ``s`` under ``policy`` (compiled), with ``seconds`` of wall time."""
    tables = compile_dir(tmp_path / "policies", {"s": policy})
    checker = SkillPermissions.from_tables(tables, "s")
    deadline = time.monotonic() + seconds
    return CallContext("s", checker.limits, NullChannel(), checker=checker, deadline=deadline)


def policy(http: str, extra: str = "") -> str:
    """``http`` rules (YAML list items) and curl allowed with any arguments."""
    return f"http:\n{http}shell:\n  - program: {CURL}\n    args: ['**']\n{extra}"


def curl(ctx: CallContext, *args: str) -> dict[str, Any]:
    """``curl -sS -i ARGS`` through ``shell.run`` (the proxy from its environment)."""
    return dict(shell.run(ctx, {"argv": [CURL, "-sS", "-i", "--max-time", "20", *args]}))


def audited(ctx: CallContext) -> int:
    """How many decisions the call took (those past the record's cap are counted)."""
    return len(ctx.decisions) + sum(ctx.decisions_beyond.values())


def http_decisions(ctx: CallContext) -> list[Decision]:
    """The call's decisions about http."""
    return [d for d in ctx.decisions if d.capability == "http"]


def test_granted_url_answers_and_each_request_is_audited(tmp_path: Path, web: int) -> None:
    """curl reaches a granted URL through the proxy with the checked Host; a URL outside
    the grant gets 403 naming the rule; each request leaves its decisions in the call."""
    rules = f"  - id: pub\n    url: http://127.0.0.1:{web}/pub/\n"
    ctx = context(tmp_path, policy(rules))
    ok = curl(ctx, f"http://127.0.0.1:{web}/pub/x")
    assert ok["exit_code"] == 0
    assert ok["stdout"].startswith(b"HTTP/1.1 200")
    assert ok["stdout"].endswith(f"GET /pub/x 127.0.0.1:{web}".encode())
    assert [(d.allowed, d.action, d.rule) for d in http_decisions(ctx)] == [
        (True, "GET", "s.pub"),
        (True, "address", "s.pub"),
    ]
    denied = curl(ctx, f"http://127.0.0.1:{web}/secret")
    assert denied["stdout"].startswith(b"HTTP/1.1 403")
    assert b"denied: 127.0.0.1 is a private or local address" in denied["stdout"]
    assert denied["stdout"].endswith(b"(default-deny)\n")
    last = http_decisions(ctx)[-1]
    assert (last.allowed, last.action, last.target) == (
        False,
        "GET",
        f"http://127.0.0.1:{web}/secret",
    )


def test_redirect_is_passed_back_and_the_next_hop_checked(tmp_path: Path, web: int) -> None:
    """A 3xx goes back to the client; following it, the next request is checked again."""
    ctx = context(tmp_path, policy(f"  - id: r\n    url: http://127.0.0.1:{web}/redirect\n"))
    out = curl(ctx, "-L", f"http://127.0.0.1:{web}/redirect")
    assert out["stdout"].startswith(b"HTTP/1.1 302")
    assert b"HTTP/1.1 403" in out["stdout"]
    assert [d.allowed for d in http_decisions(ctx) if d.action == "GET"] == [True, False]


def test_direct_connection_is_refused_by_the_kernel(tmp_path: Path, web: int) -> None:
    """Bypassing the proxy (``--noproxy '*'``), even to the granted address, fails to
    connect: the command may only connect to the proxy's port."""
    ctx = context(tmp_path, policy(f"  - url: http://127.0.0.1:{web}/\n"))
    out = curl(ctx, "--noproxy", "*", f"http://127.0.0.1:{web}/")
    assert out["exit_code"] == 7, out
    assert b"Couldn't connect" in out["stderr"] or b"Permission denied" in out["stderr"]
    assert http_decisions(ctx) == []


def test_no_http_grant_no_proxy(tmp_path: Path) -> None:
    """A skill without http grants gets no proxy variables (and no network)."""
    ctx = context(tmp_path, "shell:\n  - program: /usr/bin/env\n")
    out = shell.run(ctx, {"argv": ["/usr/bin/env"]})
    stdout = out["stdout"]
    assert isinstance(stdout, bytes)
    assert b"PROXY" not in stdout.upper()


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.2:{P}/", "127.0.0.2 is a private or local address"),
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is a cloud metadata address"),
        ("http://[::1]:{P}/", "::1 is a private or local address"),
        ("http://[::ffff:127.0.0.1]:{P}/", "is a private or local address"),
        ("http://loop.test:{P}/", "private, loopback or link-local"),
        ("http://meta.test/", "cloud metadata address"),
    ],
)
def test_private_and_metadata_addresses_are_refused(
    tmp_path: Path, web: int, url: str, reason: str
) -> None:
    """Private, loopback, mapped and metadata addresses, written or resolved from a name,
    are refused unless a rule names them (loop.test and meta.test resolve to 127.0.0.1 and
    169.254.169.254; their rules name only the host)."""
    rules = (
        "  - url: http://*/\n"
        f"  - url: http://loop.test:{web}/\n"
        "  - url: http://meta.test/\n"
        "    allow_private: true\n"
    )
    ctx = context(tmp_path, policy(rules))
    out = curl(ctx, url.replace("{P}", str(web)))
    assert out["stdout"].startswith(b"HTTP/1.1 403"), out
    assert reason.encode() in out["stdout"], out
    assert not http_decisions(ctx)[-1].allowed


def test_a_name_that_resolves_to_a_private_address_passes_when_allowed(
    tmp_path: Path, web: int
) -> None:
    """``allow_private`` on the name's own rule lets api.test (127.0.0.1) through, and
    the request goes to the checked address with the name as Host."""
    ctx = context(tmp_path, policy(f"  - url: http://api.test:{web}/\n    allow_private: true\n"))
    out = curl(ctx, f"http://api.test:{web}/v1")
    assert out["stdout"].endswith(f"GET /v1 api.test:{web}".encode()), out


def test_huge_response_is_bounded_like_the_host_function(tmp_path: Path, web: int) -> None:
    """A response announcing more than the rule's max_response_bytes is answered 502;
    a chunked one found longer is cut off incomplete (curl sees an error), never
    passed on whole."""
    rules = f"  - id: big\n    url: http://127.0.0.1:{web}/\n    max_response_bytes: {CAP}\n"
    ctx = context(tmp_path, policy(rules))
    announced = curl(ctx, f"http://127.0.0.1:{web}/big?n=5000")
    assert announced["stdout"].startswith(b"HTTP/1.1 502"), announced
    assert f"exceeds {CAP} bytes (s.big)".encode() in announced["stdout"]
    streamed = curl(ctx, f"http://127.0.0.1:{web}/stream?n=100000")
    assert streamed["exit_code"] != 0, streamed
    body = streamed["stdout"].partition(b"\r\n\r\n")[2]
    assert 0 < len(body) <= CAP, streamed
    within = curl(ctx, f"http://127.0.0.1:{web}/big?n={CAP}")
    assert within["stdout"].startswith(b"HTTP/1.1 200")
    assert within["stdout"].endswith(b"\r\n\r\n" + b"z" * CAP)


def test_connect_opens_a_tunnel_only_for_a_whole_origin(
    tmp_path: Path, tls: tuple[int, Path]
) -> None:
    """https through CONNECT: allowed when a rule grants every method on the whole
    origin (curl verifies the test CA's certificate through the tunnel); refused with
    403 when the only rule names a path or some methods, or another host."""
    port, ca = tls
    ro = f"fs:\n  - path: {ca.parent}\n"
    methods = "[GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS]"
    whole = context(
        tmp_path / "whole",
        policy(f"  - id: all\n    url: https://127.0.0.1:{port}/\n    methods: {methods}\n", ro),
    )
    out = curl(whole, "--cacert", str(ca), f"https://127.0.0.1:{port}/x")
    assert out["exit_code"] == 0, out
    assert out["stdout"].endswith(f"GET /x 127.0.0.1:{port}".encode()), out
    tunnel = [d for d in http_decisions(whole) if d.action == "CONNECT"]
    assert [(d.allowed, d.rule) for d in tunnel] == [(True, "s.all")]
    for name, rules, target in [
        ("path", f"  - url: https://127.0.0.1:{port}/v1/\n    methods: {methods}\n", "/v1/x"),
        ("methods", f"  - id: get\n    url: https://127.0.0.1:{port}/\n", "/x"),
        ("host", "  - url: https://api.example.com/\n", "/x"),
    ]:
        ctx = context(tmp_path / name, policy(rules, ro))
        refused = curl(ctx, "--cacert", str(ca), f"https://127.0.0.1:{port}{target}")
        assert refused["exit_code"] != 0, (name, refused)
        assert b"HTTP/1.1 403" in refused["stdout"], (name, refused)
        last = http_decisions(ctx)[-1]
        assert (last.allowed, last.action) == (False, "CONNECT"), name
        assert "a CONNECT tunnel carries any path and method" in last.reason, name


def test_slow_upstream_ends_at_the_deadline(tmp_path: Path, web: int) -> None:
    """An upstream that sends one byte and holds the line costs the command its
    deadline, no more: the command is killed and the proxy's upstream connection is
    closed by then."""
    ctx = context(tmp_path, policy(f"  - url: http://127.0.0.1:{web}/\n"), seconds=1.0)
    started, before = time.monotonic(), len(Upstream.closed_at)
    # The proxy's cut and the command's kill fall due at the same instant: whichever the
    # machine runs first, the command ends there, never with the whole answer.
    try:
        answered: dict[str, Any] | str = curl(ctx, f"http://127.0.0.1:{web}/slow")
    except HostCallError as caught:
        answered = caught.code
    assert answered == "timeout" or answered["exit_code"] != 0, answered  # never whole
    # The upstream's handler thread notes the close when it reads EOF: wait for it.
    with Upstream.closed:
        Upstream.closed.wait_for(lambda: len(Upstream.closed_at) > before, timeout=5)
    assert len(Upstream.closed_at) == before + 1
    assert Upstream.closed_at[-1] - started < 1.0 + 2.0  # the upstream holds it for ever


# -- the proxy alone, with a raw socket as the client ---------------------------------


@pytest.fixture
def proxy(tmp_path: Path, web: int) -> Iterator[tuple[EgressProxy, CallContext]]:
    """A proxy for a call granted everything under http://127.0.0.1:PORT/, 5 s left."""
    rules = f"  - url: http://127.0.0.1:{web}/\n    methods: [GET, POST]\n"
    ctx = context(tmp_path, policy(rules), seconds=5.0)
    assert ctx.deadline is not None
    with EgressProxy(ctx, ctx.deadline) as running:
        yield running, ctx


def exchange(port: int, data: bytes) -> bytes:
    """Send ``data``, close the sending side, read the whole answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        out = bytearray()
        while chunk := sock.recv(65536):
            out += chunk
    return bytes(out)


def test_proxy_deadline_ends_a_held_connection(tmp_path: Path, web: int) -> None:
    """The proxy ends a request whose upstream holds the line at the deadline it was
    given, whoever the client is."""
    ctx = context(tmp_path, policy(f"  - url: http://127.0.0.1:{web}/\n"), seconds=0.5)
    assert ctx.deadline is not None
    with EgressProxy(ctx, ctx.deadline) as running:
        started = time.monotonic()
        answer = exchange(
            running.port, f"GET http://127.0.0.1:{web}/slow HTTP/1.1\r\n\r\n".encode()
        )
        assert time.monotonic() - started < 0.5 + 2.0  # the upstream holds it for ever
    assert answer.startswith(b"HTTP/1.1 200")
    assert len(answer.partition(b"\r\n\r\n")[2]) < 100  # cut, never completed


SMUGGLING = [
    b"POST http://127.0.0.1:{P}/ HTTP/1.1\r\nContent-Length: 4\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"POST http://127.0.0.1:{P}/ HTTP/1.1\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\nabcde",
    b"POST http://127.0.0.1:{P}/ HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
    b"POST http://127.0.0.1:{P}/ HTTP/1.1\r\nTransfer-Encoding : chunked\r\n\r\n",
    b"GET http://127.0.0.1:{P}/ HTTP/1.1\r\nX: a\r\n folded\r\n\r\n",
    b"GET http://127.0.0.1:{P}/ HTTP/1.1\nHost: x\n\n",
    b"GET http://127.0.0.1:{P}/ HTTP/1.1\r\nX: " + b"a" * 70000 + b"\r\n\r\n",
    b"GET http://127.0.0.1:{P}/ HTTP/1.1\r\n" + b"X: a\r\n" * 101 + b"\r\n",
    b"GET /origin-form HTTP/1.1\r\nHost: 127.0.0.1:{P}\r\n\r\n",
    b"GET https://127.0.0.1:{P}/ HTTP/1.1\r\n\r\n",
    b"CONNECT 127.0.0.1 HTTP/1.1\r\n\r\n",
    b"GET http://127.0.0.1:{P}/ HTTP/2.0\r\n\r\n",
    b"POST http://127.0.0.1:{P}/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"POST http://127.0.0.1:{P}/ HTTP/1.1\r\nContent-Length: +4\r\n\r\nabcd",
    b"GET http://127.0.0.1:{P}/ HTTP/1.1\r\nX: a\x00b\r\n\r\n",
]


@pytest.mark.parametrize("request_bytes", SMUGGLING, ids=range(len(SMUGGLING)))
def test_hostile_framing_is_a_clean_400(
    proxy: tuple[EgressProxy, CallContext], web: int, request_bytes: bytes
) -> None:
    """Both Content-Length and Transfer-Encoding, two lengths, other codings, folded or
    bare-LF lines, overlong heads, non-proxy targets: 400, audited, nothing forwarded."""
    running, ctx = proxy
    answer = exchange(running.port, request_bytes.replace(b"{P}", str(web).encode()))
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n"), answer[:200]
    assert answer.count(b"\n") == 6  # status, 3 headers, blank line, one line of reason
    assert http_decisions(ctx)[-1].rule == BAD_REQUEST
    assert not any(d.allowed for d in http_decisions(ctx))
    assert ctx.host_faults == []


def test_chunked_request_body_is_reframed(proxy: tuple[EgressProxy, CallContext], web: int) -> None:
    """A well-formed chunked body reaches the upstream as one Content-Length body."""
    running, _ctx = proxy
    request = (
        f"POST http://127.0.0.1:{web}/echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        "3\r\nabc\r\n0\r\n\r\n"
    ).encode()
    answer = exchange(running.port, request)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    assert answer.endswith(f"POST /echo 127.0.0.1:{web} abc".encode()), answer


# -- a native Agent Skill script (Python urllib), allowed-tools: WebFetch ------------

FETCH = """\
import socket, ssl, sys, urllib.error, urllib.request

cafile, port = sys.argv[1], int(sys.argv[2])
tls = ssl.create_default_context(cafile=cafile)
for url in sys.argv[3:]:
    method = "POST" if url.startswith("POST ") else "GET"
    url = url.removeprefix("POST ")
    data = b"x" if method == "POST" else None
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, data=data, method=method), timeout=10, context=tls
        ) as answer:
            print(answer.status, answer.read().decode())
    except urllib.error.HTTPError as exc:
        print(exc.code, exc.read().decode().strip())
    except OSError as exc:
        print("ERROR", exc)
try:
    socket.create_connection(("127.0.0.1", port), timeout=5)
    print("DIRECT connected")
except OSError as exc:
    print("DIRECT refused", exc.errno)
"""


class ListSink:
    """Audit records kept in memory."""

    def __init__(self) -> None:
        self.records: list[Mapping[str, Any]] = []

    def emit(self, record: Mapping[str, Any]) -> None:
        """Keep one record."""
        self.records.append(record)


def test_native_script_with_webfetch_reaches_its_urls_only(
    tmp_path: Path, web: int, tls: tuple[int, Path]
) -> None:
    """A Python script of an Agent Skill whose ``allowed-tools: WebFetch`` maps to the
    policy's URLs (GET only): urllib reaches the plain and the TLS URL through the
    proxy, a POST and another URL get 403 naming the rule, a direct connection is
    refused by the kernel, and the call's audit record holds every decision."""
    tls_port, ca = tls
    skill = tmp_path / "fetcher"
    (skill / "scripts").mkdir(parents=True)
    (skill / "SKILL.md").write_text(
        "---\nname: fetcher\ndescription: Fetches pages. Test use only.\n"
        "allowed-tools: WebFetch\n---\n\n# Fetcher\n"
    )
    (skill / "scripts" / "fetch.py").write_text(FETCH)
    methods = "[GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS]"
    grants = (
        f"http:\n  - id: web\n    url: http://127.0.0.1:{web}/pub/\n    methods: {methods}\n"
        f"  - id: tls\n    url: https://127.0.0.1:{tls_port}/\n    methods: {methods}\n"
        f"fs:\n  - path: {ca.parent}\n"
    )
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "fetcher.yaml").write_text(grants)
    source = agentskills.read_source(skill)
    granted = compile_policies(policies).tables.skill("fetcher")
    needs = agentskills.tools_to_needs(source.md.allowed_tools, granted).needs
    needs = {**needs, "fs": [{"path": str(ca.parent), "mode": "ro"}]}
    result = compile_policies(policies, {"fetcher": needs})
    assert not result.problems, result.problems
    table = result.tables.skill("fetcher")
    spec = agentskills.describe(source.md, "0.0.0", source.files)
    limits = Limits(timeout_ms=20_000, memory_bytes=256 << 20)
    backend = agentskills.open_backend(
        spec, skill, None, "native", {"interpreters": ("python",)}, table, limits
    )
    sink = ListSink()
    registry = Registry(audit=sink)
    checker = SkillPermissions.from_tables(result.tables, "fetcher")
    registry.add(SkillEntry(spec=spec, component=backend, limits=limits, checker=checker))
    urls = [
        f"http://127.0.0.1:{web}/pub/a",
        f"POST http://127.0.0.1:{web}/pub/a",
        f"http://127.0.0.1:{web}/other",
        f"https://127.0.0.1:{tls_port}/b",
    ]
    out = registry.call_method(
        Call(
            "fetcher",
            "run_script",
            {"script": "scripts/fetch.py", "args": [str(ca), str(web), *urls]},
        )
    ).value
    lines = out["stdout"].splitlines()
    assert lines[0] == f"200 GET /pub/a 127.0.0.1:{web}", out
    assert lines[1].startswith("403 skilld egress: http.POST"), out
    assert lines[1].endswith("(fetcher.web)"), out
    assert lines[2].startswith("403 skilld egress: http.GET"), out
    # GET only (WebFetch): a tunnel, which could carry any method, is refused.
    assert lines[3].startswith("ERROR") and "403" in lines[3], out
    assert lines[4].startswith("DIRECT refused"), out
    record = sink.records[-1]
    shown = [(d["allowed"], d["action"]) for d in record["decisions"] if d["capability"] == "http"]
    assert shown == [
        (True, "GET"),
        (True, "address"),
        (False, "POST"),
        (False, "GET"),
        (False, "CONNECT"),
    ]


# -- hostile input, generated -----------------------------------------------------------

_ANSWERS = (b"HTTP/1.1 400 ", b"HTTP/1.1 403 ", b"HTTP/1.1 413 ", b"HTTP/1.1 200 ")


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=3000))
def test_random_bytes_get_a_clean_400(proxy: tuple[EgressProxy, CallContext], data: bytes) -> None:
    """Whatever bytes a script sends, the proxy answers 400 in one line, audits the
    refusal and has no fault of its own."""
    running, ctx = proxy
    before = audited(ctx)
    answer = exchange(running.port, data)
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n"), answer[:200]
    assert audited(ctx) == before + 1
    assert ctx.host_faults == []


_TOKEN = st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_", min_size=1, max_size=12)
_HEADER_NAME = st.one_of(
    st.sampled_from(["Content-Length", "Transfer-Encoding", "Host", "Connection", "Expect"]),
    _TOKEN,
    st.binary(max_size=20).map(lambda b: b.decode("latin-1")),
)
_HEADER_VALUE = st.one_of(
    st.sampled_from(["0", "3", "chunked", "close", "100-continue", "-1", "1e3", " 3", "3 "]),
    st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
)


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    method=st.sampled_from(["GET", "POST", "HEAD", "CONNECT", "get", "DELETE", "BREW"]),
    path=st.sampled_from(["/pub/x", "/", "/../x", "/%2e%2e/x", "?a", "/x\x00"]),
    version=st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/1.2", "HTTP/2", ""]),
    headers=st.lists(st.tuples(_HEADER_NAME, _HEADER_VALUE), max_size=6),
    body=st.binary(max_size=64),
    end=st.sampled_from(["\r\n", "\n"]),
)
def test_hostile_requests_end_cleanly(
    proxy: tuple[EgressProxy, CallContext],
    web: int,
    method: str,
    path: str,
    version: str,
    headers: list[tuple[str, str]],
    body: bytes,
    end: str,
) -> None:
    """Near-valid requests with hostile methods, targets, versions, header names and
    values and line ends: every one gets one answer (400, 403, 413 or the upstream's
    200), never a hang or a fault of the proxy; each leaves a decision."""
    running, ctx = proxy
    before = audited(ctx)
    target = f"127.0.0.1:{web}" if method == "CONNECT" else f"http://127.0.0.1:{web}{path}"
    head = f"{method} {target} {version}{end}" + "".join(f"{k}: {v}{end}" for k, v in headers)
    answer = exchange(running.port, (head + end).encode("latin-1") + body)
    assert answer.startswith(_ANSWERS), answer[:300]
    assert audited(ctx) > before
    assert ctx.host_faults == []


def test_request_for_the_proxy_itself_is_refused(tmp_path: Path) -> None:
    """A request naming the proxy's own port (a loop through it) is refused with 403,
    even when the grant names the address and every port."""
    ctx = context(tmp_path, policy("  - url: http://127.0.0.1:1-65535/\n"))
    assert ctx.deadline is not None
    with EgressProxy(ctx, ctx.deadline) as running:
        answer = exchange(
            running.port, f"GET http://127.0.0.1:{running.port}/ HTTP/1.1\r\n\r\n".encode()
        )
    assert answer.startswith(b"HTTP/1.1 403"), answer
    assert answer.endswith(b"a request for the egress proxy itself (egress.self)\n")


def test_proxy_port_is_free_on_every_address(tmp_path: Path) -> None:
    """The proxy never takes a port some socket holds on another local address (the
    Landlock rule opens the port on every address): with 1000 ports held on 127.0.0.2,
    500 proxies pick none of them (about 18 would, were ports picked blindly)."""
    ctx = context(tmp_path, policy("  - url: http://api.example.com/\n"))
    held: list[socket.socket] = []
    try:
        for _ in range(1000):
            held.append(socket.create_server(("127.0.0.2", 0)))
        taken = {s.getsockname()[1] for s in held}
        for _ in range(500):
            with EgressProxy(ctx, time.monotonic() + 5) as running:
                assert running.port not in taken
    finally:
        for sock in held:
            sock.close()


@pytest.mark.skipif(
    importlib.util.find_spec("skilld.confine._seccomp") is None,
    reason="UDP is refused by the seccomp layer (issue 19, item 2), merged on its own branch",
)
def test_udp_stays_refused_beside_the_proxy(tmp_path: Path) -> None:
    """A command routed through the proxy shares the host's network for its one TCP
    port; a UDP datagram (DNS exfiltration, say) still reaches nobody."""
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.setblocking(False)
    port = receiver.getsockname()[1]
    script = f"echo leak > /dev/udp/127.0.0.1/{port}"
    rules = "  - url: http://api.example.com/\n"
    ctx = context(
        tmp_path, policy(rules, f"  - program: /bin/bash\n    args: ['-c', '{script}']\n")
    )
    try:
        shell.run(ctx, {"argv": ["/bin/bash", "-c", script]})
        with pytest.raises(BlockingIOError):
            receiver.recv(100)  # loopback delivers before sendto returns
    finally:
        receiver.close()


def test_tunnel_to_a_private_address_is_refused(tmp_path: Path, tls: tuple[int, Path]) -> None:
    """CONNECT to loopback or metadata addresses is refused by the origin check unless
    a rule names them, whatever the rule for every host allows."""
    port, ca = tls
    methods = "[GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS]"
    ctx = context(tmp_path, policy(f"  - url: https://*/\n    methods: {methods}\n"))
    for target in (
        f"https://[::1]:{port}/",
        "https://169.254.169.254/",
        f"https://127.0.0.2:{port}/",
    ):
        out = curl(ctx, "--cacert", str(ca), target)
        assert b"HTTP/1.1 403" in out["stdout"], (target, out)
        last = http_decisions(ctx)[-1]
        assert (last.allowed, last.action) == (False, "CONNECT"), target
        assert "address" in last.reason, (target, last.reason)


def test_tunnel_brings_back_no_more_than_the_cap(tmp_path: Path, tls: tuple[int, Path]) -> None:
    """Through a tunnel the bytes back are capped at the rule's max_response_bytes plus
    the handshake's allowance: a 1 MiB answer is cut off and curl sees an error."""
    port, ca = tls
    methods = "[GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS]"
    rules = (
        f"  - id: small\n    url: https://127.0.0.1:{port}/\n    methods: {methods}\n"
        f"    max_response_bytes: {CAP}\n"
    )
    ctx = context(tmp_path, policy(rules, f"fs:\n  - path: {ca.parent}\n"))
    out = curl(ctx, "--cacert", str(ca), f"https://127.0.0.1:{port}/big?n={1 << 20}")
    assert out["exit_code"] != 0, out
    assert len(out["stdout"]) < CAP + TUNNEL_SLACK
    last = http_decisions(ctx)[-1]
    assert (last.allowed, last.action, last.rule) == (False, "CONNECT", "s.small")
    assert "brought back more than" in last.reason


class FlagChannel(NullChannel):
    """A client that cancels when the test says so."""

    def __init__(self) -> None:
        self.flag = threading.Event()

    def cancelled(self) -> bool:
        """True once the test cancelled."""
        return self.flag.is_set()


def test_cancelled_call_ends_the_proxys_connections(tmp_path: Path, web: int) -> None:
    """When the client cancels the call, a connection held by a slow upstream ends
    within a wait slice, long before the deadline."""
    ctx = context(tmp_path, policy(f"  - url: http://127.0.0.1:{web}/\n"), seconds=30)
    channel = FlagChannel()
    ctx.channel = channel
    assert ctx.deadline is not None
    with (
        EgressProxy(ctx, ctx.deadline) as running,
        socket.create_connection(("127.0.0.1", running.port), timeout=10) as sock,
    ):
        sock.sendall(f"GET http://127.0.0.1:{web}/slow HTTP/1.1\r\n\r\n".encode())
        head = sock.recv(1000)  # the upstream's head: the connection is now held
        assert head.startswith(b"HTTP/1.1 200")
        channel.flag.set()
        started = time.monotonic()
        while sock.recv(1000):
            pass
        assert time.monotonic() - started < 3.0  # the upstream holds it for ever
