"""Egress for native scripts: a local HTTP/1.1 forward proxy that asks the ``http`` tables.

A confined command (``shell.run``, a native Agent Skill script) of a skill with
``http`` grants gets ``HTTP_PROXY``/``HTTPS_PROXY`` (both cases; ``NO_PROXY`` empty)
naming a proxy on ``127.0.0.1`` and a Landlock rule letting it connect to that one
port; every other connection is refused by the kernel. :func:`route` starts the proxy
for one command and stops it when the command ends (starting and stopping costs well
under a millisecond; see ``docs/confinement.md``, "Egress").

The proxy applies the checks of the wasm ``http`` host function (``abi/http.py``),
through the same code, recorded in the call's audit record the same way:

- ``METHOD http://host[:port]/path HTTP/1.1`` (absolute form): the URL is checked as
  ``check_url(URL, METHOD)``, the name is resolved once, each address is checked
  (``check_address(ip, port, "http", host)``: private, loopback, link-local and
  metadata addresses refused unless a rule names them), and the request goes to the
  checked address, never to the name again (no DNS rebinding). The Host header is the
  checked URL's; hop-by-hop headers are dropped; the body is re-framed with a
  Content-Length. The response is passed back with ``Connection: close``, its body
  capped like the host function's (the deciding rule's ``max_response_bytes``, host
  cap 8 MiB): a response announcing more is answered 502, one found longer while
  streaming is cut off without its end, so the client sees an incomplete response.
  Redirects are not followed: a 3xx goes back to the client, whose next request is
  checked again.
- ``CONNECT host:port`` (TLS): a tunnel carries any path and any method unseen, so it
  is opened only when the tables allow *every* method on the whole origin
  ``https://host:port/`` (a rule such as ``url: https://api.example.com/`` with all
  methods). A rule restricted to a path or to some methods still serves wasm skills,
  but a native script cannot use it over TLS. The resolved address is checked as
  above; bytes coming back through the tunnel are capped at the rule's cap plus
  :data:`TUNNEL_SLACK` for the TLS handshake.
- Every connection ends at the command's deadline (and when the client cancels the
  call, or the proxy stops). A request that is not plain HTTP/1.x (CR LF line ends,
  token header names, one framing: both Content-Length and Transfer-Encoding, several
  Content-Lengths or a coding other than ``chunked`` are refused), is larger than
  :data:`MAX_HEAD` or has a body over :data:`MAX_REQUEST_BODY` is answered 400 (413
  for the body). A refusal by the tables is answered 403 with one line: the same
  text the wasm guest gets, naming the rule.

Every request, allowed or refused, leaves a decision in the call's record: the
tables' own (``http`` METHOD URL, ``http`` address), or for what never reached them
``http`` ``proxy`` with rule :data:`BAD_REQUEST`, and ``http`` ``CONNECT`` for tunnels.
"""

from __future__ import annotations

import errno
import http.client
import ipaddress
import re
import select
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from typing import Any

from skilld.call import CallContext
from skilld.confine import Confinement
from skilld.errors import ErrorCode, HostCallError
from skilld.sandbox.abi import decide, url_question
from skilld.sandbox.abi._net import BoundedSocket, bound_socket, connect, resolve_checked
from skilld.sandbox.abi.http import _METHODS, MAX_BODY, _cap, _split
from skilld.types import ClientChannel, Decision

# Rule id of requests refused before the tables could be asked (not HTTP, hostile framing).
BAD_REQUEST = "egress.bad-request"
# Rule id of requests for the proxy itself (a loop through it).
SELF = "egress.self"
MAX_LINE = 8 * 1024
MAX_HEAD = 64 * 1024
MAX_HEADERS = 100
MAX_REQUEST_BODY = MAX_BODY
# Connections served at once; more are answered 503 at once. Each holds at most one
# request body (MAX_REQUEST_BODY) in memory: 64 MiB for a command at worst.
MAX_CONNECTIONS = 8
# What a TLS handshake may bring back through a tunnel beyond the body cap.
TUNNEL_SLACK = 64 * 1024
_CHUNK = 64 * 1024
# After a refusal, how long and how much of what the client still sends is read.
_DRAIN_S = 1.0
_DRAIN_BYTES = 1 << 20
# How many ports to try when the one found free is taken before the proxy binds it.
_PORT_TRIES = 8

_REQUEST_LINE = re.compile(rb"([A-Z]{1,16}) ([\x21-\x7e]{1,8000}) HTTP/1\.([01])\r\n")
_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[ \t]*([\x20-\x7e\x80-\xff\t]*?)[ \t]*\r\n")
_AUTHORITY = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~%!$&'()*+,;=-]+):([0-9]{1,5})")
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,8})(?:[ \t]*;[\x20-\x7e\t]*)?\r\n")
# Headers that belong to one connection, never forwarded either way.
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "proxy-authenticate",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "expect",
        "host",
    }
)


class _Answer(Exception):
    """An answer the proxy gives itself (400, 403, 502, ...), in one line."""

    def __init__(self, status: int, reason: str, line: str):
        super().__init__(line)
        self.status, self.reason, self.line = status, reason, line


def _refusal(exc: HostCallError) -> _Answer:
    """A host function's refusal as the proxy's answer, with the same text."""
    text = f"{exc.message} ({exc.rule})" if exc.rule else exc.message
    status = {
        ErrorCode.NOT_PERMITTED: (403, "Forbidden"),
        ErrorCode.INVALID_ARGUMENT: (400, "Bad Request"),
        ErrorCode.LIMIT_EXCEEDED: (502, "Bad Gateway"),
        ErrorCode.TIMEOUT: (504, "Gateway Timeout"),
        ErrorCode.CANCELLED: (503, "Service Unavailable"),
    }.get(ErrorCode(exc.code), (502, "Bad Gateway"))
    return _Answer(*status, text)


class _Closing:
    """The call's client channel, seen as cancelled once the proxy stops too.

    Every wait of the proxy's connections is in slices that ask ``cancelled()``
    (``CallContext.waits``), so stopping the proxy ends them all within a slice.
    """

    def __init__(self, channel: ClientChannel, stopped: threading.Event):
        self._channel, self._stopped = channel, stopped

    def cancelled(self) -> bool:
        """True once the client cancelled the call or the proxy stopped."""
        return self._stopped.is_set() or self._channel.cancelled()

    def progress(self, progress: float, total: float | None, message: str | None) -> None:
        """The call's own."""
        self._channel.progress(progress, total, message)

    def log(self, level: str, data: Any) -> None:
        """The call's own."""
        self._channel.log(level, data)

    def sample(self, params: Mapping[str, Any]) -> Mapping[str, Any]:
        """The call's own."""
        return self._channel.sample(params)

    def elicit(self, params: Mapping[str, Any]) -> Mapping[str, Any]:
        """The call's own."""
        return self._channel.elicit(params)


class _Reader:
    """Buffered reads from the script's connection, each bounded by the call."""

    def __init__(self, sock: BoundedSocket):
        self.sock, self.buf = sock, bytearray()

    def _fill(self) -> None:
        data = self.sock.recv(_CHUNK)
        if not data:
            raise _Answer(400, "Bad Request", "the request ended early")
        self.buf += data

    def line(self, limit: int) -> bytes:
        while True:
            end = self.buf.find(b"\n")
            if end >= 0:
                if end + 1 > limit:
                    break
                out = bytes(self.buf[: end + 1])
                del self.buf[: end + 1]
                return out
            if len(self.buf) > limit:
                break
            self._fill()
        raise _Answer(400, "Bad Request", f"a request line or header is longer than {limit} bytes")

    def exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out


@dataclass(frozen=True)
class _Request:
    method: str
    target: str
    minor: int
    headers: list[tuple[str, str]]
    body: bytes


def _bad(what: str) -> _Answer:
    return _Answer(400, "Bad Request", what)


def _read_request(reader: _Reader) -> _Request:
    """One request, strictly: anything ambiguous about its framing is refused."""
    head = reader.line(MAX_LINE + 2)
    found = _REQUEST_LINE.fullmatch(head)
    if found is None:
        raise _bad("not an HTTP/1.x request line")
    method, target = found[1].decode(), found[2].decode()
    headers: list[tuple[str, str]] = []
    size = len(head)
    while True:
        line = reader.line(MAX_LINE + 2)
        size += len(line)
        if size > MAX_HEAD:
            raise _bad(f"the request head is longer than {MAX_HEAD} bytes")
        if line == b"\r\n":
            break
        header = _HEADER.fullmatch(line)
        if header is None:
            raise _bad("a malformed header line (or a line folded or ended by a bare LF)")
        if len(headers) >= MAX_HEADERS:
            raise _bad(f"more than {MAX_HEADERS} headers")
        headers.append((header[1].decode().lower(), header[2].decode("latin-1")))
    lengths = {v for k, v in headers if k == "content-length"}
    codings = [v for k, v in headers if k == "transfer-encoding"]
    if lengths and codings:
        raise _bad("both Content-Length and Transfer-Encoding (request smuggling) are refused")
    if codings:
        if len(codings) > 1 or codings[0].strip().lower() != "chunked":
            raise _bad("only one Transfer-Encoding, chunked, is accepted")
        _continue(reader, headers, 1)
        body = _chunked(reader)
    elif lengths:
        text = next(iter(lengths))
        if len(lengths) > 1 or not (text.isascii() and text.isdigit()) or len(text) > 10:
            raise _bad("Content-Length must be one decimal number")
        length = int(text)
        if length > MAX_REQUEST_BODY:
            raise _Answer(413, "Content Too Large", f"request bodies over {MAX_REQUEST_BODY} bytes")
        _continue(reader, headers, length)
        body = reader.exact(length)
    else:
        body = b""
    return _Request(method, target, int(found[3]), headers, body)


def _continue(reader: _Reader, headers: list[tuple[str, str]], length: int) -> None:
    """Tell a client that waits for it (``Expect: 100-continue``) to send its body."""
    if length and any(k == "expect" and v.lower() == "100-continue" for k, v in headers):
        reader.sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")


def _chunked(reader: _Reader) -> bytes:
    body = bytearray()
    while True:
        size_line = _CHUNK_SIZE.fullmatch(reader.line(MAX_LINE + 2))
        if size_line is None:
            raise _bad("a malformed chunk size")
        size = int(size_line[1], 16)
        if len(body) + size > MAX_REQUEST_BODY:
            raise _Answer(413, "Content Too Large", f"request bodies over {MAX_REQUEST_BODY} bytes")
        if size == 0:
            break
        body += reader.exact(size)
        if reader.exact(2) != b"\r\n":
            raise _bad("a chunk not ended by CR LF")
    size = 0
    while (line := reader.line(MAX_LINE + 2)) != b"\r\n":  # trailers, dropped
        size += len(line)
        if size > MAX_HEAD or _HEADER.fullmatch(line) is None:
            raise _bad("malformed trailers")
    return bytes(body)


def _printable(text: str, limit: int = 200) -> str:
    shown = text.encode("ascii", "backslashreplace").decode()
    return shown if len(shown) <= limit else shown[:limit] + "..."


def _unused_port() -> int:
    """A port no socket is bound to on any local address, IPv4 or IPv6, right now.

    A Landlock rule names a port, not an address: were a service listening on the
    proxy's port on another local address (the host's LAN address, a bridge), the
    command could reach it. A wildcard bind conflicts with every bind of its port, so
    the port the kernel picks for it is free everywhere.

    Raises:
        OSError: no port could be bound at all.
    """
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as guard:
            guard.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            guard.bind(("::", 0))
            return int(guard.getsockname()[1])
    except OSError:  # no IPv6 here: IPv4's wildcard covers what can be reached
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as guard:
            guard.bind(("0.0.0.0", 0))  # noqa: S104 - bound, never listened on
            return int(guard.getsockname()[1])

# How long after the command's deadline the proxy ends its connections itself.
_BACKSTOP_S = 0.5


def _drain(sock: socket.socket, until: float) -> None:
    """Read what the client still sends, for a moment, before closing: closing with
    unread bytes resets the connection, and the client might lose the answer."""
    end = min(time.monotonic() + _DRAIN_S, until)
    left = _DRAIN_BYTES
    while left > 0 and (wait := end - time.monotonic()) > 0:
        socket.socket.settimeout(sock, wait)
        data = socket.socket.recv(sock, _CHUNK)
        if not data:
            return
        left -= len(data)


class EgressProxy:
    """The forward proxy of one command (see the module docstring); a context manager.

    Args:
        ctx: the call whose tables decide and whose record keeps the decisions.
        until: monotonic time at which the command, and every connection, ends.

    Raises:
        HostCallError: ``unavailable`` when it could not listen.
    """

    def __init__(self, ctx: CallContext, until: float):
        self._stopped = threading.Event()
        # The call's context, its channel also cancelled once the proxy stops;
        # decisions, faults and the deadline are the call's own (shared, not copied).
        self._ctx = replace(ctx, channel=_Closing(ctx.channel, self._stopped))
        self._until = until
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._listener = self._bind()
        self.port: int = self._listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept, name="skilld-egress", daemon=True)
        self._acceptor.start()

    @staticmethod
    def _bind() -> socket.socket:
        """A listener on 127.0.0.1, on a port that was free on every address."""
        why = "every port found free was taken before the proxy could bind it"
        for _ in range(_PORT_TRIES):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind(("127.0.0.1", _unused_port()))
                sock.listen(MAX_CONNECTIONS)
            except OSError as exc:
                sock.close()
                if exc.errno == errno.EADDRINUSE:  # taken in between: another one
                    continue
                why = exc.strerror or str(exc)
                break
            return sock
        raise HostCallError("unavailable", f"the egress proxy could not listen: {why}")

    @property
    def env(self) -> dict[str, str]:
        """What the command's environment gets: the proxy for http and https, no exceptions."""
        url = f"http://127.0.0.1:{self.port}"
        names = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
        return {**dict.fromkeys(names, url), "NO_PROXY": "", "no_proxy": ""}

    def __enter__(self) -> EgressProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop accepting, end every connection (within a wait slice) and wait for them."""
        self._stopped.set()
        with suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._acceptor.join()
        with self._lock:
            socks, threads = list(self._open), list(self._threads)
        for sock in socks:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in threads:
            # Every wait of a connection is sliced and now sees the stop: this is short.
            # A thread still running past it can act no more (each wait raises).
            thread.join(timeout=_DRAIN_S + 1)

    # -- connections ---------------------------------------------------------

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            thread = threading.Thread(
                target=self._serve, args=(client,), name="skilld-egress-conn", daemon=True
            )
            with self._lock:
                busy = len(self._threads) >= MAX_CONNECTIONS or self._stopped.is_set()
                if not busy:
                    self._threads.add(thread)
                    self._open.add(client)
            if busy:
                with suppress(OSError):
                    client.setblocking(False)
                    client.send(b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n\r\n")
                client.close()
                continue
            thread.start()

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.add(sock)

    def _serve(self, raw: socket.socket) -> None:
        ctx = self._ctx
        sent = [False]
        sock: BoundedSocket | None = None
        try:
            sock = bound_socket(ctx, raw, "egress: the script's connection", self._until)
            self._track(sock)
            self._handle(sock, sent)
        except _Answer as answer:
            self._answer(sock, answer, sent)
        except HostCallError as exc:
            self._answer(sock, _refusal(exc), sent)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self._answer(sock, _Answer(502, "Bad Gateway", f"upstream failed: {exc}"), sent)
        except Exception as exc:  # noqa: BLE001 - a connection's fault must never escape its thread
            ctx.record_fault(f"egress: {type(exc).__name__}: {exc}")
            self._answer(sock, _Answer(500, "Internal Server Error", "the proxy failed"), sent)
        finally:
            with self._lock:
                self._open.discard(raw)
                if sock is not None:
                    self._open.discard(sock)
                self._threads.discard(threading.current_thread())
            (sock or raw).close()

    def _answer(self, sock: BoundedSocket | None, answer: _Answer, sent: list[bool]) -> None:
        """Answer the script once, if nothing was sent yet; give up at once otherwise."""
        if sock is None or sent[0] or self._stopped.is_set():
            return
        body = f"skilld egress: {_printable(answer.line, 1000)}\n".encode()
        head = (
            f"HTTP/1.1 {answer.status} {answer.reason}\r\nContent-Type: text/plain\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        sent[0] = True
        with suppress(OSError, HostCallError):
            sock.sendall(head + body)
            sock.shutdown(socket.SHUT_WR)
            _drain(sock, self._until)

    def _bad_request(self, reader_error: _Answer, shown: str) -> _Answer:
        self._ctx.record(
            Decision(False, "http", "proxy", _printable(shown), BAD_REQUEST, reader_error.line)
        )
        return reader_error

    def _handle(self, sock: BoundedSocket, sent: list[bool]) -> None:
        reader = _Reader(sock)
        try:
            req = _read_request(reader)
        except _Answer as bad:
            raise self._bad_request(bad, "a request") from None
        if req.method == "CONNECT":
            self._tunnel(sock, reader, req, sent)
        else:
            self._forward(sock, req, sent)

    def _not_self(self, ip: str, port: int, shown: str, action: str) -> None:
        addr = ipaddress.ip_address(ip)
        if port == self.port and (addr.is_loopback or addr.is_unspecified):
            reason = "a request for the egress proxy itself"
            self._ctx.record(Decision(False, "http", action, shown, SELF, reason))
            raise _Answer(403, "Forbidden", f"http.{action} {shown} denied: {reason} ({SELF})")

    def _upstream(self, ip: str, port: int, host: str) -> BoundedSocket:
        raw = connect(self._ctx, ip, port, self._until - time.monotonic())
        sock = bound_socket(self._ctx, raw, f"egress: {host}", self._until)
        self._track(sock)
        return sock

    def _forward(self, client: BoundedSocket, req: _Request, sent: list[bool]) -> None:
        ctx = self._ctx
        url = req.target
        if not url.lower().startswith("http://"):
            why = (
                "https goes through CONNECT"
                if url.lower().startswith("https://")
                else "a proxy request names an absolute http:// URL"
            )
            raise self._bad_request(_bad(why), f"{req.method} {url}")
        if req.method not in _METHODS:
            raise self._bad_request(_bad(f"unsupported method {req.method}"), f"{req.method} {url}")
        decision = decide(ctx, "http", req.method, url, question=url_question(url, req.method))
        _scheme, host, port, path = _split(url)
        cap = _cap(ctx, decision)
        ip = resolve_checked(ctx, "http", host, port)
        self._not_self(ip, port, url, req.method)
        upstream = self._upstream(ip, port, host)
        resp = None
        try:
            upstream.sendall(self._request_bytes(req, host, port, path))
            resp = http.client.HTTPResponse(upstream, method=req.method)
            resp.begin()
            self._relay(client, resp, req, url, decision, cap, sent)
        finally:
            if resp is not None:
                resp.close()  # its file holds the socket open past upstream.close()
            upstream.close()

    @staticmethod
    def _request_bytes(req: _Request, host: str, port: int, path: str) -> bytes:
        listed = {
            token.strip().lower()
            for k, v in req.headers
            if k == "connection"
            for token in v.split(",")
        }
        name = f"[{host}]" if ":" in host else host
        authority = name if port == 80 else f"{name}:{port}"
        lines = [f"{req.method} {path} HTTP/1.1", f"Host: {authority}"]
        lines += [f"{k}: {v}" for k, v in req.headers if k not in _HOP and k not in listed]
        if req.body or req.method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(req.body)}")
        lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + req.body

    def _relay(
        self,
        client: BoundedSocket,
        resp: http.client.HTTPResponse,
        req: _Request,
        url: str,
        decision: Decision,
        cap: int,
        sent: list[bool],
    ) -> None:
        def too_big() -> _Answer:
            reason = f"the response exceeds {cap} bytes"
            self._ctx.record(Decision(False, "http", req.method, url, decision.rule, reason))
            return _Answer(
                502, "Bad Gateway", f"response from {url} exceeds {cap} bytes ({decision.rule})"
            )

        if resp.status < 200 or resp.status == 101:
            raise _Answer(502, "Bad Gateway", f"unexpected status {resp.status} from {url}")
        listed = {t.strip().lower() for t in (resp.getheader("Connection") or "").split(",")}
        headers = [
            (k, v)
            for k, v in resp.getheaders()
            if k.lower() not in _HOP
            and k.lower() not in listed
            and _NAME.fullmatch(k)
            and "\r" not in v
            and "\n" not in v
        ]
        bodiless = req.method == "HEAD" or resp.status in (204, 304)
        length = resp.length
        if bodiless:
            announced = resp.getheader("Content-Length")
            if announced is not None and announced.strip().isdigit():
                headers.append(("Content-Length", announced.strip()))
        elif length is not None:
            if length > cap:
                raise too_big()
            headers.append(("Content-Length", str(length)))
        elif req.minor == 1:
            headers.append(("Transfer-Encoding", "chunked"))
        else:  # an HTTP/1.0 client cannot tell a cut body from a whole one: read it first
            data = resp.read(cap + 1)
            if len(data) > cap:
                raise too_big()
            headers.append(("Content-Length", str(len(data))))
            self._send_head(client, resp, headers, sent)
            client.sendall(data)
            return
        self._send_head(client, resp, headers, sent)
        if bodiless:
            return
        chunked = length is None
        total = 0
        while piece := resp.read1(_CHUNK):
            total += len(piece)
            if total > cap:
                too_big()  # recorded; the client's response stays incomplete
                return
            client.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
        if chunked:
            client.sendall(b"0\r\n\r\n")

    @staticmethod
    def _send_head(
        client: BoundedSocket,
        resp: http.client.HTTPResponse,
        headers: list[tuple[str, str]],
        sent: list[bool],
    ) -> None:
        reason = _printable(resp.reason or "", 100)
        lines = [f"HTTP/1.1 {resp.status} {reason}".rstrip()]
        lines += [f"{k}: {v}" for k, v in headers]
        lines.append("Connection: close")
        sent[0] = True
        client.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace"))

    def _tunnel(
        self, client: BoundedSocket, reader: _Reader, req: _Request, sent: list[bool]
    ) -> None:
        ctx = self._ctx
        found = _AUTHORITY.fullmatch(req.target)
        if found is None or not 0 < int(found[2]) < 65536:
            raise self._bad_request(_bad("CONNECT names host:port"), f"CONNECT {req.target}")
        origin = f"https://{req.target}/"
        decision = self._origin_decision(origin)
        ctx.record(decision)
        if not decision.allowed:
            raise _Answer(
                403,
                "Forbidden",
                f"http.CONNECT {origin} denied: {decision.reason} ({decision.rule})",
            )
        _scheme, host, port, _path = _split(origin)
        cap = _cap(ctx, decision) + TUNNEL_SLACK
        ip = resolve_checked(ctx, "http", host, port)
        self._not_self(ip, port, origin, "CONNECT")
        upstream = self._upstream(ip, port, host)
        try:
            sent[0] = True
            client.sendall(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            if reader.buf:
                upstream.sendall(bytes(reader.buf))
            self._splice(client, upstream, cap, origin, decision)
        finally:
            upstream.close()

    def _origin_decision(self, origin: str) -> Decision:
        """May a tunnel to ``origin`` open? Only when every method on all of it is allowed."""
        checker = self._ctx.checker
        first: Decision | None = None
        for method in sorted(_METHODS):
            if checker is None:
                answer = Decision(False, "http", method, origin, "default-deny", "no policy")
            else:
                answer = checker.check_url(origin, method)
            if not answer.allowed:
                reason = (
                    "a CONNECT tunnel carries any path and method unseen, so it needs every "
                    f"method on all of {origin}; {method}: {answer.reason}"
                )
                return Decision(False, "http", "CONNECT", origin, answer.rule, reason)
            first = first or answer
        assert first is not None
        return Decision(True, "http", "CONNECT", origin, first.rule, first.reason)

    def _splice(
        self,
        client: BoundedSocket,
        upstream: BoundedSocket,
        cap: int,
        origin: str,
        decision: Decision,
    ) -> None:
        """Bytes both ways until both ends close, the cap back, or the deadline."""
        poller = select.poll()
        peers = {client.fileno(): upstream, upstream.fileno(): client}
        for fd in peers:
            poller.register(fd, select.POLLIN)
        back = 0
        open_ends = 2
        left = self._until - time.monotonic()
        for wait in self._ctx.waits(f"egress tunnel to {origin}", left):
            for fd, _event in poller.poll(wait * 1000):
                source = client if fd == client.fileno() else upstream
                try:
                    data = source.recv(_CHUNK)
                except OSError as exc:
                    if exc.errno in (errno.ECONNRESET, errno.EPIPE):
                        return
                    raise
                if not data:
                    poller.unregister(fd)
                    with suppress(OSError):
                        peers[fd].shutdown(socket.SHUT_WR)
                    open_ends -= 1
                    if not open_ends:
                        return
                    continue
                if source is upstream:
                    back += len(data)
                    if back > cap:
                        reason = f"the tunnel brought back more than {cap} bytes"
                        self._ctx.record(
                            Decision(False, "http", "CONNECT", origin, decision.rule, reason)
                        )
                        return
                peers[fd].sendall(data)


@contextmanager
def route(
    ctx: CallContext, confinement: Confinement, env: Mapping[str, str], until: float
) -> Iterator[tuple[Confinement, dict[str, str]]]:
    """The command's walls and environment, through an egress proxy when the skill has
    ``http`` grants: the proxy's variables added, TCP connect to its port allowed.

    Without ``http`` grants (or with a checker that has no grants), both are as given
    and no proxy runs. The proxy stops when the block ends.

    Raises:
        HostCallError: ``unavailable`` when the proxy could not listen.
    """
    grants = getattr(ctx.checker, "grants", None)
    if grants is None or not grants("http"):
        yield confinement, dict(env)
        return
    # The runner kills the command at ``until``; the proxy's own end comes just after, as a
    # backstop, so that the command ends as the deadline's (a timeout), never because the
    # proxy cut its connection a moment before. The block's end stops the proxy anyway.
    with EgressProxy(ctx, until + _BACKSTOP_S) as proxy:
        walls = replace(confinement, tcp_connect=(*confinement.tcp_connect, proxy.port))
        yield walls, {**env, **proxy.env}
