"""A skill whose programs keep their profile at a fixed /tmp path (docx's
accept_changes.py) runs confined over MCP when the operator declares the path."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from test_mcp import _value

from skilld.bundle import build_bundle
from skilld.sandbox import Sandbox
from tests_env import cache_dir

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs a uid per skill (root)")

PROFILE = "/tmp/skilld-test-fixed-profile"
SCRIPT = f"""
import json, os
P = {PROFILE!r}
seen = sorted(os.listdir(P)) if os.path.isdir(P) else None
try:
    os.makedirs(P + "/user/basic/Standard", exist_ok=True)
    with open(P + "/user/basic/Standard/Module1.xba", "w") as f:
        f.write("macro")
    wrote = "ok"
except OSError as exc:
    wrote = exc.errno
print(json.dumps({{"seen": seen, "wrote": wrote}}))
"""


def _skill(root: Path, name: str) -> None:
    (root / name / "scripts").mkdir(parents=True)
    (root / name / "SKILL.md").write_text(
        f"---\nname: {name}\ndescription: Keeps a profile at a fixed path in /tmp. Use to "
        "test declared temporary paths.\n---\n# Fixed profile\n\nRun `scripts/profile.py`.\n"
    )
    (root / name / "scripts" / "profile.py").write_text(SCRIPT)


def test_a_declared_fixed_profile_path_is_fresh_for_each_call_and_gone_after(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """With ``scripts.temp_paths`` naming the fixed path, each call over MCP finds it an
    empty directory of its own, writes its profile and macro there, and the path is gone
    after; the same script of a skill whose policy does not declare it cannot make it."""
    _skill(tmp_path / "skills", "fixed-profile")
    _skill(tmp_path / "skills", "no-temp")
    (tmp_path / "policies").mkdir()
    native = "scripts:\n  executor: native\n"
    (tmp_path / "policies" / "fixed-profile.yaml").write_text(
        f"skill: fixed-profile\n{native}  temp_paths: [{PROFILE}]\n"
    )
    (tmp_path / "policies" / "no-temp.yaml").write_text(f"skill: no-temp\n{native}")
    build_bundle(
        tmp_path / "skills",
        tmp_path / "policies",
        tmp_path / "bundle",
        sandbox=sandbox,
        cache_dir=cache_dir(),
        lenient=False,
        strict=True,
    )
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "skilld", "serve", "--bundle", "bundle", "--state-dir", "state"],
        env={**os.environ, "SKILLD_CACHE": str(cache_dir())},
        cwd=str(tmp_path),
    )
    assert not os.path.lexists(PROFILE)
    got: list[dict[str, object]] = []

    async def main() -> None:
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            for tool in ("fixed-profile", "fixed-profile", "no-temp"):
                ran = await s.call_tool(f"{tool}/run_script", {"script": "scripts/profile.py"})
                value = _value(ran)
                assert value["exit_status"] == 0, value
                got.append(json.loads(value["stdout"]))
                assert not os.path.lexists(PROFILE)

    anyio.run(main)
    assert got[0] == got[1] == {"seen": [], "wrote": "ok"}
    assert got[2] == {"seen": None, "wrote": 13}  # EACCES: not declared, not granted
