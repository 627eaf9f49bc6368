"""``shell.run`` through the confined runner: its deadline, its network, its refusals."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from skilld import confine
from skilld.call import CallContext
from skilld.errors import HostCallError
from skilld.permissions import SkillPermissions
from skilld.registry import NullChannel
from skilld.sandbox.abi import shell
from support.adversarial import compile_dir


def context(tmp_path: Path, policy: str, deadline: float | None = None) -> CallContext:
    """A call context of skill ``s`` under ``policy`` (compiled), ending at ``deadline``."""
    tables = compile_dir(tmp_path / "policies", {"s": policy})
    checker = SkillPermissions.from_tables(tables, "s")
    return CallContext("s", checker.limits, NullChannel(), checker=checker, deadline=deadline)


SLEEP = """\
shell:
  - program: /bin/sleep
    args: ["*"]
"""


def test_command_ends_with_the_calls_deadline(tmp_path: Path) -> None:
    """A command given 30 s by the guest and the rule ends when the call's wall time does."""
    ctx = context(tmp_path, SLEEP, deadline=time.monotonic() + 0.5)
    started = time.monotonic()
    with pytest.raises(HostCallError) as caught:
        shell.run(ctx, {"argv": ["/bin/sleep", "30"], "timeout_ms": 30_000})
    assert caught.value.code == "timeout"
    assert "deadline" in caught.value.message
    assert time.monotonic() - started < 0.5 + 2.0  # not the 30 s asked for


class CancelledChannel(NullChannel):
    """A client that has cancelled the call."""

    def cancelled(self) -> bool:
        """Always: the call is cancelled."""
        return True


def test_cancelled_call_kills_its_command(tmp_path: Path) -> None:
    """A command of a cancelled call is killed and the guest gets ``cancelled``."""
    ctx = context(tmp_path, SLEEP)
    ctx.channel = CancelledChannel()
    started = time.monotonic()
    with pytest.raises(HostCallError) as caught:
        shell.run(ctx, {"argv": ["/bin/sleep", "30"], "timeout_ms": 30_000})
    assert caught.value.code == "cancelled"
    assert time.monotonic() - started < 5


def bash_connect(port: int, tcp: str) -> str:
    """A policy letting bash open a TCP connection, with ``tcp`` as its tcp section."""
    return f"""\
shell:
  - program: /bin/bash
    args: ["-c", "exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected"]
{tcp}"""


def test_loopback_port_needs_a_tcp_grant(tmp_path: Path, listener: int) -> None:
    """Without a tcp grant a confined command cannot reach a loopback port; with one it can."""
    argv = ["/bin/bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{listener} && echo connected"]
    without = context(tmp_path / "a", bash_connect(listener, ""))
    granted = context(
        tmp_path / "b",
        bash_connect(listener, f"tcp:\n  - host: 127.0.0.1\n    ports: {listener}\n"),
    )
    assert shell.run(without, {"argv": argv})["stdout"] == b""
    assert shell.run(granted, {"argv": argv})["stdout"] == b"connected\n"


def test_refused_as_unavailable_without_landlock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without Landlock (simulated) the command is refused with ``unavailable``, its rule
    named, and it did not run."""
    marker = Path(os.path.realpath(tmp_path)) / "ran"
    policy = (
        f"fs:\n  - path: {marker.parent}\n    mode: rw\n"
        f"shell:\n  - program: /usr/bin/touch\n    args: ['{marker}']\n"
    )
    ctx = context(tmp_path, policy)
    monkeypatch.setenv(confine.SIMULATE_ABI_ENV, "0")
    with pytest.raises(HostCallError) as caught:
        shell.run(ctx, {"argv": ["/usr/bin/touch", str(marker)]})
    assert caught.value.code == "unavailable"
    assert caught.value.rule == "s.shell[0]"
    assert "rather than run unconfined" in caught.value.message
    assert not marker.exists()
