"""The wasm executor: a script sees only its per-call preopens, and a runaway costs one call."""

from __future__ import annotations

import json
from typing import Any

import pytest

from skilld import agentskills
from skilld.bundle import BuildResult
from skilld.errors import DeadlineExceeded
from skilld.registry import Call, Registry, SkillEntry
from skilld.sandbox import Sandbox
from skilld.types import Limits

PROBE = """\
import json, os, socket, sys
case, arg = sys.argv[1], sys.argv[2]
def attempt():
    if case == "read": return open(arg).read()
    if case == "write": return open(arg, "w").write("x")
    if case == "list": return os.listdir(arg)
    if case == "socket": return socket.create_connection(("127.0.0.1", int(arg)), timeout=1)
    if case == "spin":
        while True: pass
try:
    got = attempt()
except Exception as exc:
    print("BLOCKED", type(exc).__name__)
else:
    print("GOT", repr(got)[:80])
"""


@pytest.fixture(scope="module")
def world(
    agent_bundle: BuildResult, sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """A skill with the probe script, run by the bundle's runner, with two fs grants."""
    root = tmp_path_factory.mktemp("wasm")
    skill = root / "probe"
    (skill / "scripts").mkdir(parents=True)
    (skill / "SKILL.md").write_text(
        "---\nname: probe\ndescription: Probes the wasm executor.\n---\nx\n"
    )
    (skill / "scripts" / "probe.py").write_text(PROBE)
    ro, rw = root / "ro", root / "rw"
    ro.mkdir()
    rw.mkdir()
    (ro / "data.txt").write_text("granted data")
    source = agentskills.read_source(skill)
    spec = agentskills.describe(source.md, "0.0.0", source.files)
    lock = agent_bundle.lock
    assert lock.runner is not None
    runner = sandbox.load_native(
        agent_bundle.out / lock.runner.native, lock.runner.native_sha256, name="pyrunner"
    )
    limits = Limits(timeout_ms=3000)
    grants = {"fs": [{"path": str(ro), "mode": "ro"}, {"path": str(rw), "mode": "rw"}]}
    backend = agentskills.open_backend(spec, skill, None, "wasm", {}, grants, limits, runner)
    registry = Registry()
    registry.add(SkillEntry(spec=spec, component=backend, limits=limits))
    return {"registry": registry, "skill": skill, "ro": ro, "rw": rw}


def probe(world: dict[str, Any], case: str, arg: str) -> str:
    """The probe's verdict for one case."""
    out = world["registry"].call_method(
        Call("probe", "run_script", {"script": "scripts/probe.py", "args": [case, arg]})
    )
    return str(out.value["stdout"])


@pytest.mark.parametrize(
    ("case", "arg"),
    [
        ("read", "/etc/passwd"),
        ("read", "/proc/self/environ"),
        ("list", "/"),
        ("list", "/tmp"),
        ("write", "/skill/SKILL.md"),
        ("write", "/skill/scripts/new.py"),
        ("write", "{ro}/planted.txt"),
        ("read", "/skill/../../etc/passwd"),
        ("socket", "22"),
    ],
)
def test_outside_the_preopens_nothing_is_reachable(
    world: dict[str, Any], case: str, arg: str
) -> None:
    """Paths outside the call's preopens, writes to read-only ones and sockets all fail."""
    verdict = probe(world, case, arg.format(ro=world["ro"]))
    assert verdict.startswith("BLOCKED"), verdict
    assert not (world["ro"] / "planted.txt").exists()


def test_the_skill_dir_and_grants_are_reachable_as_granted(world: dict[str, Any]) -> None:
    """The skill directory and an ro grant read; an rw grant writes; the workspace is cwd."""
    assert "probe" in probe(world, "read", "/skill/SKILL.md")
    assert "granted data" in probe(world, "read", f"{world['ro']}/data.txt")
    assert probe(world, "write", f"{world['rw']}/out.txt").startswith("GOT")
    assert (world["rw"] / "out.txt").read_text() == "x"
    out = world["registry"].call_method(
        Call("probe", "run_script", {"script": "scripts/probe.py", "args": ["write", "made.txt"]})
    )
    assert out.value["files"] == ["workspace://probe/made.txt"]


def test_a_runaway_script_costs_one_call(world: dict[str, Any]) -> None:
    """A script that never ends is stopped at the deadline; the next call is answered."""
    with pytest.raises(DeadlineExceeded):
        probe(world, "spin", "")
    assert "probe" in probe(world, "read", "/skill/SKILL.md")
    assert json.dumps(probe(world, "list", "/skill"))
