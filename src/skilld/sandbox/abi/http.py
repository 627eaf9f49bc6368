"""``http``: outgoing requests to allowlisted URLs.

Each hop (the first request and every redirect) is checked as
``check_url(URL, METHOD)``; the host name is resolved once, the address is
checked (``check_address(ip, port, "http", host)``) and the connection goes to
that address, with the name kept for the Host header, SNI and certificate checks.
URLs with userinfo and schemes other than http and https are refused outright.
The body is capped by the deciding rule's ``max_response_bytes`` (host cap: 8 MiB);
credentials headers are dropped when a redirect leaves the origin.

One clock bounds the whole fetch, from the first lookup to the last body byte of
the last redirect: the smaller of the guest's ``timeout_ms`` and what is left of
the call's deadline. Every read and write waits in slices of it (see ``_net``), so
a peer that trickles its headers or body, or holds the connection open, costs no
more than that, and a cancelled call lets go within a slice.
"""

from __future__ import annotations

import http.client
import ssl
import time
from typing import Any
from urllib.parse import urljoin, urlsplit

from skilld.call import CallContext
from skilld.errors import ErrorCode, HostCallError
from skilld.sandbox.abi import Functions, decide, rule_settings, url_question
from skilld.sandbox.abi._net import BoundedSSLSocket, bound_socket, connect, resolve_checked
from skilld.types import Decision

MAX_REDIRECTS = 5
MAX_BODY = 8 * 1024 * 1024
DEFAULT_TIMEOUT_MS = 10_000
_METHODS = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}
_HOP_HEADERS = {
    "host",
    "connection",
    "transfer-encoding",
    "upgrade",
    "proxy-authorization",
    "content-length",
}
# Not forwarded to another origin when a redirect leaves it.
_CREDENTIAL_HEADERS = {"authorization", "cookie", "proxy-authorization"}


class _PinnedHTTP(http.client.HTTPConnection):
    """A connection to the checked address ``ip``, every wait bounded by the call."""

    def __init__(self, ctx: CallContext, host: str, port: int, ip: str, until: float):
        super().__init__(host, port)
        self._ctx, self._ip, self._until = ctx, ip, until

    def _raw(self) -> Any:
        return connect(self._ctx, self._ip, self.port, self._until - time.monotonic())

    def connect(self) -> None:
        self.sock = bound_socket(self._ctx, self._raw(), f"HTTP with {self.host}", self._until)


class _PinnedHTTPS(_PinnedHTTP):
    def connect(self) -> None:
        context = ssl.create_default_context()
        context.sslsocket_class = BoundedSSLSocket
        raw = self._raw()
        try:
            sock = context.wrap_socket(
                raw, server_hostname=self.host, do_handshake_on_connect=False
            )
        except BaseException:
            raw.close()
            raise
        assert isinstance(sock, BoundedSSLSocket)
        sock.bound(self._ctx, f"HTTPS with {self.host}", self._until)
        try:
            sock.handshake()
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def _split(url: str) -> tuple[str, str, int, str]:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise HostCallError("invalid-argument", f"malformed URL {url!r}: {exc}") from exc
    if parts.scheme not in ("http", "https"):
        raise HostCallError("invalid-argument", f"URL scheme must be http or https: {url!r}")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise HostCallError(
            ErrorCode.NOT_PERMITTED,
            f"URLs with userinfo are refused: {url!r}",
            rule="http.userinfo",
        )
    host = parts.hostname or ""
    if not host:
        raise HostCallError("invalid-argument", f"URL has no host: {url!r}")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.scheme, host, port or (443 if parts.scheme == "https" else 80), path


def _cap(ctx: CallContext, decision: Decision) -> int:
    cap = rule_settings(ctx, decision).get("max_response_bytes")
    return min(int(cap), MAX_BODY) if cap is not None else MAX_BODY


def fetch(ctx: CallContext, req: dict[str, Any]) -> dict[str, Any]:
    """Send one request, following checked redirects; the body is capped.

    Raises:
        HostCallError: ``not-permitted`` for a hop or address the tables refuse (or a
            scheme other than http and https), ``limit-exceeded`` for an oversized
            response or too many redirects, ``invalid-argument``, ``timeout``,
            ``unavailable``.
    """
    method = str(req["method"]).upper()
    if method not in _METHODS:
        raise HostCallError("invalid-argument", f"unsupported HTTP method {method!r}")
    url = str(req["url"])
    body: bytes | None = None if req.get("body") is None else bytes(req["body"])
    # One end for the whole fetch, redirects included (the call's deadline bounds it too).
    until = time.monotonic() + (req.get("timeout_ms") or DEFAULT_TIMEOUT_MS) / 1000
    headers = {k: v for k, v in req.get("headers") or [] if k.lower() not in _HOP_HEADERS}
    origin: tuple[str, str, int] | None = None
    for _hop in range(MAX_REDIRECTS + 1):
        # The tables judge the URL first: they refuse other schemes, userinfo and
        # malformed URLs with a rule id; _split is the host's own backstop.
        decision = decide(ctx, "http", method, url, question=url_question(url, method))
        scheme, host, port, path = _split(url)
        if origin is not None and origin != (scheme, host, port):
            headers = {k: v for k, v in headers.items() if k.lower() not in _CREDENTIAL_HEADERS}
        origin = (scheme, host, port)
        cap = _cap(ctx, decision)
        ip = resolve_checked(ctx, "http", host, port)
        cls = _PinnedHTTPS if scheme == "https" else _PinnedHTTP
        conn = cls(ctx, host, port, ip, until)
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read(cap + 1)
        except HostCallError:
            raise
        except TimeoutError as exc:
            raise HostCallError("timeout", f"{method} {url} timed out") from exc
        except ssl.SSLError as exc:
            raise HostCallError("unavailable", f"TLS with {host} failed: {exc.reason}") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise HostCallError("unavailable", f"{method} {url} failed: {exc}") from exc
        except ValueError as exc:  # http.client refuses CR/LF in header names and values
            raise HostCallError("invalid-argument", f"bad request header: {exc}") from exc
        finally:
            conn.close()
        location = resp.getheader("Location")
        if resp.status in (301, 302, 303, 307, 308) and location:
            url = urljoin(url, location)
            if resp.status == 303 or (resp.status in (301, 302) and method == "POST"):
                method, body = "GET", None
            continue
        if len(data) > cap:
            raise HostCallError(
                "limit-exceeded",
                f"response from {url} exceeds {cap} bytes ({decision.rule})",
                rule=decision.rule,
            )
        return {
            "status": resp.status,
            "headers": [(k, v) for k, v in resp.getheaders()],
            "body": data,
        }
    raise HostCallError("limit-exceeded", f"more than {MAX_REDIRECTS} redirects from {req['url']}")


FUNCTIONS: Functions = {"fetch": (fetch, "result-tagged")}
