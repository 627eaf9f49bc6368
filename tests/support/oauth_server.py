"""A small OAuth 2.1 authorization server for the tests, run as a process of its own.

``python -m support.oauth_server`` (from ``tests/``) listens on a free port of 127.0.0.1
and prints its issuer URL on stdout's first line. It serves what a resource server and
the MCP SDK's client use:

- ``/.well-known/oauth-authorization-server`` (RFC 8414) and
  ``/.well-known/openid-configuration``: its metadata;
- ``/jwks``: its public keys (RFC 7517);
- ``/token``: the ``client_credentials`` grant for the clients ``alice`` and ``mallory``
  (secret: the name with ``-secret``; ``client_secret_basic`` or ``_post``), a JWT access
  token (RFC 9068, RS256, signed with joserfc) whose ``aud`` is the ``resource`` the
  client asked for (RFC 8707) and whose ``scope`` is what it asked for;
- ``/introspect`` (RFC 7662): the tokens it issued, for the resource server's client
  ``skilld`` (secret ``skilld-secret``); opaque tokens too (``/token`` with
  ``token_format=opaque``).

And, for the tests only, ``/test/rotate`` (a new signing key; the old one is dropped)
and ``/test/mint`` (a token with the claims, header and signature the test asks for,
including hostile ones: ``alg: none``, HS256 keyed with the public key, an unknown
``kid``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from joserfc import jwt
from joserfc.jwk import RSAKey

CLIENTS = {"alice": "alice-secret", "mallory": "mallory-secret", "skilld": "skilld-secret"}
TOKEN_TTL_S = 300


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class Authority:
    """The server's state: its signing key and the tokens it issued."""

    def __init__(self, issuer: str):
        self.issuer = issuer
        self.lock = threading.Lock()
        self.key = self._new_key()
        self.opaque: dict[str, dict[str, Any]] = {}
        self.jwks_fetches = 0
        # Introspection: how many questions, how many at once at most, and how long
        # each answer takes (set by /test/introspect-delay: a slow issuer).
        self.introspections = 0
        self.introspecting = 0
        self.introspecting_most = 0
        self.introspect_delay_s = 0.0

    @staticmethod
    def _new_key() -> RSAKey:
        kid = secrets.token_hex(8)
        return RSAKey.generate_key(2048, parameters={"kid": kid, "use": "sig", "alg": "RS256"})

    def rotate(self) -> str:
        with self.lock:
            self.key = self._new_key()
            return str(self.key.kid)

    def metadata(self) -> dict[str, Any]:
        return {
            "issuer": self.issuer,
            "authorization_endpoint": f"{self.issuer}/authorize",
            "token_endpoint": f"{self.issuer}/token",
            "jwks_uri": f"{self.issuer}/jwks",
            "introspection_endpoint": f"{self.issuer}/introspect",
            "grant_types_supported": ["client_credentials"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
            "response_types_supported": ["code"],
            "code_challenge_methods_supported": ["S256"],
        }

    def claims(
        self, subject: str, audience: Any, scope: str, ttl: int = TOKEN_TTL_S
    ) -> dict[str, Any]:
        now = int(time.time())
        return {
            "iss": self.issuer,
            "sub": subject,
            "aud": audience,
            "client_id": subject,
            "scope": scope,
            "groups": [f"{subject}-team"],
            "iat": now,
            "nbf": now,
            "exp": now + ttl,
            "jti": secrets.token_hex(8),
        }

    def sign(self, claims: dict[str, Any], header: dict[str, Any] | None = None) -> str:
        with self.lock:
            key = self.key
        head = {"alg": "RS256", "kid": key.kid, "typ": "at+jwt", **(header or {})}
        return jwt.encode(head, claims, key)

    def mint(self, spec: dict[str, Any]) -> str:
        """A token as ``spec`` says: ``claims`` (merged over a valid token's), ``header``
        overrides, and ``forge``: ``none`` (unsigned), ``hs256-public`` (HMAC keyed with
        the public key's PEM), ``unknown-kid`` (signed with a key nobody publishes)."""
        claims = self.claims(spec.get("sub", "alice"), spec["aud"], spec.get("scope", ""))
        claims.update(spec.get("claims", {}))
        forge = spec.get("forge")
        if forge in ("none", "hs256-public"):
            alg = "none" if forge == "none" else "HS256"
            with self.lock:
                kid, pem = self.key.kid, self.key.as_pem(private=False)
            head = _b64(json.dumps({"alg": alg, "kid": kid, "typ": "JWT"}).encode())
            body = _b64(json.dumps(claims).encode())
            signing_input = f"{head}.{body}".encode()
            sig = b"" if forge == "none" else hmac.new(pem, signing_input, hashlib.sha256).digest()
            return f"{head}.{body}.{_b64(sig)}"
        if forge == "unknown-kid":
            stranger = self._new_key()
            return jwt.encode({"alg": "RS256", "kid": stranger.kid}, claims, stranger)
        return self.sign(claims, spec.get("header"))


class Handler(BaseHTTPRequestHandler):
    authority: Authority

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        """Quiet: the tests read stdout for the URL only."""

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _form(self) -> dict[str, str]:
        length = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(length).decode()
        if self.headers.get("Content-Type", "").startswith("application/json"):
            return json.loads(raw or "{}")  # type: ignore[no-any-return]
        return {k: v[0] for k, v in parse_qs(raw).items()}

    def _client(self, form: dict[str, str]) -> str | None:
        auth = self.headers.get("Authorization", "")
        if auth.lower().startswith("basic "):
            name, _, secret = base64.b64decode(auth[6:]).decode().partition(":")
        else:
            name, secret = form.get("client_id", ""), form.get("client_secret", "")
        known = CLIENTS.get(name)
        return name if known is not None and hmac.compare_digest(known, secret) else None

    def do_GET(self) -> None:
        a = self.authority
        if self.path in (
            "/.well-known/oauth-authorization-server",
            "/.well-known/openid-configuration",
        ):
            self._send(200, a.metadata())
        elif self.path == "/jwks":
            with a.lock:
                a.jwks_fetches += 1
                keys = [a.key.as_dict(private=False)]
            self._send(200, {"keys": keys})
        elif self.path == "/test/stats":
            self._send(
                200,
                {
                    "jwks_fetches": a.jwks_fetches,
                    "introspections": a.introspections,
                    "introspecting_most": a.introspecting_most,
                },
            )
        else:
            self._send(404, {"error": "not_found"})

    def do_POST(self) -> None:
        a = self.authority
        form = self._form()
        if self.path == "/token":
            client = self._client(form)
            if client is None:
                self._send(401, {"error": "invalid_client"}, {"WWW-Authenticate": "Basic"})
                return
            if form.get("grant_type") != "client_credentials":
                self._send(400, {"error": "unsupported_grant_type"})
                return
            resource = form.get("resource")
            if not resource:
                self._send(400, {"error": "invalid_target"})
                return
            claims = a.claims(client, resource, form.get("scope", ""))
            if form.get("token_format") == "opaque":
                token = secrets.token_urlsafe(32)
                with a.lock:
                    a.opaque[token] = claims
            else:
                token = a.sign(claims)
            self._send(
                200,
                {
                    "access_token": token,
                    "token_type": "Bearer",
                    "expires_in": TOKEN_TTL_S,
                    "scope": claims["scope"],
                },
            )
        elif self.path == "/introspect":
            if self._client(form) != "skilld":
                self._send(401, {"error": "invalid_client"})
                return
            with a.lock:
                claims = a.opaque.get(form.get("token", ""))
                a.introspections += 1
                a.introspecting += 1
                a.introspecting_most = max(a.introspecting_most, a.introspecting)
                delay = a.introspect_delay_s
            time.sleep(delay)  # a slow issuer (the test asked for it)
            with a.lock:
                a.introspecting -= 1
            if claims is None or claims["exp"] < time.time():
                self._send(200, {"active": False})
            else:
                self._send(200, {"active": True, "token_type": "Bearer", **claims})
        elif self.path == "/test/introspect-delay":
            with a.lock:
                a.introspect_delay_s = float(form["seconds"])
            self._send(200, {})
        elif self.path == "/test/rotate":
            self._send(200, {"kid": a.rotate()})
        elif self.path == "/test/mint":
            self._send(200, {"token": a.mint(form)})  # type: ignore[arg-type]
        elif self.path == "/test/opaque":
            token = secrets.token_urlsafe(32)
            claims = a.claims(form.get("sub", "alice"), form["aud"], form.get("scope", ""))
            with a.lock:
                a.opaque[token] = claims
            self._send(200, {"token": token})
        else:
            self._send(404, {"error": "not_found"})


def main() -> None:
    """Serve until stdin closes (the test that started it went away) or the process ends."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    issuer = f"http://127.0.0.1:{server.server_address[1]}"
    Handler.authority = Authority(issuer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(issuer, flush=True)
    sys.stdin.read()
    server.shutdown()


if __name__ == "__main__":
    main()
