"""``skilld doctor``: each layer, the identity mode, skills' uids, exit status."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from skilld import confine
from skilld.cli import main


def test_doctor_prints_every_layer_and_passes_where_commands_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """On this host (commands run) doctor lists every layer, prints the uid of a named
    skill, and exits 0, or 1 saying so when this interpreter is closed to the skills'
    uids (a pyenv under a 0700 home: native Python scripts could not start)."""
    code = main(["doctor", "--skill", "notes"])
    out = capsys.readouterr().out
    for layer in ("landlock", "seccomp", "identity", "namespaces", "reaper", "python", "probe"):
        assert f"  {layer}" in out
    assert f"skill notes: uid and gid {confine.uid_for('notes')}" in out
    real = Path(os.path.realpath(sys.executable))
    reachable = all(p.stat().st_mode & 0o001 for p in (real, *real.parents))
    if reachable or os.geteuid() != 0:
        assert code == 0, out
        assert "native commands run here" in out
    else:
        assert code == 1, out
        assert f"cannot execute {real}" in out


def test_doctor_fails_where_no_layer_covers_the_network(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With namespaces forced off and Landlock simulated without TCP rules (ABI 3),
    nothing keeps a command off the network: doctor says so and exits 1."""
    monkeypatch.setenv("SKILLD_CONFINE_NAMESPACES", "0")
    monkeypatch.setenv(confine.SIMULATE_ABI_ENV, "3")
    code = main(["doctor"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "native commands are refused here" in out
    assert "FAIL" in out


@pytest.mark.skipif(os.geteuid() != 0, reason="chowns a directory")
def test_an_unwritable_rw_grant_is_named_with_its_owner_and_the_uid(tmp_path: Path) -> None:
    """A read-write grant the skill's uid cannot write is reported with its path, owner,
    mode and the chown that fixes it; once chowned, nothing is reported."""
    grant = tmp_path / "data"
    grant.mkdir(mode=0o755)
    uid = confine.uid_for("writer")
    problem = confine.unwritable(str(grant), uid)
    assert problem is not None
    assert str(grant) in problem and f"uid {uid}" in problem and "0755" in problem
    assert f"chown -R {uid}:{uid} {grant} && chmod -R g+rwX {grant}" in problem
    os.chown(grant, uid, uid)
    assert confine.unwritable(str(grant), uid) is not None  # its calls are the group
    grant.chmod(0o775)
    assert confine.unwritable(str(grant), uid) is None
