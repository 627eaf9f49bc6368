"""Agent Skills over MCP: ``skilld serve`` on a real bundle, a real SDK client over stdio."""

from __future__ import annotations

import base64
import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from skilld.bundle import BuildResult
from support.agentskills import make_pdf
from support.env import cache_dir
from support.mcp_fakes import text_of as _text


@asynccontextmanager
async def session_for(bundle: Path, state: Path) -> AsyncIterator[ClientSession]:
    """An initialised SDK client session to ``skilld serve --bundle`` over stdio."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "skilld", "serve", "--bundle", str(bundle), "--state-dir", str(state)],
        env={**os.environ, "SKILLD_CACHE": str(cache_dir())},
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session



def _value(result: object) -> dict[str, object]:
    value: dict[str, object] = json.loads(getattr(result, "content", [])[0].text)
    return value


def test_tiers_resources_prompts_and_both_executors(
    agent_bundle: BuildResult, tmp_path: Path
) -> None:
    """Tier 1 lists each skill as a tool, tier 2 returns its body and file index, tier 3
    reads files as skill:// resources with MIME types; a stdlib script runs under wasm
    and a pypdf script under native, both through the SDK client, each audited."""

    async def main() -> None:
        async with session_for(agent_bundle.out, tmp_path / "state") as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert {"brand-voice", "csv-summary", "pdf-text", "release-notes"} <= set(tools)
            assert tools["csv-summary"].description.startswith("Summarise CSV files")
            assert "csv-summary/run_script" in tools
            assert "brand-voice/run_script" not in tools  # instructions only

            tier2 = await s.call_tool("csv-summary", {})
            assert not tier2.is_error
            text = _text(tier2)
            assert len(tier2.content) == 1  # the body once: no JSON copy beside it
            assert text.count("# CSV summary") == 1
            assert text.startswith('<skill_content name="csv-summary">')
            assert "Skill directory: skill://csv-summary/" in text
            assert "<file>references/FORMAT.md</file>" in text

            resources = {str(r.uri): r for r in (await s.list_resources()).resources}
            fmt = resources["skill://csv-summary/references/FORMAT.md"]
            assert fmt.mime_type == "text/markdown"
            assert resources["skill://pdf-text/scripts/extract.py"].mime_type == "text/x-python"
            read = await s.read_resource(fmt.uri)
            assert "Output format" in read.contents[0].text  # type: ignore[union-attr]

            prompts = {p.name for p in (await s.list_prompts()).prompts}
            assert "brand-voice" in prompts
            prompt = await s.get_prompt("brand-voice")
            assert "House style" in prompt.messages[0].content.text  # type: ignore[union-attr]

            csv_text = "city,temp\nOslo,4\nRome,17\nLima,19\n"
            ran = await s.call_tool(
                "csv-summary/run_script",
                {"script": "scripts/summarize.py", "stdin": csv_text},
            )
            value = _value(ran)
            assert value["executor"] == "wasm"
            assert value["exit_status"] == 0, value["stderr"]
            summary = json.loads(str(value["stdout"]))
            assert summary["rows"] == 3
            assert summary["columns"]["temp"]["max"] == 19.0
            assert value["files"] == ["workspace://csv-summary/summary.json"]

            pdf = base64.b64encode(make_pdf("Hello from a test PDF")).decode()
            ran = await s.call_tool(
                "pdf-text/run_script",
                {"script": "scripts/extract.py", "args": ["--stdin-base64"], "stdin": pdf},
            )
            value = _value(ran)
            assert value["executor"] == "native"
            assert value["exit_status"] == 0, value["stderr"]
            out = json.loads(str(value["stdout"]))
            assert out["pages"] == 1
            assert "Hello from a test PDF" in out["text"]
            embedded = [c for c in ran.content if c.type == "resource"]
            assert embedded[0].resource.text.strip() == "Hello from a test PDF"  # type: ignore[union-attr]

    anyio.run(main)
    records = [
        json.loads(line) for line in (tmp_path / "state" / "audit.jsonl").read_text().splitlines()
    ]
    runs = [r for r in records if r.get("method") == "run_script"]
    assert [(r["skill"], r["executor"], r["exit_status"]) for r in runs] == [
        ("csv-summary", "wasm", 0),
        ("pdf-text", "native", 0),
    ]
    assert all(r["input_sha256"] and r["output_sha256"] and r["duration_ms"] for r in runs)
    assert runs[1]["decisions"][0]["rule"] == "pdf-text.scripts"
    reads = [r for r in records if r.get("method") == "read-resource"]
    assert reads[0]["target"] == "skill://csv-summary/references/FORMAT.md"


@pytest.mark.parametrize("script", ["../SKILL.md", "scripts/missing.py", "SKILL.md"])
def test_run_script_refuses_what_is_not_a_script(
    agent_bundle: BuildResult, tmp_path: Path, script: str
) -> None:
    """Only the skill's own scripts run: other paths are refused by the input schema."""

    async def main() -> None:
        async with session_for(agent_bundle.out, tmp_path / "state") as s:
            ran = await s.call_tool("csv-summary/run_script", {"script": script})
            assert ran.is_error

    anyio.run(main)
