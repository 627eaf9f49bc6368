"""A skill whose programs keep their profile at a fixed /tmp path (docx's
accept_changes.py) runs confined over MCP when the operator declares the path."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession
from mcp.client.stdio import stdio_client
from test_corpus import FODS
from test_mcp import _value

from skilld.sandbox import Sandbox
from support.agentskills import serve_built

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
    params = serve_built(tmp_path, sandbox, strict=True)
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


LO_PROFILE = "/tmp/skilld-test-lo-profile"
LO_SCRIPT = f"""
import json, os, subprocess
P = {LO_PROFILE!r}
os.makedirs(P + "/user/basic/Standard", exist_ok=True)
with open(P + "/user/basic/Standard/Module1.xba", "w") as f:
    f.write("macro")
done = subprocess.run(
    ["soffice", "-env:UserInstallation=file://" + P, "--headless", "--convert-to", "csv",
     "--outdir", ".", "s.fods"],
    capture_output=True, text=True, timeout=60,
    env=dict(os.environ, SAL_USE_VCLPLUGIN="svp"),
)
print(json.dumps({{"rc": done.returncode, "err": done.stderr[-1500:],
                   "csv": open("s.csv").read() if os.path.exists("s.csv") else None,
                   "profile": sorted(os.listdir(P + "/user"))}}))
"""


@pytest.mark.skipif(
    shutil.which("soffice") is None and not os.environ.get("CI"),
    reason="LibreOffice is not installed (CI installs it: .ci/run)",
)
def test_libreoffice_with_its_profile_at_a_declared_fixed_path_runs_confined(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """Shaped like docx's accept_changes.py: a script writes a macro into a LibreOffice
    profile at a fixed /tmp path, then runs ``soffice -env:UserInstallation=`` on it over
    MCP; with the path declared, LibreOffice converts the file, uses that profile, and
    the path is gone after the call."""
    root = tmp_path / "skills" / "fixed-office"
    (root / "scripts").mkdir(parents=True)
    (root / "SKILL.md").write_text(
        "---\nname: fixed-office\ndescription: Converts a spreadsheet with LibreOffice using "
        "a profile at a fixed path. Use to test declared temporary paths.\n---\n# Office\n"
    )
    (root / "scripts" / "convert.py").write_text(LO_SCRIPT)
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "fixed-office.yaml").write_text(
        "skill: fixed-office\nscripts:\n  executor: native\n  programs: [soffice]\n"
        f"  temp_paths: [{LO_PROFILE}]\nlimits:\n  memory: 1GiB\n  wall_time: 90s\n"
    )
    params = serve_built(tmp_path, sandbox, strict=True)

    async def main() -> None:
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            ran = await s.call_tool(
                "fixed-office/run_script",
                {"script": "scripts/convert.py", "files": [{"path": "s.fods", "text": FODS}]},
            )
            value = _value(ran)
            assert value["exit_status"] == 0, value
            got = json.loads(value["stdout"])
            assert got["rc"] == 0, got
            assert got["csv"].split() == ["20,42", "22,84"], got
            # LibreOffice made its user installation there, beside the macro.
            assert {"basic", "registrymodifications.xcu"} <= set(got["profile"]), got
            assert value["files"] == ["workspace://fixed-office/s.csv"], value["files"]

    anyio.run(main)
    assert not os.path.lexists(LO_PROFILE)
