"""Named token files, SIGHUP reload and the safe default (no open non-loopback bind)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from skilld.errors import UsageError
from skilld.mcp import ServeConfig
from skilld.mcp._auth import (
    MIN_TOKEN_CHARS,
    NamedTokens,
    check_exposure,
    create_token_file,
    credentials_for,
    is_loopback,
    parse_token_file,
)
from skilld.types import Caller
from support.mcp_fakes import TESTS

ALICE = "alice-0123456789abcdefghijklmnopqrstuvwxyz"
MALLORY = "mallory-0123456789abcdefghijklmnopqrstuvw"


def _file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize(
    ("text", "mode", "message"),
    [
        (f"{ALICE}\n", 0o600, "a token without a name"),
        ("alice short-token\n", 0o600, f"at least {MIN_TOKEN_CHARS}"),
        (f"alice {ALICE}\n", 0o644, "token file has mode 0644"),
        (f"alice {ALICE}\n", 0o640, "token file has mode 0640"),
        (f"alice {ALICE}\nalice {MALLORY}\n", 0o600, "given twice"),
        (f"alice {ALICE}\nbob {ALICE}\n", 0o600, "given twice"),
        (f"al/ice {ALICE}\n", 0o600, "bad token name"),
        (f'alice {ALICE} "quoted"\n', 0o600, "bad scope"),
        ("# only comments\n", 0o600, "holds no token"),
    ],
)
def test_bad_token_files_are_refused(tmp_path: Path, text: str, mode: int, message: str) -> None:
    """Each malformed or exposed token file is a usage error naming the file (and line)."""
    path = _file(tmp_path / "tokens", text, mode)
    with pytest.raises(UsageError, match=message) as info:
        parse_token_file(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("line", ["SKILLD_TOKEN {other}\n", "bob {env}\n"])
def test_the_environment_token_is_never_a_file_tokens_twin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line: str
) -> None:
    """--token-env VAR names its token VAR: a file line with that name (two tokens, one
    principal) or with that token (one token, two principals) is refused, naming both."""
    env, other = "e" * 40, "o" * 40
    monkeypatch.setenv("SKILLD_TOKEN", env)
    path = _file(tmp_path / "tokens", line.format(env=env, other=other), 0o600)
    with pytest.raises(UsageError, match="SKILLD_TOKEN and the token file's") as info:
        NamedTokens(path, "SKILLD_TOKEN").load()
    assert str(path) in str(info.value)
    monkeypatch.setenv("SKILLD_TOKEN", "x" * 40)
    assert NamedTokens(_file(tmp_path / "ok", f"bob {other}\n", 0o600), "SKILLD_TOKEN").load() == 2


@pytest.mark.anyio
async def test_named_tokens_are_callers(tmp_path: Path) -> None:
    """Each token is its name's caller, with its scopes."""
    named = NamedTokens(
        _file(tmp_path / "t", f"alice {ALICE} skilld:metrics\nmallory {MALLORY}\n"), None
    )
    assert named.load() == 2
    alice, mallory = await named.verify_token(ALICE), await named.verify_token(MALLORY)
    assert alice is not None and mallory is not None
    assert alice.caller == Caller.token("alice", frozenset({"skilld:metrics"}))
    assert mallory.caller.key == "token:mallory"
    assert await named.verify_token(ALICE[:-1]) is None


@given(st.text(min_size=0, max_size=200))
def test_token_file_parser_never_crashes(text: str) -> None:
    """Whatever a token file holds, it parses or is a UsageError (hostile input)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tokens"
        path.write_text(text, encoding="utf-8")
        path.chmod(0o600)
        try:
            tokens = parse_token_file(path)
        except UsageError:
            return
        assert all(len(t.digest) == 32 for t in tokens)


def test_token_file_init_makes_one_private_file(tmp_path: Path) -> None:
    """The first start writes a 0600 file with an admin token; the second leaves it alone."""
    path = tmp_path / "tokens"
    token = create_token_file(path)
    assert token is not None and len(token) >= MIN_TOKEN_CHARS
    assert (path.stat().st_mode & 0o777) == 0o600
    assert create_token_file(path) is None
    (admin,) = parse_token_file(path)
    assert admin.name == "admin" and "skilld:metrics" in admin.scopes


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1", "skilld.example.com"])
def test_open_non_loopback_bind_is_refused(host: str) -> None:
    """Without a credential a non-loopback bind is refused, naming the flag that allows it."""
    config = ServeConfig(transport="http", host=host)
    with pytest.raises(UsageError, match="--allow-unauthenticated"):
        check_exposure(config, credentials_for(config))
    allowed = ServeConfig(transport="http", host=host, allow_unauthenticated=True)
    check_exposure(allowed, credentials_for(allowed))


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.2"])
def test_loopback_needs_no_credential(host: str) -> None:
    """A loopback bind serves without credentials (only this machine reaches it)."""
    assert is_loopback(host)
    config = ServeConfig(transport="http", host=host)
    check_exposure(config, credentials_for(config))


_SERVE = """
import sys
from pathlib import Path
from skilld.mcp import ServeConfig, serve
from support.mcp_fakes import fake_dispatcher
serve(fake_dispatcher(), ServeConfig(transport="http", port=int(sys.argv[1]),
                                     token_file=Path(sys.argv[2]), log_file=Path(sys.argv[3])))
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _until(what: str, check: object, deadline_s: float = 20) -> None:
    deadline = time.monotonic() + deadline_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_sighup_reloads_tokens_and_never_stops(tmp_path: Path) -> None:
    """SIGHUP re-reads the token file: a removed token stops working, an added one works;
    a broken file keeps the tokens in force; the server goes on serving throughout."""
    tokens = _file(tmp_path / "tokens", f"alice {ALICE}\nmallory {MALLORY}\n")
    port = _free_port()
    log = tmp_path / "log"
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVE, str(port), str(tokens), str(log)],
        cwd=TESTS,
        env=env,
    )
    url = f"http://127.0.0.1:{port}/metrics"

    def status(token: str) -> int:
        try:
            return httpx2.get(
                url, headers={"Authorization": f"Bearer {token}"}, timeout=5
            ).status_code
        except httpx2.HTTPError:
            return 0

    try:
        # /metrics without the scope: 403 for a known token, 401 for an unknown one
        _until("the server never answered", lambda: status(MALLORY) == 403)
        assert status(ALICE) == 403
        _file(tokens, f"alice {ALICE} skilld:metrics\n")
        proc.send_signal(signal.SIGHUP)
        _until("mallory's removed token still works", lambda: status(MALLORY) == 401)
        assert status(ALICE) == 200
        _file(tokens, "garbage\n")
        proc.send_signal(signal.SIGHUP)
        _until("no log line for the broken file", lambda: "tokens_not_reloaded" in log.read_text())
        assert proc.poll() is None
        assert status(ALICE) == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode == 0, log.read_text()
    assert '"tokens_reloaded"' in log.read_text()


@pytest.mark.anyio
async def test_caller_of_a_request(tmp_path: Path) -> None:
    """caller_of: no HTTP request is the local stdio user; an authenticated one its token's
    caller; an unauthenticated one the anonymous caller."""
    from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
    from starlette.requests import Request

    from skilld.mcp._auth import caller_of

    named = NamedTokens(_file(tmp_path / "t", f"alice {ALICE}\n"), None)
    named.load()
    grant = await named.verify_token(ALICE)
    assert grant is not None
    scope = {"type": "http", "headers": [], "user": AuthenticatedUser(grant)}
    assert caller_of(Request(scope)) == Caller.token("alice")
    assert caller_of(Request({"type": "http", "headers": []})) == Caller.anonymous()
    assert caller_of(None) == Caller.local("stdio")


def test_request_state_key_must_be_private(tmp_path: Path) -> None:
    """skilld serve refuses a --request-state-key file others may read."""
    import argparse

    from skilld.cli._serve import _round_options

    key = _file(tmp_path / "request-state.key", "k" * 64, 0o644)
    args = argparse.Namespace(request_state_key=[key])
    with pytest.raises(UsageError, match="chmod 600"):
        _round_options(args, None, None)  # type: ignore[arg-type]
