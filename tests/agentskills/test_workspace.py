"""Workspaces: made in the node's work directory, capped in size; rw grants get a write budget.

Both executors, and both ways of capping a workspace (a tmpfs where this process may
mount, accounting elsewhere): a script filling its workspace or an rw grant is ended with
``limit-exceeded`` naming the cap, and the next call is answered.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from skilld import agentskills, paths
from skilld.agentskills import _quota
from skilld.bundle import BuildResult
from skilld.errors import GuestError
from skilld.registry import Call, Registry, SkillEntry
from skilld.sandbox import Sandbox
from skilld.types import Limits
from support.grants import give_grant

# fill.py TARGET MIB [FILES]: MIB files of 1 MiB (or FILES empty files) in TARGET, slowly
# enough that the watch sees it happen; prints where it ran.
FILL = """\
import os, sys, time
target, mib = sys.argv[1], int(sys.argv[2])
files = int(sys.argv[3]) if len(sys.argv) > 3 else 0
print("cwd", os.getcwd(), os.path.ismount(os.path.dirname(os.getcwd())))
os.makedirs(target, exist_ok=True)
chunk = b"x" * (1 << 20)
for i in range(files):
    open(os.path.join(target, "e%d" % i), "wb").close()
for i in range(mib):
    with open(os.path.join(target, "f%d" % i), "wb") as f:
        f.write(chunk)
    time.sleep(0.01)
print("done")
"""
CAP_MIB, BUDGET_MIB = 8, 4


def _backend(
    root: Path, executor: str, runner: Any, work: Path, interpreters: tuple[str, ...] = ()
) -> tuple[Registry, Path]:
    skill = root / "filler"
    (skill / "scripts").mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: filler\ndescription: Fills its disk.\n---\nx\n")
    (skill / "scripts" / "fill.py").write_text(FILL)
    rw = root / "rw"
    rw.mkdir()
    if executor == "native" and os.geteuid() == 0:
        # Native scripts run in the skill's group: the operator gives it its rw grant.
        give_grant([rw], "filler")
    source = agentskills.read_source(skill)
    spec = agentskills.describe(source.md, "0.0.0", source.files)
    limits = Limits(timeout_ms=20_000, workspace_bytes=CAP_MIB << 20, write_bytes=BUDGET_MIB << 20)
    grants = {"fs": [{"path": str(rw), "mode": "rw"}]}
    scripts = {"interpreters": interpreters}
    backend = agentskills.open_backend(
        spec, skill, None, executor, scripts, grants, limits, runner, work=work
    )
    registry = Registry()
    registry.add(SkillEntry(spec=spec, component=backend, limits=limits))
    return registry, rw


@pytest.fixture(scope="module", params=["wasm", "native"])
def world(
    request: pytest.FixtureRequest,
    agent_bundle: BuildResult,
    sandbox: Sandbox,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    """The filler skill under each executor, its rw grant and the node's work directory."""
    root = tmp_path_factory.mktemp(request.param)
    work = root / "state" / "work"
    paths.make_work_dir(root / "state")
    runner = None
    if request.param == "wasm":
        lock = agent_bundle.lock
        assert lock.runner is not None
        runner = sandbox.load_native(
            agent_bundle.out / lock.runner.native, lock.runner.native_sha256, name="pyrunner"
        )
    registry, rw = _backend(root, request.param, runner, work, ("python",))
    return {"registry": registry, "rw": rw, "work": work, "executor": request.param}


def _may_mount() -> bool:
    probe = Path(tempfile.mkdtemp())
    try:
        mounted = _quota.mount_tmpfs(probe, 1 << 20)
    finally:
        paths.remove_tree(probe)
    return mounted


@pytest.fixture(autouse=True, params=["tmpfs", "accounted"])
def capping(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test with the workspace a tmpfs (where this process may mount), and accounted."""
    if request.param == "tmpfs" and not _may_mount():
        pytest.skip("this process may not mount a tmpfs (not root, or no CAP_SYS_ADMIN)")
    monkeypatch.setattr(_quota._Mounts, "refused", request.param == "accounted")
    return str(request.param)


def fill(world: dict[str, Any], target: str, mib: int, files: int = 0) -> Any:
    """One run of fill.py; its value."""
    return (
        world["registry"]
        .call_method(
            Call(
                "filler",
                "run_script",
                {"script": "scripts/fill.py", "args": [target, str(mib), str(files)]},
            )
        )
        .value
    )


def _workspaces(work: Path) -> list[Path]:
    """The per-call workspaces left in the work directory (not the skill's copies)."""
    return [p for p in work.iterdir() if p.name.startswith("ws-")]


def _size(tree: Path) -> int:
    return sum(p.stat().st_size for p in tree.rglob("*") if p.is_file())


def test_a_script_runs_in_a_workspace_inside_the_work_dir(
    world: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capping: str
) -> None:
    """With the default temp directory unusable (a read-only root), a script still runs:
    its workspace is in its call's directory in the work directory (a tmpfs of its own
    where skilld may mount, which holds its private home too), removed after the call."""
    monkeypatch.setattr(tempfile, "tempdir", "/nonexistent/tmp")
    value = fill(world, "out", 1)
    assert value["exit_status"] == 0, value["stderr"]
    assert "done" in value["stdout"]
    if world["executor"] == "native":
        _, cwd, mounted = value["stdout"].split()[:3]
        assert Path(cwd).parent.parent == world["work"], cwd
        assert mounted == str(capping == "tmpfs")
    assert _workspaces(world["work"]) == []


def test_filling_the_workspace_is_ended_at_its_cap(world: dict[str, Any]) -> None:
    """64 MiB into an 8 MiB workspace: ended with limit-exceeded naming the cap; the next
    call is answered; nothing is left behind."""
    cap = r"workspace grew past its cap of 8 MiB \(limits\.workspace"
    with pytest.raises(GuestError, match=cap) as err:
        fill(world, "out", 64)
    assert err.value.code == "limit-exceeded"
    assert _workspaces(world["work"]) == []
    assert fill(world, "out", 1)["exit_status"] == 0


def test_filling_an_rw_grant_is_ended_at_the_write_budget(world: dict[str, Any]) -> None:
    """64 MiB into an rw grant with a 4 MiB budget: ended while it writes (far less than
    64 MiB lands), limit-exceeded naming the budget; the next call is answered."""
    target = str(world["rw"] / "fill")
    with pytest.raises(GuestError, match=r"write budget of 4 MiB") as err:
        fill(world, target, 64)
    assert err.value.code == "limit-exceeded"
    assert _size(world["rw"]) < 32 << 20, "the script was not ended while it wrote"
    assert fill(world, "out", 1)["exit_status"] == 0


def test_a_tree_of_empty_files_is_ended_at_the_entry_cap(world: dict[str, Any]) -> None:
    """Empty files fill no blocks but exhaust inodes: past 10,000 entries the call ends
    (under both executors: 12,000 WASI file creations take a few seconds)."""
    with pytest.raises(GuestError, match=r"more than 10000 files and directories"):
        fill(world, "many", 0, files=12_000)
    assert fill(world, "out", 1)["exit_status"] == 0


def test_outputs_that_cannot_be_kept_are_a_named_error(world: dict[str, Any]) -> None:
    """The kept store's directory gone (its disk full or removed): a run whose outputs must
    be kept is answered ``unavailable`` naming where, nothing is left in the work
    directory, and the next run is kept again once the store is back."""
    backend = next(e.component for e in world["registry"].skills() if e.spec.id == "filler")
    store = backend.kept.directory
    assert paths.remove_tree(store)
    try:
        with pytest.raises(GuestError, match="could not be kept") as err:
            fill(world, "out", 2)
        assert err.value.code == "unavailable"
        assert _workspaces(world["work"]) == []
    finally:
        store.mkdir(mode=0o700)
    assert len(fill(world, "out", 2)["resources"]) == 2
