"""The HTTP front door: Host/Origin allowlist, body limit, bearer tokens, malformed input."""

from __future__ import annotations

import hmac
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from skilld.errors import UsageError
from skilld.mcp import ServeConfig, _auth
from support.mcp_fakes import fake_dispatcher, running_http

pytestmark = pytest.mark.anyio

BINDS = ["127.0.0.1", "0.0.0.0"]
ALPHA = "alpha-token-1-0123456789abcdefghijkl"
BETA = "beta-token-2-0123456789abcdefghijklm"
ALPHA_BETA = (ALPHA, BETA)
TOKEN_ENV = "from-env-0123456789abcdefghijklmnopq"
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
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


BIG = dict(INIT, params={**INIT["params"], "pad": "x" * 4096})  # type: ignore[dict-item]


async def _chunks() -> AsyncIterator[bytes]:
    """4 KiB of body in chunks: the client sends no Content-Length."""
    for _ in range(4):
        yield b" " * 1024


def _tokens(path: Path, text: str) -> Path:
    """A private token file holding ``text``."""
    path.write_text(text)
    path.chmod(0o600)
    return path


def _body(response: httpx2.Response) -> Any:
    """The JSON-RPC message of a JSON or single-event SSE response."""
    text = response.text
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        text = next(
            line[5:] for line in text.splitlines() if line.startswith("data:") and line[5:].strip()
        )
    return json.loads(text)


@pytest.mark.parametrize("bind", BINDS)
async def test_bad_host_origin_and_body(bind: str) -> None:
    """Foreign Host is 421, foreign Origin 403, an oversized body 413, on any bind address."""
    config = ServeConfig(
        transport="http", host=bind, port=0, max_body_bytes=2048, allow_unauthenticated=True
    )
    with anyio.fail_after(30):
        async with running_http(fake_dispatcher(), config) as server:
            url = f"http://127.0.0.1:{server.port}/mcp"
            async with httpx2.AsyncClient(timeout=10) as http:
                ok = await http.post(url, json=INIT, headers=ACCEPT)
                assert ok.status_code == 200
                assert _body(ok)["result"]["serverInfo"]["name"] == "skilld"

                host = await http.post(
                    url, json=INIT, headers={**ACCEPT, "Host": "evil.example.com"}
                )
                assert host.status_code == 421
                rebound = await http.post(
                    url, json=INIT, headers={**ACCEPT, "Host": f"evil.example.com:{server.port}"}
                )
                assert rebound.status_code == 421
                origin = await http.post(
                    url, json=INIT, headers={**ACCEPT, "Origin": "http://evil.example.com"}
                )
                assert origin.status_code == 403
                local = await http.post(
                    url, json=INIT, headers={**ACCEPT, "Origin": f"http://localhost:{server.port}"}
                )
                assert local.status_code == 200

                assert (await http.post(url, json=BIG, headers=ACCEPT)).status_code == 413

                sse = await http.get(
                    f"http://127.0.0.1:{server.port}/sse", headers={"Host": "evil.example.com"}
                )
                assert sse.status_code == 421
                probe = await http.get(
                    f"http://127.0.0.1:{server.port}/healthz", headers={"Host": "10.0.0.7:8080"}
                )
                assert probe.status_code == 200


@pytest.mark.parametrize("bind", BINDS)
async def test_malformed_json_rpc_gets_an_error_response(bind: str) -> None:
    """Unparsable JSON and a non-JSON-RPC object get JSON-RPC errors, and the server stays up."""
    config = ServeConfig(transport="http", host=bind, port=0, allow_unauthenticated=True)
    with anyio.fail_after(30):
        async with running_http(fake_dispatcher(), config) as server:
            url = f"http://127.0.0.1:{server.port}/mcp"
            async with httpx2.AsyncClient(timeout=10) as http:
                broken = await http.post(
                    url, content=b'{"jsonrpc": "2.0", "id": 1,', headers=ACCEPT
                )
                assert broken.status_code == 400
                assert _body(broken)["error"]["code"] == -32700
                wrong = await http.post(url, json={"hello": "world"}, headers=ACCEPT)
                assert wrong.status_code == 400
                assert "error" in _body(wrong)
                assert (await http.post(url, json=INIT, headers=ACCEPT)).status_code == 200


@pytest.mark.parametrize("bind", BINDS)
async def test_bearer_tokens(bind: str, tmp_path: Path) -> None:
    """No token or a wrong one: 401 with WWW-Authenticate: Bearer; any listed token works."""
    tokens = _tokens(
        tmp_path / "tokens",
        f"# clients\nalpha {ALPHA}\n\nbeta {BETA}\n",
    )
    config = ServeConfig(transport="http", host=bind, port=0, token_file=tokens)
    with anyio.fail_after(30):
        async with running_http(fake_dispatcher(), config) as server:
            base = f"http://127.0.0.1:{server.port}"
            async with httpx2.AsyncClient(timeout=10) as http:
                missing = await http.post(f"{base}/mcp", json=INIT, headers=ACCEPT)
                assert missing.status_code == 401
                assert missing.headers["www-authenticate"].startswith("Bearer ")
                wrong = await http.post(
                    f"{base}/mcp", json=INIT, headers={**ACCEPT, "Authorization": "Bearer alpha"}
                )
                assert wrong.status_code == 401
                assert wrong.headers["www-authenticate"].startswith("Bearer ")
                for token in ALPHA_BETA:
                    good = await http.post(
                        f"{base}/mcp",
                        json=INIT,
                        headers={**ACCEPT, "Authorization": f"Bearer {token}"},
                    )
                    assert good.status_code == 200
                assert (await http.get(f"{base}/sse")).status_code == 401
                assert (await http.get(f"{base}/metrics")).status_code == 401
                assert (await http.get(f"{base}/healthz")).status_code == 200


async def test_session_belongs_to_its_token(tmp_path: Path) -> None:
    """A session opened with one token cannot be driven with another (per-session isolation)."""
    tokens = _tokens(
        tmp_path / "tokens",
        f"alpha {ALPHA}\nbeta {BETA}\n",
    )
    config = ServeConfig(transport="http", port=0, token_file=tokens)
    with anyio.fail_after(30):
        async with (
            running_http(fake_dispatcher(), config) as server,
            httpx2.AsyncClient(timeout=10) as http,
        ):
            alpha = {**ACCEPT, "Authorization": f"Bearer {ALPHA}"}
            opened = await http.post(server.url, json=INIT, headers=alpha)
            session = opened.headers["mcp-session-id"]
            listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
            beta = {**ACCEPT, "Authorization": f"Bearer {BETA}", "mcp-session-id": session}
            stolen = await http.post(server.url, json=listing, headers=beta)
            assert stolen.status_code in (403, 404)
            mine = await http.post(
                server.url, json=listing, headers={**alpha, "mcp-session-id": session}
            )
            assert mine.status_code in (200, 202)


async def test_token_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A token named by token_env is required and accepted."""
    monkeypatch.setenv("SKILLD_TEST_TOKEN", TOKEN_ENV)
    config = ServeConfig(transport="http", port=0, token_env="SKILLD_TEST_TOKEN")
    with anyio.fail_after(30):
        async with (
            running_http(fake_dispatcher(), config) as server,
            httpx2.AsyncClient(timeout=10) as http,
        ):
            assert (await http.post(server.url, json=INIT, headers=ACCEPT)).status_code == 401
            auth = {**ACCEPT, "Authorization": f"Bearer {TOKEN_ENV}"}
            assert (await http.post(server.url, json=INIT, headers=auth)).status_code == 200


async def test_allowed_hosts_extend_the_allowlist() -> None:
    """A configured Host and Origin are accepted beside the local ones; others still are not."""
    config = ServeConfig(
        transport="http",
        host="0.0.0.0",
        port=0,
        allow_unauthenticated=True,
        allowed_hosts=("skilld.internal:*",),
        allowed_origins=("https://agent.example.com",),
    )
    with anyio.fail_after(30):
        async with (
            running_http(fake_dispatcher(), config) as server,
            httpx2.AsyncClient(timeout=10) as http,
        ):
            url = f"http://127.0.0.1:{server.port}/mcp"
            named = {
                **ACCEPT,
                "Host": "skilld.internal:8080",
                "Origin": "https://agent.example.com",
            }
            assert (await http.post(url, json=INIT, headers=named)).status_code == 200
            assert (
                await http.post(url, json=INIT, headers={**ACCEPT, "Host": "skilld.internal"})
            ).status_code == 421
            sibling = {**ACCEPT, "Host": "skilld.internal.evil:1"}
            assert (await http.post(url, json=INIT, headers=sibling)).status_code == 421
            other = {**ACCEPT, "Origin": "https://agent.example.com.evil"}
            assert (await http.post(url, json=INIT, headers=other)).status_code == 403


def test_token_configuration_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing or empty token file or an unset variable is a usage error, never an open door."""
    with pytest.raises(UsageError, match="cannot read"):
        _auth.NamedTokens(tmp_path / "absent", None).load()
    empty = _tokens(tmp_path / "empty", "# nothing\n\n")
    with pytest.raises(UsageError, match="holds no token"):
        _auth.NamedTokens(empty, None).load()
    monkeypatch.delenv("SKILLD_UNSET_TOKEN", raising=False)
    with pytest.raises(UsageError, match="SKILLD_UNSET_TOKEN"):
        _auth.NamedTokens(None, "SKILLD_UNSET_TOKEN").load()
    assert not _auth.credentials_for(ServeConfig())


@pytest.mark.parametrize("bind", BINDS)
async def test_host_and_origin_ignore_case(bind: str) -> None:
    """Host and Origin match the allowlist whatever their case (DNS ignores it), the
    operator's mixed-case entries included; others do not."""
    config = ServeConfig(
        transport="http",
        host=bind,
        port=0,
        allow_unauthenticated=True,
        allowed_hosts=("App.Example.COM:*",),
        allowed_origins=("https://App.Example.COM",),
    )
    with anyio.fail_after(30):
        async with (
            running_http(fake_dispatcher(), config) as server,
            httpx2.AsyncClient(timeout=10) as http,
        ):
            url = f"http://127.0.0.1:{server.port}/mcp"
            for host in ("LOCALHOST", f"LocalHost:{server.port}"):
                upper = await http.post(url, json=INIT, headers={**ACCEPT, "Host": host})
                assert upper.status_code == 200, (host, upper.text)
            origin = {**ACCEPT, "Origin": f"HTTP://LOCALHOST:{server.port}"}
            assert (await http.post(url, json=INIT, headers=origin)).status_code == 200
            operators = {
                **ACCEPT,
                "Host": f"app.example.com:{server.port}",
                "Origin": "https://APP.example.com",
            }
            got = await http.post(url, json=INIT, headers=operators)
            assert got.status_code == 200, got.text
            evil = {**ACCEPT, "Host": f"EVIL.example.com:{server.port}"}
            assert (await http.post(url, json=INIT, headers=evil)).status_code == 421


@pytest.mark.parametrize("bind", BINDS)
async def test_chunked_oversized_body_is_refused(bind: str) -> None:
    """A body without Content-Length is counted as it arrives and refused past the limit."""
    config = ServeConfig(
        transport="http", host=bind, port=0, max_body_bytes=2048, allow_unauthenticated=True
    )
    with anyio.fail_after(30):
        async with (
            running_http(fake_dispatcher(), config) as server,
            httpx2.AsyncClient(timeout=10) as http,
        ):
            url = f"http://127.0.0.1:{server.port}/mcp"
            chunked = await http.post(url, content=_chunks(), headers=ACCEPT)
            assert "content-length" not in chunked.request.headers
            assert chunked.status_code == 413


@pytest.mark.parametrize("bind", BINDS)
async def test_token_is_checked_before_the_body(bind: str, tmp_path: Path) -> None:
    """Without a valid token an oversized body gets 401, never 413; with one it gets 413."""
    tokens = _tokens(tmp_path / "tokens", f"alpha {ALPHA}\n")
    config = ServeConfig(
        transport="http", host=bind, port=0, max_body_bytes=2048, token_file=tokens
    )
    with anyio.fail_after(30):
        async with (
            running_http(fake_dispatcher(), config) as server,
            httpx2.AsyncClient(timeout=10) as http,
        ):
            url = f"http://127.0.0.1:{server.port}/mcp"
            wrong = {**ACCEPT, "Authorization": "Bearer alpha"}
            for headers in (ACCEPT, wrong):
                sized = await http.post(url, json=BIG, headers=headers)
                assert sized.status_code == 401
                assert sized.headers["www-authenticate"].startswith("Bearer ")
                chunked = await http.post(url, content=_chunks(), headers=headers)
                assert chunked.status_code == 401
            good = {**ACCEPT, "Authorization": f"Bearer {ALPHA}"}
            assert (await http.post(url, json=BIG, headers=good)).status_code == 413
            assert (await http.post(url, content=_chunks(), headers=good)).status_code == 413
            assert (await http.post(url, json=INIT, headers=good)).status_code == 200


async def test_tokens_are_compared_as_digests(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Every comparison is of two sha256 digests, so its time cannot reveal a token's length."""
    compared: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(_auth.hmac, "compare_digest", spy)
    short, long = "s" * 32, "a-much-longer-bearer-token-0123456789-0123456789"
    verifier = _auth.NamedTokens(_tokens(tmp_path / "t", f"short {short}\nlong {long}\n"), None)
    verifier.load()
    one = await verifier.verify_token(short)
    two = await verifier.verify_token(long)
    assert one is not None and two is not None and one.caller != two.caller
    assert await verifier.verify_token("x") is None
    assert await verifier.verify_token(short + "-but-not-quite") is None
    assert set(compared) == {(32, 32)}
    assert len(compared) == 8  # every configured token, for every presented one


@pytest.mark.parametrize(
    ("ident", "logged"),
    [
        (7, 7),
        ("req-1", "req-1"),
        ("i" * 128, "i" * 128),
        ("i" * (1 << 20), "i" * 128 + "..."),
        (10**150, 10**150),
        (10**100_000, "an integer of 332193 bits"),  # past what str() will write
        (None, None),
    ],
    ids=["int", "short", "128", "1-MiB", "150-digits", "100000-digits", "none"],
)
def test_a_calls_log_line_shows_at_most_128_characters_of_any_request_id(
    ident: object, logged: object
) -> None:
    """A JSON-RPC id is the client's: a string up to the body's size, an integer of
    thousands of digits. The call's log line shows at most 128 characters of it."""
    from skilld.mcp._ring import _logged_id

    assert _logged_id(ident) == logged
