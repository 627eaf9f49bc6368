"""End to end: a built bundle's caller rules, served by ``skilld serve`` with a token file.

The bundle (echo and notes) is built by ``build_bundle`` with ``policies/callers/``; the
server is a real process; the clients are the MCP SDK's, one per bearer token.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from skilld.bundle import build_bundle
from skilld.sandbox import Sandbox
from support.env import SKILLS, cache_dir
from support.serve_process import ServeProcess

ALPHA, BETA = "alpha-token-" + "a" * 32, "beta-token-" + "b" * 32


def build(root: Path, sandbox: Sandbox, callers: str | None) -> Path:
    """echo and notes, with ``callers`` as ``policies/callers/team.yaml`` (None: none)."""
    skills, policies = root / "skills", root / "policies"
    skills.mkdir(parents=True)
    for name in ("echo", "notes"):
        shutil.copytree(SKILLS[name], skills / name)
    (policies / "callers").mkdir(parents=True)
    (policies / "echo.yaml").write_text("skill: echo\n")
    (policies / "notes.yaml").write_text("skill: notes\nkv: {}\n")
    if callers is not None:
        (policies / "callers" / "team.yaml").write_text(callers)
    bundle = root / "bundle"
    build_bundle(skills, policies, bundle, sandbox=sandbox, cache_dir=cache_dir(), strict=False)
    return bundle


@pytest.fixture(scope="module")
def bundle(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundle whose caller rules give alpha's token echo, and beta's nothing."""
    rules = "rules:\n  - id: alpha-echo\n    who: [{token: alpha}]\n"
    return build(tmp_path_factory.mktemp("callers"), sandbox, rules + "    skills: [echo]\n")


@pytest.fixture
def tokens(tmp_path: Path) -> Path:
    """The server's token file: alpha's and beta's tokens."""
    path = tmp_path / "tokens"
    path.write_text(f"alpha {ALPHA}\nbeta {BETA}\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def server(bundle: Path, tokens: Path, tmp_path: Path) -> Iterator[ServeProcess]:
    """``skilld serve`` of the bundle over HTTP, requiring a token from the file."""
    proc = ServeProcess(bundle, tmp_path / "state", extra=("--token-file", str(tokens)))
    yield proc
    proc.stop()


@asynccontextmanager
async def session(url: str, token: str) -> AsyncIterator[ClientSession]:
    """An SDK client holding ``token``."""
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as s,
    ):
        await s.initialize()
        yield s


def test_each_token_lists_and_calls_what_the_bundle_rules_give(server: ServeProcess) -> None:
    """alpha lists echo's tools (none of notes') and calls them; beta lists nothing and is
    refused naming default-deny; the refusal is audited; no warning at start."""

    async def main() -> None:
        with anyio.fail_after(60):
            async with session(server.url, ALPHA) as alpha:
                names = [t.name for t in (await alpha.list_tools()).tools]
                assert names and all(n.startswith("echo/") for n in names), names
                answer = await alpha.call_tool("echo/echo", {"text": "hi"})
                assert not answer.is_error, answer
            async with session(server.url, BETA) as beta:
                assert (await beta.list_tools()).tools == []
                refused = await beta.call_tool("echo/echo", {"text": "hi"})
                assert refused.is_error
                text = refused.content[0].text  # type: ignore[union-attr]
                assert text.startswith("[not-permitted, rule default-deny] token:beta ")

    anyio.run(main)
    refusals = [r for r in server.audit() if r.get("outcome") == "not-permitted"]
    assert [(r["skill"], r["method"]) for r in refusals] == [("echo", "echo")]
    assert not [e for e in server.events() if e.get("event") == "callers_unnamed"]


def test_tokens_without_caller_rules_are_warned_about(
    sandbox: Sandbox, tokens: Path, tmp_path: Path
) -> None:
    """A token setup whose bundle names no token or OAuth caller says so at start."""
    bundle = build(tmp_path / "b", sandbox, None)
    proc = ServeProcess(bundle, tmp_path / "state", extra=("--token-file", str(tokens)))
    try:
        warned = [e for e in proc.events() if e.get("event") == "callers_unnamed"]
        assert len(warned) == 1 and "policies/callers/" in warned[0]["detail"]
    finally:
        proc.stop()
