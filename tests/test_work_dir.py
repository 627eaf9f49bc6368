"""skilld.paths.make_work_dir: where per-call scratch goes, made once, swept of dead servers'."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from skilld import paths


def test_the_work_dir_is_in_the_state_dir_unless_the_operator_names_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """STATE/work by default; $SKILLD_WORK_DIR when set; never $TMPDIR."""
    monkeypatch.delenv(paths.WORK_DIR_ENV, raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    assert paths.work_dir(tmp_path / "state") == tmp_path / "state" / "work"
    monkeypatch.setenv(paths.WORK_DIR_ENV, str(tmp_path / "fast"))
    assert paths.work_dir(tmp_path / "state") == tmp_path / "fast"


def test_the_work_dir_is_made_0711(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Made with its parents, mode 0711 even when it existed wider."""
    monkeypatch.delenv(paths.WORK_DIR_ENV, raising=False)
    work = paths.make_work_dir(tmp_path / "state")
    assert work == tmp_path / "state" / "work"
    assert work.stat().st_mode & 0o7777 == 0o711
    work.chmod(0o777)
    paths.make_work_dir(tmp_path / "state")
    assert work.stat().st_mode & 0o7777 == 0o711


def test_a_linked_work_dir_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A link in the work dir's place is not followed (it could point anywhere)."""
    monkeypatch.delenv(paths.WORK_DIR_ENV, raising=False)
    (tmp_path / "elsewhere").mkdir(mode=0o755)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "work").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):
        paths.make_work_dir(tmp_path / "state")
    assert (tmp_path / "elsewhere").stat().st_mode & 0o7777 != 0o711


def test_a_dead_servers_scratch_is_swept_a_live_ones_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per-call dirs of a process that is gone are removed at start; this process's stay."""
    monkeypatch.delenv(paths.WORK_DIR_ENV, raising=False)
    work = paths.make_work_dir(tmp_path / "state")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    dead = work / f"ws-{gone}-notes-abc"
    (dead / "sub").mkdir(parents=True)
    (dead / "sub" / "big").write_bytes(b"x" * 100)
    (dead / "sub").chmod(0o500)  # a script took its write bit away
    live = Path(paths.scratch_prefix("ws", "notes")).name
    (work / f"{live}keep").mkdir()
    (work / "operator-notes").mkdir()
    paths.make_work_dir(tmp_path / "state")
    assert not dead.exists()
    assert (work / f"{live}keep").is_dir()
    assert (work / "operator-notes").is_dir()
    assert os.getpid() != int(gone)
