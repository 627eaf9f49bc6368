"""Who calls over HTTP: bearer credentials verified into a :class:`~skilld.types.Caller`.

skilld is an OAuth 2.1 resource server (the MCP authorization specification) and keeps
the operator's named tokens as a second source of principals. Every verifier here is
the SDK's ``TokenVerifier`` (one method, ``verify_token``); the SDK's
``BearerAuthBackend`` calls it, and the access grant it returns is a
:class:`CallerToken`, which carries the typed caller. :func:`caller_of` is the one
place that turns a request into a caller; nothing downstream reads a header.

- :class:`JwtVerifier`: JWT access tokens (RFC 9068) of one issuer for one audience,
  verified with PyJWT. Only asymmetric algorithms (``ALGORITHMS``), so ``alg: none`` and
  an HMAC "signed" with a public key never verify; the key must be of the family the
  header's algorithm names; ``iss``, ``aud`` (RFC 8707: this resource), ``exp``, ``nbf``
  with a small leeway; ``sub`` required.
- :class:`JwksKeys`: the issuer's keys, discovered from its metadata (RFC 8414, then
  OpenID Connect discovery) or read from a file (air-gapped). Held in memory; fetched
  again only for a ``kid`` it does not know (rotation), at most once per
  ``refresh_interval_s``, or when older than ``max_age_s`` — never per request.
- :class:`IntrospectionVerifier`: opaque tokens, asked of the issuer's RFC 7662
  endpoint with the resource server's own client credentials; answers cached briefly.
- :class:`NamedTokens`: the operator's token file, ``NAME TOKEN [SCOPE...]`` per line,
  each token at least ``MIN_TOKEN_CHARS`` long, the file private (no group or other
  access); :meth:`NamedTokens.reload` re-reads it (SIGHUP), so a removed token stops
  working at once. Compared as sha256 digests in constant time.
- :class:`Credentials`: the verifiers in turn — a named token, else a JWT, else
  introspection.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import os
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx2
import jwt
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from pydantic import ConfigDict
from starlette.requests import HTTPConnection

from skilld import paths
from skilld.errors import UsageError
from skilld.mcp._config import ServeConfig
from skilld.types import Caller

# Asymmetric signatures only: with a symmetric algorithm anyone holding the key (for
# HS256 "signed with the public key", anyone at all) could mint tokens.
ALGORITHMS = (
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA",
)  # fmt: skip
# The JWK key type (and EC curve) each algorithm needs: a key is never used for
# another family than its own (key confusion).
_KEY_TYPE = {"RS": "RSA", "PS": "RSA", "ES": "EC", "Ed": "OKP"}
_EC_CURVE = {"ES256": "P-256", "ES384": "P-384", "ES512": "P-521"}
MIN_TOKEN_CHARS = 32
# The scope (OAuth) or token scope (named tokens) that lets a caller read /metrics.
METRICS_SCOPE = "skilld:metrics"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_SCOPE = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]{1,128}")  # RFC 6749 scope-token
_MAX_DOCUMENT_BYTES = 1 << 20


class Logger(Protocol):
    """What the verifiers log through (the server's structlog logger)."""

    def info(self, event: str, **fields: Any) -> Any: ...

    def warning(self, event: str, **fields: Any) -> Any: ...


class CallerToken(AccessToken):
    """The SDK's access grant, carrying the caller it was verified as."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    caller: Caller


def caller_of(request: object) -> Caller:
    """Who makes ``request``: the one function that turns a request into a caller.

    ``request`` is what the SDK hands a handler as ``ctx.request``: a Starlette request
    over HTTP, ``None`` (or anything else) over stdio. The contract, for every adapter
    that builds a call from a request:

    - Not an HTTP request (the stdio transport) is :meth:`Caller.local` ``"stdio"``.
    - A request the server authenticated (the SDK's ``AuthenticatedUser`` in its scope) is
      the caller its credential was verified as: :meth:`Caller.oauth` (issuer, subject,
      scopes, groups) or :meth:`Caller.token` (the token's name and scopes). It depends
      on the credential alone, never on how the request spelled it (``Bearer``,
      ``bearer``, extra headers), so ``caller.key`` is safe to key shares and ownership on.
    - Any other request is :meth:`Caller.anonymous`: the server authenticates no one
      (a loopback bind, or ``--allow-unauthenticated``). With authentication on, an
      unauthenticated request never gets this far (the front door answers 401).
    """
    if not isinstance(request, HTTPConnection):
        return Caller.local("stdio")
    user = request.scope.get("user")
    if isinstance(user, AuthenticatedUser) and isinstance(user.access_token, CallerToken):
        return user.access_token.caller
    return Caller.anonymous()


def has_scope(caller: Caller, scope: str) -> bool:
    """Whether ``caller``'s principal holds ``scope`` (an OAuth scope or a named token's)."""
    return scope in caller.principal.scopes


# -- named tokens ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NamedToken:
    """One of the operator's bearer tokens: its name, the digest of its text, its scopes."""

    name: str
    digest: bytes
    scopes: frozenset[str]


def parse_token_file(path: Path) -> tuple[NamedToken, ...]:
    """The named tokens of ``path``: ``NAME TOKEN [SCOPE...]`` per line, ``#`` comments.

    Raises:
        UsageError: the file is not private, unreadable, holds no token, or a line is
            malformed (the file and line named): a bare token without a name (the format
            before named tokens), a bad name or scope, a token shorter than
            ``MIN_TOKEN_CHARS``, a name or token given twice.
    """
    raw = paths.read_private(path, "token file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError("the token file is not UTF-8 text", location=str(path)) from exc
    tokens: list[NamedToken] = []
    names: set[str] = set()
    digests: set[bytes] = set()
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        where = f"{path}:{number}"
        if len(fields) == 1:
            raise UsageError(
                "a token without a name (the old one-token-per-line format)",
                location=where,
                hint="name each token: write 'NAME TOKEN' (e.g. 'alice <token>'); "
                "the name is who the audit log and policies say called",
            )
        name, token, scopes = fields[0], fields[1], fields[2:]
        if not _NAME.fullmatch(name):
            raise UsageError(
                f"bad token name {name!r}",
                location=where,
                hint="letters, digits, '.', '_', '-'; at most 64, starting with a letter or digit",
            )
        if len(token) < MIN_TOKEN_CHARS:
            raise UsageError(
                f"token {name!r} is {len(token)} characters; at least {MIN_TOKEN_CHARS} are needed",
                location=where,
                hint="make one with: python3 -c 'import secrets; print(secrets.token_urlsafe(32))'",
            )
        bad = [s for s in scopes if not _SCOPE.fullmatch(s)]
        if bad:
            raise UsageError(f"bad scope {bad[0]!r} for token {name!r}", location=where)
        digest = _sha256(token)
        if name in names or digest in digests:
            raise UsageError(f"token name or token {name!r} given twice", location=where)
        names.add(name)
        digests.add(digest)
        tokens.append(NamedToken(name, digest, frozenset(scopes)))
    if not tokens:
        raise UsageError(
            "the token file holds no token", location=str(path), hint="write 'NAME TOKEN' lines"
        )
    return tuple(tokens)


def create_token_file(path: Path, name: str = "admin") -> str | None:
    """Write a fresh token named ``name`` (with the metrics scope) to ``path`` if it does
    not exist yet, mode 0600; the token's text when it was made, else None.

    The first start of an appliance gets a credential without the operator writing one;
    the token is shown once, by the caller of this function.

    Raises:
        UsageError: the file cannot be created.
    """
    token = secrets.token_urlsafe(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return None
    except OSError as exc:
        raise UsageError(
            f"cannot create the token file: {exc.strerror}", location=str(path)
        ) from exc
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(
            "# skilld named tokens: NAME TOKEN [SCOPE...] per line (made at first start)\n"
            f"{name} {token} {METRICS_SCOPE}\n"
        )
    return token


class NamedTokens:
    """The operator's named tokens (a file and/or an environment variable), reloadable.

    A token from ``env`` (the variable's value) is named after the variable.
    """

    def __init__(self, file: Path | None, env: str | None):
        self._file = file
        self._env = env
        self._tokens: tuple[NamedToken, ...] = ()

    def load(self) -> int:
        """Read the tokens; how many there are.

        Raises:
            UsageError: see :func:`parse_token_file`; or the variable is unset, empty
                or shorter than ``MIN_TOKEN_CHARS``.
        """
        tokens = parse_token_file(self._file) if self._file is not None else ()
        if self._env is not None:
            value = os.environ.get(self._env, "").strip()
            if len(value) < MIN_TOKEN_CHARS:
                raise UsageError(
                    f"environment variable {self._env} is unset or shorter than "
                    f"{MIN_TOKEN_CHARS} characters",
                    hint="set it to the bearer token clients must send",
                )
            digest = _sha256(value)
            for named in tokens:
                if named.name == self._env or named.digest == digest:
                    # Two credentials must never be one principal, nor one token two.
                    raise UsageError(
                        f"the token of {self._env} and the token file's {named.name!r} "
                        "share a name or a token",
                        location=str(self._file),
                        hint=f"rename or remove that line, or give {self._env} its own token",
                    )
            tokens += (NamedToken(self._env, digest, frozenset()),)
        self._tokens = tokens
        return len(tokens)

    def reload(self, log: Logger) -> None:
        """Read the tokens again (SIGHUP); on an error keep the ones in force and log it."""
        try:
            count = self.load()
        except UsageError as exc:
            log.warning("tokens_not_reloaded", error=str(exc), kept=len(self._tokens))
        else:
            log.info("tokens_reloaded", tokens=count)

    async def verify_token(self, token: str) -> CallerToken | None:
        """The grant of the named token ``token`` is, or None."""
        # Digests, not the texts: compare_digest takes time by the length of its
        # inputs, which would tell a client how long the configured tokens are.
        presented = _sha256(token)
        found: NamedToken | None = None
        for known in self._tokens:
            # No early exit: every configured token is compared, whatever matches.
            if hmac.compare_digest(presented, known.digest):
                found = known
        if found is None:
            return None
        caller = Caller.token(found.name, found.scopes)
        return CallerToken(
            token=token, client_id=caller.key, scopes=sorted(found.scopes), caller=caller
        )


def _sha256(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


# -- JWT access tokens ----------------------------------------------------------------


async def _get_json(client: httpx2.AsyncClient, url: str) -> dict[str, Any]:
    """A JSON object from ``url`` (at most 1 MiB).

    Raises:
        ValueError: the request failed, or its answer is not a JSON object.
    """
    try:
        response = await client.get(url, headers={"Accept": "application/json"})
    except httpx2.HTTPError as exc:
        raise ValueError(f"{url}: {exc}") from exc
    if response.status_code != 200:
        raise ValueError(f"{url}: HTTP {response.status_code}")
    if len(response.content) > _MAX_DOCUMENT_BYTES:
        raise ValueError(f"{url}: larger than 1 MiB")
    try:
        body = json.loads(response.content)
    except ValueError as exc:
        raise ValueError(f"{url}: not JSON") from exc
    if not isinstance(body, dict):
        raise ValueError(f"{url}: not a JSON object")  # noqa: TRY004 - one error for "unusable"
    return body


def metadata_urls(issuer: str) -> list[str]:
    """Where an issuer's metadata may be: RFC 8414's well-known URI (inserted before the
    issuer's path), then OpenID Connect discovery's (appended, and inserted)."""
    parts = urlsplit(issuer)
    base = f"{parts.scheme}://{parts.netloc}"
    path = parts.path.rstrip("/")
    return [
        f"{base}/.well-known/oauth-authorization-server{path}",
        f"{base}{path}/.well-known/openid-configuration",
        f"{base}/.well-known/openid-configuration{path}",
    ]


async def discover(client: httpx2.AsyncClient, issuer: str) -> dict[str, Any]:
    """The authorization server metadata of ``issuer`` (its ``issuer`` must match exactly).

    Raises:
        ValueError: no metadata found, or it names another issuer.
    """
    errors: list[str] = []
    for url in metadata_urls(issuer):
        try:
            metadata = await _get_json(client, url)
        except ValueError as exc:
            errors.append(str(exc))
            continue
        if metadata.get("issuer") != issuer:
            raise ValueError(f"{url} names issuer {metadata.get('issuer')!r}, not {issuer!r}")
        return metadata
    raise ValueError("no authorization server metadata: " + "; ".join(errors))


@dataclass(frozen=True, slots=True)
class SigningKey:
    """A public key of the issuer and the one algorithm its JWK pins (``alg``), if any."""

    jwk: jwt.PyJWK
    alg: str | None


def _jwks_uri_of(metadata: Mapping[str, Any], issuer: str) -> str:
    uri = metadata.get("jwks_uri")
    if not isinstance(uri, str):
        raise ValueError(f"the metadata of {issuer} has no jwks_uri")  # noqa: TRY004
    return uri


def keys_from_jwks(document: Mapping[str, Any]) -> dict[str, SigningKey]:
    """The usable signing keys of a JWK set, by ``kid`` ("" for a key without one).

    Symmetric (``oct``) keys, encryption keys and keys PyJWT cannot read are left out:
    a resource server verifies signatures with public keys only.
    """
    keys: dict[str, SigningKey] = {}
    entries = document.get("keys")
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or entry.get("kty") not in ("RSA", "EC", "OKP"):
            continue
        if entry.get("use", "sig") != "sig":
            continue
        try:
            key = jwt.PyJWK(entry)
        except (jwt.PyJWKError, jwt.InvalidKeyError, ValueError, TypeError):
            continue
        alg = entry.get("alg")
        keys[str(entry.get("kid", ""))] = SigningKey(key, alg if isinstance(alg, str) else None)
    return keys


class JwksKeys:
    """One issuer's signing keys: fixed (a file), or fetched from its ``jwks_uri``.

    Fetched at most once per ``refresh_interval_s`` for a ``kid`` not seen before (key
    rotation), and again when older than ``max_age_s`` (a key the issuer removed stops
    verifying); concurrent misses share one fetch. Nothing is fetched for a known key.
    """

    def __init__(
        self,
        *,
        issuer: str | None = None,
        jwks_uri: str | None = None,
        fixed: Mapping[str, Any] | None = None,
        refresh_interval_s: float = 30.0,
        max_age_s: float = 3600.0,
        timeout_s: float = 5.0,
        log: Logger | None = None,
    ):
        self._issuer = issuer
        self._jwks_uri = jwks_uri
        self._fixed = fixed is not None
        self._keys: dict[str, SigningKey] = keys_from_jwks(fixed) if fixed is not None else {}
        self._refresh_interval_s = refresh_interval_s
        self._max_age_s = max_age_s
        self._timeout_s = timeout_s
        self._log = log
        self._fetched = -float("inf")  # monotonic time of the last fetch (tried)
        self._loaded = -float("inf")  # ... of the last successful one
        self._lock = asyncio.Lock()
        self.fetches = 0

    @classmethod
    def from_file(cls, path: Path) -> JwksKeys:
        """Keys baked in for an air-gapped site: a JWK set (``{"keys": [...]}``) in ``path``.

        Raises:
            UsageError: the file cannot be read, is not a JWK set, or has no signing key.
        """
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read the JWK set: {exc}", location=str(path)) from exc
        if not isinstance(document, dict) or not keys_from_jwks(document):
            raise UsageError(
                "holds no usable signing key",
                location=str(path),
                hint='a JWK set: {"keys": [{"kty": "RSA", "kid": ..., "n": ..., "e": ...}]}',
            )
        return cls(fixed=document)

    async def get(self, kid: str | None) -> list[SigningKey]:
        """The keys a token whose header names ``kid`` may be verified with.

        With a ``kid``, the key of that id (fetched again when unknown, rate-limited);
        without one, every key (the algorithm's family narrows them down later).
        """
        if not self._fixed:
            now = time.monotonic()
            stale = now - self._loaded > self._max_age_s
            unknown = kid is not None and kid not in self._keys
            if (stale or unknown) and now - self._fetched >= self._refresh_interval_s:
                await self.refresh()
        if kid is None:
            return list(self._keys.values())
        key = self._keys.get(kid)
        return [] if key is None else [key]

    async def refresh(self) -> None:
        """Fetch the key set again (discovering ``jwks_uri`` first if need be); on a
        failure keep the keys held and log it."""
        started = self._fetched
        async with self._lock:
            if self._fetched != started:
                return  # another request fetched while this one waited
            self._fetched = time.monotonic()
            self.fetches += 1
            try:
                async with httpx2.AsyncClient(timeout=self._timeout_s) as client:
                    if self._jwks_uri is None:
                        assert self._issuer is not None
                        metadata = await discover(client, self._issuer)
                        self._jwks_uri = _jwks_uri_of(metadata, self._issuer)
                    keys = keys_from_jwks(await _get_json(client, self._jwks_uri))
            except ValueError as exc:
                if self._log is not None:
                    self._log.warning("auth_keys_unavailable", error=str(exc), kept=len(self._keys))
                return
            self._keys = keys
            self._loaded = time.monotonic()


def _key_fits(key: SigningKey, alg: str) -> bool:
    """Whether ``key`` may verify a signature made with ``alg`` (no key confusion)."""
    if key.alg is not None and key.alg != alg:
        return False
    if key.jwk.key_type != _KEY_TYPE[alg[:2]]:
        return False
    if alg in _EC_CURVE:
        curve = getattr(key.jwk.key, "curve", None)
        expected = {"P-256": "secp256r1", "P-384": "secp384r1", "P-521": "secp521r1"}
        return getattr(curve, "name", None) == expected[_EC_CURVE[alg]]
    return True


class JwtVerifier:
    """JWT access tokens of ``issuer`` for ``audience`` (see the module docstring).

    A client presents one access token on every request for as long as it lives, and a
    signature check costs about 0.1 ms (RS256 or ES256, on a loaded 2-vCPU machine): a
    token that verified is remembered for ``cache_s`` (never past its ``exp``), up to
    ``cache_size`` tokens, so a repeat costs a dictionary look-up. Refusals are not
    remembered (and logged at most once a second). A key the issuer withdraws is dropped
    within ``JwksKeys.max_age_s``; tokens it signed stay accepted ``cache_s`` more at most.
    """

    def __init__(
        self,
        issuer: str,
        audience: str,
        keys: JwksKeys,
        *,
        leeway_s: float = 30.0,
        algorithms: Sequence[str] = ALGORITHMS,
        cache_s: float = 60.0,
        cache_size: int = 4096,
        log: Logger | None = None,
    ):
        unknown = set(algorithms) - set(ALGORITHMS)
        if unknown:
            raise UsageError(f"algorithms {sorted(unknown)} are not asymmetric signatures")
        self.issuer = issuer
        self.audience = audience
        self.keys = keys
        self._leeway_s = leeway_s
        self._algorithms = tuple(algorithms)
        self._cache_s = cache_s
        self._cache_size = cache_size
        self._verified: OrderedDict[str, tuple[float, CallerToken]] = OrderedDict()
        self._log = log
        self._logged = -float("inf")
        self._unlogged = 0

    async def verify_token(self, token: str) -> CallerToken | None:
        """The grant ``token`` carries, or None when it does not verify (why is logged)."""
        held = self._verified.get(token)
        if held is not None:
            if held[0] > time.time():
                return held[1]
            del self._verified[token]
        grant = await self._verify(token)
        if grant is not None and self._cache_s > 0:
            until = time.time() + self._cache_s
            if grant.expires_at is not None:
                until = min(until, grant.expires_at)
            self._verified[token] = (until, grant)
            while len(self._verified) > self._cache_size:
                self._verified.popitem(last=False)
        return grant

    async def _verify(self, token: str) -> CallerToken | None:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            return self._refused("malformed")
        alg = header.get("alg")
        if alg not in self._algorithms:
            return self._refused(f"algorithm {alg!r} not allowed")
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            return self._refused("malformed kid")
        candidates = [k for k in await self.keys.get(kid) if _key_fits(k, alg)]
        if not candidates:
            return self._refused(f"no key for kid {kid!r} and {alg}")
        claims: dict[str, Any] | None = None
        for key in candidates:
            try:
                claims = jwt.decode(
                    token,
                    key.jwk.key,
                    algorithms=[alg],
                    audience=self.audience,
                    issuer=self.issuer,
                    leeway=self._leeway_s,
                    options={"require": ["exp", "iss", "aud", "sub"]},
                )
                break
            except jwt.InvalidSignatureError:
                continue
            except jwt.InvalidTokenError as exc:
                return self._refused(type(exc).__name__)
        if claims is None:
            return self._refused("bad signature")
        return grant_of(token, claims, self.issuer, self.audience)

    def _refused(self, reason: str) -> CallerToken | None:
        # At most one line a second: anyone can send bad tokens, and the log is no place
        # for them to fill. The count says how many went unlogged.
        self._unlogged += 1
        now = time.monotonic()
        if self._log is not None and now - self._logged >= 1.0:
            self._log.info("token_refused", kind="jwt", reason=reason, refused=self._unlogged)
            self._logged, self._unlogged = now, 0
        return None


def _strings(value: object) -> frozenset[str]:
    if isinstance(value, str):
        return frozenset(value.split())
    if isinstance(value, list):
        return frozenset(v for v in value if isinstance(v, str))
    return frozenset()


def grant_of(token: str, claims: Mapping[str, Any], issuer: str, audience: str) -> CallerToken:
    """The grant of verified ``claims``: scopes from ``scope`` (or ``scp``), groups from
    ``groups``; the client is ``client_id`` (RFC 9068), else ``azp``, else the subject."""
    subject = str(claims["sub"])
    scopes = _strings(claims.get("scope", claims.get("scp")))
    caller = Caller.oauth(issuer, subject, scopes, _strings(claims.get("groups")))
    client = claims.get("client_id", claims.get("azp", subject))
    exp = claims.get("exp")
    return CallerToken(
        token=token,
        client_id=str(client),
        scopes=sorted(scopes),
        expires_at=int(exp) if isinstance(exp, int | float) else None,
        resource=audience,
        subject=subject,
        claims={"iss": issuer},
        caller=caller,
    )


# -- introspection (RFC 7662) ---------------------------------------------------------


def read_client_file(path: Path) -> tuple[str, str]:
    """The resource server's own client credentials: ``CLIENT_ID SECRET`` on one line.

    Raises:
        UsageError: the file is not private or not one line of two fields.
    """
    raw = paths.read_private(path, "client credentials file")
    try:
        fields = raw.decode("utf-8").split()
    except UnicodeDecodeError as exc:
        raise UsageError("the client credentials file is not UTF-8", location=str(path)) from exc
    if len(fields) != 2:
        raise UsageError("expected 'CLIENT_ID SECRET'", location=str(path))
    return fields[0], fields[1]


class IntrospectionVerifier:
    """Opaque access tokens, asked of ``endpoint`` (RFC 7662).

    Accepted only when ``active``, issued by ``issuer`` (when the answer names one) for
    ``audience`` (``aud`` must name it: a token for another resource is refused), with a
    subject. Answers are kept for at most ``cache_s`` (and never past ``exp``), up to
    ``cache_size`` tokens, by the digest of the token.

    Anyone can send a made-up token, and each unknown one costs a request to the issuer,
    so that cost is bounded: refusals are kept apart from grants (a flood of made-up
    tokens never pushes a caller's grant out), one question per token is in flight at a
    time (the same token sent twice waits for the first answer), and at most
    ``max_in_flight`` questions at once; a token that finds them all busy for
    ``timeout_s`` is refused for now (401; the client may retry), never queued without end.
    """

    def __init__(
        self,
        endpoint: str,
        client: tuple[str, str],
        issuer: str,
        audience: str,
        *,
        timeout_s: float = 5.0,
        cache_s: float = 30.0,
        cache_size: int = 10_000,
        max_in_flight: int = 8,
        log: Logger | None = None,
    ):
        self._endpoint = endpoint
        self._client = client
        self._issuer = issuer
        self._audience = audience
        self._timeout_s = timeout_s
        self._cache_s = cache_s
        self._cache_size = cache_size
        self._granted: OrderedDict[bytes, tuple[float, CallerToken]] = OrderedDict()
        self._refused: OrderedDict[bytes, float] = OrderedDict()
        self._asking: dict[bytes, asyncio.Task[CallerToken | None]] = {}
        self._max_in_flight = max(1, max_in_flight)
        self._slots: asyncio.Semaphore | None = None  # made on the serving loop
        self._busy_logged = 0.0
        self._log = log

    async def verify_token(self, token: str) -> CallerToken | None:
        """The grant the issuer says ``token`` carries, or None."""
        digest = _sha256(token)
        now = time.time()
        held = self._granted.get(digest)
        if held is not None and held[0] > now:
            return held[1]
        refused_until = self._refused.get(digest)
        if refused_until is not None and refused_until > now:
            return None
        asking = self._asking.get(digest)
        if asking is None:
            # Its own task: one client going away never cancels another's answer.
            asking = asyncio.get_running_loop().create_task(self._bounded_ask(token, digest))
            self._asking[digest] = asking
            asking.add_done_callback(lambda _: self._asking.pop(digest, None))
        return await asyncio.shield(asking)

    async def _bounded_ask(self, token: str, digest: bytes) -> CallerToken | None:
        """Ask the issuer, at most ``max_in_flight`` at once; None when none is free in
        time (not remembered: the token is only refused for now)."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._max_in_flight)
        try:
            await asyncio.wait_for(self._slots.acquire(), self._timeout_s)
        except TimeoutError:
            now = time.monotonic()
            if self._log is not None and now - self._busy_logged > 10:
                self._busy_logged = now  # once per 10 s: a flood must not flood the log
                self._log.warning("introspection_busy", in_flight=self._max_in_flight)
            return None
        try:
            grant = await self._ask(token)
        finally:
            self._slots.release()
        self._remember(digest, grant)
        return grant

    def _remember(self, digest: bytes, grant: CallerToken | None) -> None:
        until = time.time() + self._cache_s
        if grant is None:
            self._refused[digest] = until
            self._refused.move_to_end(digest)
            while len(self._refused) > self._cache_size:
                self._refused.popitem(last=False)
            return
        if grant.expires_at is not None:
            until = min(until, grant.expires_at)
        self._granted[digest] = (until, grant)
        self._granted.move_to_end(digest)
        while len(self._granted) > self._cache_size:
            self._granted.popitem(last=False)

    async def _ask(self, token: str) -> CallerToken | None:
        try:
            async with httpx2.AsyncClient(timeout=self._timeout_s) as client:
                response = await client.post(
                    self._endpoint,
                    data={"token": token, "token_type_hint": "access_token"},
                    auth=httpx2.BasicAuth(*self._client),
                )
            body = response.json()
        except (httpx2.HTTPError, ValueError) as exc:
            if self._log is not None:
                self._log.warning("introspection_failed", error=str(exc))
            return None
        if (
            response.status_code != 200
            or not isinstance(body, dict)
            or body.get("active") is not True
        ):
            return None
        issuer = body.get("iss", self._issuer)
        audiences = _strings(body.get("aud"))
        exp = body.get("exp")
        if (
            issuer != self._issuer
            or self._audience not in audiences
            or not isinstance(body.get("sub"), str)
            or (isinstance(exp, int | float) and exp < time.time())
        ):
            if self._log is not None:
                self._log.info("token_refused", kind="introspection", reason="iss, aud or sub")
            return None
        return grant_of(token, body, self._issuer, self._audience)


# -- all of them ----------------------------------------------------------------------


class Credentials:
    """The verifiers in turn: a named token, else a JWT (three dot-separated parts) or an
    opaque token (introspection), whichever is configured."""

    def __init__(
        self,
        named: NamedTokens | None = None,
        jwt_verifier: JwtVerifier | None = None,
        introspection: IntrospectionVerifier | None = None,
    ):
        self.named = named
        self.jwt = jwt_verifier
        self.introspection = introspection

    def __bool__(self) -> bool:
        return any(v is not None for v in (self.named, self.jwt, self.introspection))

    def describe(self) -> str:
        """Which authentication is on, for the start log (``none`` when nothing is)."""
        parts = []
        if self.jwt is not None:
            parts.append(f"oauth-jwt(issuer={self.jwt.issuer}, audience={self.jwt.audience})")
        if self.introspection is not None:
            parts.append("oauth-introspection")
        if self.named is not None:
            parts.append("named-tokens")
        return ", ".join(parts) or "none"

    async def verify_token(self, token: str) -> AccessToken | None:
        """The grant of whichever verifier knows ``token``, or None."""
        if self.named is not None:
            grant = await self.named.verify_token(token)
            if grant is not None:
                return grant
        if self.jwt is not None and token.count(".") == 2:
            return await self.jwt.verify_token(token)
        if self.introspection is not None:
            return await self.introspection.verify_token(token)
        return None


def credentials_for(config: ServeConfig, log: Logger | None = None) -> Credentials:
    """The verifiers ``config`` asks for (none: an empty, false :class:`Credentials`).

    Raises:
        UsageError: a token, key or client file is unreadable, malformed or not private.
    """
    named = None
    if config.token_file is not None or config.token_env is not None:
        named = NamedTokens(config.token_file, config.token_env)
        named.load()
    verifier = introspection = None
    if config.auth_issuer is not None and config.auth_audience is not None:
        if config.auth_jwks_file is not None:
            keys = JwksKeys.from_file(config.auth_jwks_file)
        else:
            keys = JwksKeys(
                issuer=config.auth_issuer, refresh_interval_s=config.auth_keys_refresh_s, log=log
            )
        verifier = JwtVerifier(
            config.auth_issuer, config.auth_audience, keys, leeway_s=config.auth_leeway_s, log=log
        )
        if config.auth_introspection is not None and config.auth_client_file is not None:
            introspection = IntrospectionVerifier(
                config.auth_introspection,
                read_client_file(config.auth_client_file),
                config.auth_issuer,
                config.auth_audience,
                log=log,
            )
    return Credentials(named, verifier, introspection)


def is_loopback(host: str) -> bool:
    """Whether a bind address is reachable from this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(config: ServeConfig, credentials: Credentials) -> None:
    """Refuse to serve without authentication on an address other than loopback, unless
    the operator said so (``allow_unauthenticated``).

    Raises:
        UsageError: no credential is configured for a non-loopback bind.
    """
    if credentials or config.allow_unauthenticated or is_loopback(config.host):
        return
    raise UsageError(
        f"refusing to serve {config.host} without authentication: anyone who reaches the "
        "port could call every tool",
        hint="give --token-file FILE ('NAME TOKEN' lines, mode 0600) or --auth-issuer URL "
        "--auth-audience URI; or, to serve it open on purpose, --allow-unauthenticated",
    )
