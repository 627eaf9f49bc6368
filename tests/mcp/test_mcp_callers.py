"""Who may list and call what, over a real MCP client: each caller's lists, refused calls.

The local user over an in-memory session (what stdio gives), anonymous and token holders
over Streamable HTTP with the server's bearer token file; the rules are compiled the way
``skilld build`` compiles ``policies/callers/``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import TypeAdapter

from skilld.mcp import ServeConfig
from skilld.mcp._skills_ext import GetSkillParams
from skilld.registry import Registry
from support.callers import caller_registry
from support.mcp_fakes import memory_service, memory_session, running_http, text_of

pytestmark = pytest.mark.anyio

ALPHA, BETA = "alpha-token-" + "a" * 32, "beta-token-" + "b" * 32
LOCAL_RULES = """\
rules:
  - id: local-echo
    who: local
    tools: ['echo/*']
    prompts: [echo-prompt]
"""
TOKEN_RULES = """\
rules:
  - id: alpha-notes
    who: [{token: alpha}]
    skills: [notes, reporter]
  - id: anonymous-echo
    who: anonymous
    tools: [echo/echo]
"""
DUMP: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Any])


async def listing(s: ClientSession) -> dict[str, list[str]]:
    """Every list the session's caller gets."""
    skills = await s.send_request(types.Request(method="skills/list", params={}), DUMP)
    return {
        "tools": sorted(t.name for t in (await s.list_tools()).tools),
        "prompts": sorted(p.name for p in (await s.list_prompts()).prompts),
        "resources": sorted(str(r.uri) for r in (await s.list_resources()).resources),
        "templates": sorted(
            t.uri_template for t in (await s.list_resource_templates()).resource_templates
        ),
        "skills": sorted(e["uri"] for e in skills["skills"]),
    }


async def test_the_local_user_lists_and_calls_only_what_its_rule_names(tmp_path: Path) -> None:
    """local, named by one allow rule: echo only in every list; the rest refused, audited."""
    registry, sink = caller_registry(tmp_path, LOCAL_RULES)
    with anyio.fail_after(30):
        async with memory_session(memory_service(registry)) as s:
            assert await listing(s) == {
                "tools": ["echo/echo"],
                "prompts": ["echo-prompt"],
                "resources": [],
                "templates": [],
                "skills": [],
            }
            ok = await s.call_tool("echo/echo", {"text": "hi"})
            assert not ok.is_error and "echo/echo" in text_of(ok)
            refused = await s.call_tool("notes/add", {"text": "hi"})
            assert refused.is_error
            assert text_of(refused).startswith("[not-permitted, rule default-deny] local may not")
            with pytest.raises(MCPError) as read:
                await s.read_resource("skill://reporter/report.txt")
            assert read.value.error.data == {"code": "not-permitted", "rule": "default-deny"}
            with pytest.raises(MCPError) as prompt:
                await s.get_prompt("note-prompt", {})
            assert "[not-permitted, rule default-deny]" in prompt.value.error.message
            got = types.Request[GetSkillParams, str](
                method="skills/get", params=GetSkillParams(uri="skill://notes/SKILL.md")
            )
            with pytest.raises(MCPError) as entry:
                await s.send_request(got, DUMP)
            assert entry.value.error.data == {"code": "not-permitted", "rule": "default-deny"}
            with pytest.raises(MCPError) as subscribed:
                await s.subscribe_resource("skill://reporter/report.txt")
            assert subscribed.value.error.data == {"code": "not-permitted", "rule": "default-deny"}
    refusals = [r for r in sink.records if r.get("outcome") == "not-permitted"]
    assert {(r["skill"], r["method"]) for r in refusals} >= {
        ("notes", "add"),
        ("reporter", "resource:skill://reporter/report.txt"),
        ("notes", "prompt:note-prompt"),
    }
    # The call that was refused never reached the skill.
    assert not [r for r in sink.records if r["skill"] == "notes" and not r.get("refused")]
    assert all("rule default-deny" in r["error"] for r in refusals)


@asynccontextmanager
async def http_session(url: str, token: str | None) -> AsyncIterator[ClientSession]:
    """An SDK client over Streamable HTTP, with ``token`` as its bearer token."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as s,
    ):
        await s.initialize()
        yield s


async def test_token_holders_get_what_their_rules_name(tmp_path: Path) -> None:
    """With the bearer token file: alpha's rule gives it notes and reporter; beta, named by
    no rule, lists nothing and is refused naming default-deny."""
    registry, _sink = caller_registry(tmp_path, TOKEN_RULES)
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alpha {ALPHA}\nbeta {BETA}\n")
    tokens.chmod(0o600)
    config = ServeConfig(transport="http", port=0, token_file=tokens)
    with anyio.fail_after(60):
        async with running_http(registry, config) as server:
            async with http_session(server.url, ALPHA) as alpha:
                assert await listing(alpha) == {
                    "tools": ["notes/add", "notes/list", "reporter/run"],
                    "prompts": ["note-prompt"],
                    "resources": ["skill://reporter/report.txt"],
                    "templates": ["skill://reporter/runs/{run}"],
                    "skills": ["skill://notes/SKILL.md", "skill://reporter/SKILL.md"],
                }
                assert not (await alpha.call_tool("notes/add", {"text": "a"})).is_error
                read = await alpha.read_resource("skill://reporter/runs/7")
                assert "skill://reporter/runs/7" in str(read.contents[0])
                denied = await alpha.call_tool("echo/echo", {"text": "a"})
                assert denied.is_error and "rule default-deny" in text_of(denied)
            async with http_session(server.url, BETA) as beta:
                assert await listing(beta) == {
                    "tools": [],
                    "prompts": [],
                    "resources": [],
                    "templates": [],
                    "skills": [],
                }
                refused = await beta.call_tool("notes/add", {"text": "b"})
                assert refused.is_error
                assert text_of(refused).startswith(
                    "[not-permitted, rule default-deny] token:beta may not"
                )


async def test_anonymous_http_clients(tmp_path: Path) -> None:
    """No authentication: without caller rules anonymous keeps everything; a rule naming it
    gives it exactly what it names."""
    open_registry: Registry = caller_registry(tmp_path / "open", None)[0]
    named: Registry = caller_registry(tmp_path / "named", TOKEN_RULES)[0]
    with anyio.fail_after(60):
        async with (
            running_http(open_registry) as server,
            http_session(server.url, None) as s,
        ):
            assert (await listing(s))["tools"] == sorted(t.name for t in open_registry.tools())
        async with running_http(named) as server, http_session(server.url, None) as s:
            assert (await listing(s))["tools"] == ["echo/echo"]
            refused = await s.call_tool("notes/add", {"text": "x"})
            assert text_of(refused).startswith("[not-permitted, rule default-deny] anonymous")
