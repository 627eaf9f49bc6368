"""skilld serve end to end: a real bundle, a real MCP client, stdio in an empty netns."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from skilld.bundle import build_bundle
from skilld.sandbox import Sandbox
from support.env import ROOT, SKILLS, cache_dir
from support.mcp_fakes import text_of as _text
from support.serve_process import serve_argv

POLICIES = {
    "echo.yaml": "skill: echo\ninvoke:\n  called_by: [hostile]\n",
    "hostile.yaml": (
        "skill: hostile\nkv: {}\nfs:\n  - id: data-ro\n    path: {data}\n    mode: ro\n"
        "invoke:\n  calls: [echo]\nlimits:\n  wall_time: 3s\n  memory: 128MiB\n"
    ),
}


@pytest.fixture(scope="module")
def served(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A bundle of echo and hostile with a small policy, plus a data directory it may read."""
    root = tmp_path_factory.mktemp("serve")
    data = root / "data"
    data.mkdir()
    (data / "hello.txt").write_text("hello from data")
    skills = root / "skills"
    skills.mkdir()
    shutil.copytree(ROOT / "skills" / "echo", skills / "echo")
    shutil.copytree(SKILLS["hostile"], skills / "hostile")
    policies = root / "policies"
    policies.mkdir()
    for name, text in POLICIES.items():
        (policies / name).write_text(text.replace("{data}", str(data)))
    bundle = root / "bundle"
    build_bundle(skills, policies, bundle, sandbox=sandbox, cache_dir=cache_dir(), strict=False)
    return {"bundle": bundle, "data": data, "state": root / "state"}


def _env() -> dict[str, str]:
    return {**os.environ, "SKILLD_CACHE": str(cache_dir())}


def _unshare_works() -> bool:
    try:
        return (
            subprocess.run(
                ["unshare", "-n", "true"], capture_output=True, check=False, timeout=10
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


@asynccontextmanager
async def stdio_session(argv: list[str]) -> AsyncIterator[ClientSession]:
    """An initialized SDK client session to a server started with ``argv``."""
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=_env())
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


@pytest.mark.skipif(not _unshare_works(), reason="unshare -n needs user or network namespaces")
def test_stdio_in_empty_network_namespace(served: dict[str, Path]) -> None:
    """serve inside `unshare -n` (no network at all) lists tools and answers calls over stdio."""
    argv = ["unshare", "-n", *serve_argv(served["bundle"], served["state"], "stdio")]

    async def run() -> None:
        with anyio.fail_after(60):
            async with stdio_session(argv) as session:
                names = {t.name for t in (await session.list_tools()).tools}
                assert {"echo/echo", "hostile/read_file", "hostile/relay"} <= names
                result = await session.call_tool("echo/echo", {"text": "offline"})
                assert not result.is_error and _text(result) == "offline"

    anyio.run(run)


@pytest.mark.parametrize("inline", [[], ["--inline-ms", "0"]], ids=["inline", "threads-only"])
def test_denied_permission_is_a_tool_error(served: dict[str, Path], inline: list[str]) -> None:
    """A policy denial is a tool error naming the code and rule; the server lives on.

    The same with calls tried inline first (the default) and with every call on a thread.
    """
    argv = serve_argv(served["bundle"], served["state"], "stdio", *inline)

    async def run() -> None:
        with anyio.fail_after(60):
            async with stdio_session(argv) as session:
                ok = await session.call_tool(
                    "hostile/read_file", {"path": str(served["data"] / "hello.txt")}
                )
                assert not ok.is_error and "hello from data" in _text(ok)
                denied = await session.call_tool("hostile/read_file", {"path": "/etc/passwd"})
                assert denied.is_error
                assert "not-permitted" in _text(denied) and "default-deny" in _text(denied)
                looped = await session.call_tool("hostile/loop", {})
                assert looped.is_error and "deadline" in _text(looped)
                via = await session.call_tool(
                    "hostile/relay",
                    {"skill_id": "echo", "method": "echo", "args": {"text": "invoked"}},
                )
                assert _text(via) == "invoked"
                again = await session.call_tool("echo/echo", {"text": "still up"})
                assert _text(again) == "still up"

    anyio.run(run)
    audit = [
        json.loads(line) for line in (served["state"] / "audit.jsonl").read_text().splitlines()
    ]
    denied = [r for r in audit if r["method"] == "read_file" and r["outcome"] != "ok"]
    assert denied and denied[-1]["decisions"][0]["rule"] == "default-deny"


@pytest.mark.parametrize(
    ("value", "says"),
    [("200", "between 0 and 100"), ("-1", "between 0 and 100"), ("soon", "not a number")],
)
def test_inline_budget_out_of_range_is_refused(value: str, says: str) -> None:
    """--inline-ms outside 0..100 stops at argument parsing, naming the option."""
    proc = subprocess.run(
        [sys.executable, "-m", "skilld", "serve", "--inline-ms", value],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "--inline-ms" in proc.stderr and says in proc.stderr


def test_damaged_bundle_refuses_to_start(served: dict[str, Path], tmp_path: Path) -> None:
    """serve refuses to start on a bundle with one flipped byte, naming the file."""
    copy = tmp_path / "bundle"
    shutil.copytree(served["bundle"], copy)
    victim = copy / "native" / "echo.cwasm"
    victim.chmod(0o644)
    data = bytearray(victim.read_bytes())
    data[1000] ^= 0x40
    victim.write_bytes(bytes(data))
    proc = subprocess.run(
        serve_argv(copy, tmp_path / "state", "stdio"),
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 1
    assert "native/echo.cwasm" in proc.stderr and proc.stdout == ""
