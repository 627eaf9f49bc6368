"""The air-gapped install: wheels made online, then install, build and serve with no network.

Install, build and serve run in an empty network namespace (``unshare -n``) when this
machine allows one; pip runs ``--isolated`` so that no configured index or find-links
can stand in for the wheelhouse.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from support.env import ROOT, cache_dir

pytestmark = pytest.mark.slow


def _offline() -> list[str]:
    """The prefix that removes the network, or nothing where namespaces are not allowed."""
    try:
        ok = subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=10).returncode
    except (OSError, subprocess.TimeoutExpired):
        return []
    return ["unshare", "-n"] if ok == 0 else []


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV"))}
    return env | {"SKILLD_CACHE": str(cache_dir()), "SKILLD_STATE_DIR": str(tmp / "state")}


def test_install_build_and_serve_without_network(tmp_path: Path) -> None:
    """From a wheelhouse alone: install skilld[build], build the bundle, serve tools/list."""
    wheels, venv, bundle = tmp_path / "wheelhouse", tmp_path / "venv", tmp_path / "bundle"
    env, offline = _env(tmp_path), _offline()
    # The one step that may use the network.
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(wheels), ".[build]"],
        cwd=ROOT,
        check=True,
    )
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "pip"), "--isolated", "install", "-q", "--no-index"]
    subprocess.run(
        [*offline, *pip, "--find-links", str(wheels), "skilld[build]"], env=env, check=True
    )
    skilld = str(venv / "bin" / "skilld")
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import skilld; print(skilld.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(str(venv)), f"skilld imported from {where}, not the new venv"
    build = [skilld, "build", "--skills", "skills", "--policies", "policies", "-q"]
    subprocess.run(
        [*offline, *build, "-o", str(bundle)],
        cwd=ROOT,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    argv = [*offline, skilld, "serve", "--bundle", str(bundle), "--transport", "stdio"]

    async def serve() -> None:
        params = StdioServerParameters(command=argv[0], args=argv[1:], env=env)
        with anyio.fail_after(60):
            async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
                await s.initialize()
                names = {t.name for t in (await s.list_tools()).tools}
                assert "echo/echo" in names
                result = await s.call_tool("echo/echo", {"text": "air-gapped"})
                assert [getattr(c, "text", None) for c in result.content] == ["air-gapped"]

    anyio.run(serve)
