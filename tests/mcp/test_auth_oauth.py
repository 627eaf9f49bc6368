"""skilld as an OAuth 2.1 resource server, against a real authorization server process
(``support.oauth_server``) and the official SDK's OAuth client."""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

from skilld.mcp import HttpServer
from skilld.mcp._auth import IntrospectionVerifier, JwksKeys, JwtVerifier
from skilld.types import Caller
from support.mcp_fakes import fake_dispatcher, text_of
from support.oauth import Authority, authority, resource_server

pytestmark = pytest.mark.anyio

ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"},
    },
}


@pytest.fixture(scope="module")
def auth_server() -> Iterator[Authority]:
    """One authorization server process for the module."""
    with authority() as a:
        yield a


@pytest.fixture
async def skilld(auth_server: Authority) -> AsyncIterator[HttpServer]:
    """skilld trusting ``auth_server``, keys refetched for an unknown kid at most every 0.2 s."""
    async with resource_server(
        fake_dispatcher(), auth_server.issuer, auth_keys_refresh_s=0.2
    ) as server:
        yield server


class MemoryStorage:
    """The SDK client's token storage, in memory."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


async def _status(url: str, token: str, body: Any = INIT) -> httpx2.Response:
    async with httpx2.AsyncClient(timeout=30) as http:
        return await http.post(
            url, json=body, headers={**ACCEPT, "Authorization": f"Bearer {token}"}
        )


async def test_sdk_client_runs_the_oauth_flow(auth_server: Authority, skilld: HttpServer) -> None:
    """The SDK's OAuth client finds the authorization server through the resource metadata
    (401, then RFC 9728, then RFC 8414), gets a token for this resource and calls a tool."""
    storage = MemoryStorage()
    provider = ClientCredentialsOAuthProvider(
        server_url=skilld.url,
        storage=storage,
        client_id="alice",
        client_secret="alice-secret",
        issuer=auth_server.issuer,
    )
    with anyio.fail_after(60):
        async with (
            httpx2.AsyncClient(auth=provider, timeout=30) as http,
            streamable_http_client(skilld.url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            result = await session.call_tool("notes/echo", {"text": "hello"})
            assert not result.is_error and "hello" in text_of(result)
    assert storage.tokens is not None  # the flow ran: a token was issued and kept


async def test_resource_metadata_and_challenge(auth_server: Authority, skilld: HttpServer) -> None:
    """Without a token: 401 naming the metadata URL; the metadata names the issuer exactly."""
    base = skilld.url.removesuffix("/mcp")
    async with httpx2.AsyncClient(timeout=30) as http:
        refused = await http.post(skilld.url, json=INIT, headers=ACCEPT)
        assert refused.status_code == 401
        challenge = refused.headers["www-authenticate"]
        url = f"{base}/.well-known/oauth-protected-resource/mcp"
        assert f'resource_metadata="{url}"' in challenge
        for path in (
            "/.well-known/oauth-protected-resource/mcp",
            "/.well-known/oauth-protected-resource",
        ):
            metadata = (await http.get(f"{base}{path}")).json()
            assert metadata["resource"] == skilld.url
            assert metadata["authorization_servers"] == [auth_server.issuer]


HOSTILE = {
    "expired": {"claims": {"exp": int(time.time()) - 120, "iat": int(time.time()) - 400}},
    # Far ahead: HOSTILE is made at import, and a whole suite can run for many minutes.
    "not yet valid": {"claims": {"nbf": int(time.time()) + 30 * 86400}},
    "wrong audience": {"aud": "https://elsewhere.example/mcp"},
    "wrong issuer": {"claims": {"iss": "https://impostor.example"}},
    "alg none": {"forge": "none"},
    "HS256 keyed with the public key": {"forge": "hs256-public"},
    "unknown kid": {"forge": "unknown-kid"},
    "no subject": {"claims": {"sub": None}},
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
async def test_hostile_tokens_are_refused(
    case: str, auth_server: Authority, skilld: HttpServer
) -> None:
    """Each token that must not verify gets 401; a sound one from the same server gets in."""
    spec: dict[str, Any] = {"aud": skilld.url, **HOSTILE[case]}
    if spec.get("claims", {}).get("sub", "") is None:
        spec["claims"] = {"sub": None}
    token = auth_server.mint(**spec)
    with anyio.fail_after(30):
        refused = await _status(skilld.url, token)
        assert refused.status_code == 401, (case, refused.text)
        assert (await _status(skilld.url, auth_server.mint(aud=skilld.url))).status_code == 200


async def test_token_for_another_resource_is_refused(
    auth_server: Authority, skilld: HttpServer
) -> None:
    """A token the right issuer made for another resource (RFC 8707) is refused."""
    other = auth_server.token("alice", "http://127.0.0.1:1/mcp")
    mine = auth_server.token("alice", skilld.url)
    with anyio.fail_after(30):
        assert (await _status(skilld.url, other)).status_code == 401
        assert (await _status(skilld.url, mine)).status_code == 200


async def test_key_rotation_without_restart(auth_server: Authority, skilld: HttpServer) -> None:
    """After the issuer rotates its key, tokens under the new kid verify (fetched once)."""
    with anyio.fail_after(30):
        assert (
            await _status(skilld.url, auth_server.token("alice", skilld.url))
        ).status_code == 200
        auth_server.rotate()
        before = auth_server.jwks_fetches()
        fresh = auth_server.token("alice", skilld.url)
        deadline = time.monotonic() + 10
        while (await _status(skilld.url, fresh)).status_code != 200:
            assert time.monotonic() < deadline, "the rotated key was never picked up"
            await anyio.sleep(0.05)
        assert auth_server.jwks_fetches() - before == 1


async def test_unknown_kids_do_not_fetch_per_request(auth_server: Authority) -> None:
    """A flood of tokens under unknown kids fetches the key set at most once per interval."""
    keys = JwksKeys(issuer=auth_server.issuer, refresh_interval_s=60)
    verifier = JwtVerifier(auth_server.issuer, "urn:skilld:test", keys)
    good = auth_server.mint(aud="urn:skilld:test")
    assert await verifier.verify_token(good) is not None
    before = auth_server.jwks_fetches()
    for _ in range(20):
        assert (
            await verifier.verify_token(
                auth_server.mint(aud="urn:skilld:test", forge="unknown-kid")
            )
            is None
        )
    assert auth_server.jwks_fetches() == before
    assert await verifier.verify_token(good) is not None


async def test_the_caller_is_the_tokens_subject(auth_server: Authority) -> None:
    """A verified token is Caller.oauth(issuer, subject, scopes, groups)."""
    keys = JwksKeys(issuer=auth_server.issuer)
    verifier = JwtVerifier(auth_server.issuer, "urn:skilld:test", keys)
    token = auth_server.token("alice", "urn:skilld:test", scope="tools:call skilld:metrics")
    grant = await verifier.verify_token(token)
    assert grant is not None
    assert grant.caller == Caller.oauth(
        auth_server.issuer,
        "alice",
        frozenset({"tools:call", "skilld:metrics"}),
        frozenset({"alice-team"}),
    )
    assert grant.caller.key == f"oauth:{auth_server.issuer}#alice"


async def test_metrics_need_the_operator_scope(auth_server: Authority, skilld: HttpServer) -> None:
    """/metrics is 403 insufficient_scope naming skilld:metrics without it, 200 with it."""
    metrics = skilld.url.removesuffix("/mcp") + "/metrics"
    plain = auth_server.token("mallory", skilld.url)
    operator = auth_server.token("alice", skilld.url, scope="skilld:metrics")
    async with httpx2.AsyncClient(timeout=30) as http:
        assert (await http.get(metrics)).status_code == 401
        refused = await http.get(metrics, headers={"Authorization": f"Bearer {plain}"})
        assert refused.status_code == 403
        assert 'error="insufficient_scope"' in refused.headers["www-authenticate"]
        assert 'scope="skilld:metrics"' in refused.headers["www-authenticate"]
        allowed = await http.get(metrics, headers={"Authorization": f"Bearer {operator}"})
        assert allowed.status_code == 200 and "skilld_tool_calls_total" in allowed.text


async def test_header_spelling_is_one_caller(auth_server: Authority, skilld: HttpServer) -> None:
    """Bearer, bearer and BEARER with one token are one caller: one session serves all."""
    token = auth_server.token("alice", skilld.url)
    async with httpx2.AsyncClient(timeout=30) as http:
        opened = await http.post(
            skilld.url, json=INIT, headers={**ACCEPT, "Authorization": f"Bearer {token}"}
        )
        session = opened.headers["mcp-session-id"]
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        for scheme in ("bearer", "BEARER", "Bearer"):
            headers = {**ACCEPT, "Authorization": f"{scheme} {token}", "mcp-session-id": session}
            answered = await http.post(skilld.url, json=listing, headers=headers)
            assert answered.status_code == 200, (scheme, answered.text)


async def test_opaque_tokens_through_introspection(auth_server: Authority, tmp_path: Path) -> None:
    """An opaque token is asked of the issuer (RFC 7662): accepted for this resource,
    refused for another, refused when the issuer does not know it."""
    client = tmp_path / "client"
    client.write_text("skilld skilld-secret\n")
    client.chmod(0o600)
    async with resource_server(
        fake_dispatcher(),
        auth_server.issuer,
        auth_introspection=f"{auth_server.issuer}/introspect",
        auth_client_file=client,
    ) as server:
        mine = auth_server.token("alice", server.url, token_format="opaque")
        other = auth_server.token("alice", "http://127.0.0.1:1/mcp", token_format="opaque")
        assert "." not in mine
        with anyio.fail_after(30):
            assert (await _status(server.url, mine)).status_code == 200
            assert (await _status(server.url, other)).status_code == 401
            assert (await _status(server.url, "x" * 43)).status_code == 401


async def test_air_gapped_keys_from_a_file(auth_server: Authority, tmp_path: Path) -> None:
    """With --auth-jwks the keys come from the file: tokens verify, nothing is fetched."""
    jwks = tmp_path / "jwks.json"
    jwks.write_text(httpx2.get(f"{auth_server.issuer}/jwks", timeout=30).text)
    before = auth_server.jwks_fetches()
    async with resource_server(
        fake_dispatcher(), auth_server.issuer, auth_jwks_file=jwks
    ) as server:
        with anyio.fail_after(30):
            good = auth_server.token("alice", server.url)
            assert (await _status(server.url, good)).status_code == 200
            unknown = auth_server.mint(aud=server.url, forge="unknown-kid")
            assert (await _status(server.url, unknown)).status_code == 401
    assert auth_server.jwks_fetches() == before  # the server fetched none


async def test_required_scope_is_named(auth_server: Authority) -> None:
    """With --auth-scope, a token without it is 403 insufficient_scope naming it."""
    async with resource_server(
        fake_dispatcher(), auth_server.issuer, auth_scopes=("mcp:use",)
    ) as server:
        with anyio.fail_after(30):
            lacking = await _status(server.url, auth_server.token("alice", server.url))
            assert lacking.status_code == 403
            challenge = lacking.headers["www-authenticate"]
            assert 'error="insufficient_scope"' in challenge and 'scope="mcp:use"' in challenge
            assert "resource_metadata=" in challenge
            scoped = auth_server.token("alice", server.url, scope="mcp:use")
            assert (await _status(server.url, scoped)).status_code == 200


async def test_a_flood_of_made_up_opaque_tokens_costs_the_issuer_little(
    auth_server: Authority,
) -> None:
    """mallory sends made-up opaque tokens at once to a slow issuer (0.2 s an answer)
    and each again: at most max_in_flight questions are in flight at once, a repeated
    token is not asked again, the same token sent 20 times at once is asked once, and
    alice's grant (asked first) survives a flood larger than the cache. Control: without
    the bounds every token is one request at once."""
    resource = "http://127.0.0.1:9/mcp"
    verifier = IntrospectionVerifier(
        f"{auth_server.issuer}/introspect",
        ("skilld", "skilld-secret"),
        auth_server.issuer,
        resource,
        cache_size=50,
        cache_s=600,  # the whole test: alice's grant is still fresh at its end
        max_in_flight=4,
        timeout_s=30,
    )
    alice = auth_server.token("alice", resource, token_format="opaque")
    assert (await verifier.verify_token(alice)) is not None
    auth_server.introspect_delay(0.2)
    try:
        before = auth_server.stats()["introspections"]
        made_up = [secrets.token_urlsafe(32) for _ in range(120)]
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for token in made_up[:40]:
                    tg.start_soon(verifier.verify_token, token)
                for _ in range(20):
                    tg.start_soon(verifier.verify_token, made_up[0])
        stats = auth_server.stats()
        assert stats["introspecting_most"] <= 4, stats
        assert stats["introspections"] - before == 40, stats  # made_up[0] once
        with anyio.fail_after(60):
            for token in made_up[:40]:  # refused ones are remembered: not asked again
                assert await verifier.verify_token(token) is None
        assert auth_server.stats()["introspections"] - before == 40
        auth_server.introspect_delay(0)
        with anyio.fail_after(120):
            for token in made_up[40:]:  # more refusals than the cache holds
                assert await verifier.verify_token(token) is None
        asked = auth_server.stats()["introspections"]
        grant = await verifier.verify_token(alice)  # still known: not asked again
        assert grant is not None and grant.caller.name == "alice"
        assert auth_server.stats()["introspections"] == asked
    finally:
        auth_server.introspect_delay(0)
