"""Refusals that reveal nothing, and values the protocol forbids stopped at the boundary.

A denial names the path as the guest wrote it (folded) and the rule, never where a
planted link, ``/proc/self/fd/N``, ``/proc/self/exe`` or ``/proc/self/cwd`` leads. A
progress that is not a finite number and a log level that is not one of RFC 5424's
never reach the client; both are recorded as refused decisions.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skilld.policy import Tables
from skilld.registry import NullChannel
from skilld.sandbox import CallContext, Component
from skilld.types import Limits
from support.adversarial import Probe, compile_dir, fill

POLICY = """\
fs:
  - id: g
    path: {R}/g
  - id: rw
    path: {R}/rw
    mode: rw
  - id: proc
    path: {P}
"""
# This process's own /proc directory (its real path: /proc/self is itself a link).
PROC = f"/proc/{os.getpid()}"
NOFOLLOW = "fs.no-follow"
DENY = "default-deny"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Grants with links planted in them towards a secret place outside."""
    root = Path(os.path.realpath(tmp_path_factory.mktemp("denials")))
    (root / "g").mkdir()
    (root / "rw").mkdir()
    (root / "hidden-place").mkdir()
    (root / "hidden-place" / "secret.txt").write_text("TOP SECRET")
    (root / "g" / "file-link").symlink_to(root / "hidden-place" / "secret.txt")
    (root / "g" / "dir-link").symlink_to(root / "hidden-place")
    (root / "rw" / "file-link").symlink_to(root / "hidden-place" / "secret.txt")
    (root / "rw" / "dir-link").symlink_to(root / "hidden-place")
    return root


@pytest.fixture(scope="module")
def tables(world: Path, tmp_path_factory: pytest.TempPathFactory) -> Tables:
    """The prober's grants over the world, and this process's /proc directory read-only."""
    return compile_dir(
        tmp_path_factory.mktemp("policies"),
        {"prober": POLICY.replace("{R}", str(world)).replace("{P}", PROC)},
    )


def _secrets() -> list[str]:
    """What no refusal may show: where links lead, what /proc/self resolves to."""
    return [
        "hidden-place",
        os.path.realpath(sys.executable),
        os.path.realpath("/proc/self/exe"),
        str(Path.cwd()),
        "pipe:",
        "socket:",
        "/dev/",
        "anon_inode",
        "resolves to",
    ]


# (id, prober method, args with {R}, the rule expected)
CASES: list[tuple[str, str, dict[str, Any], str]] = [
    ("planted-file-link-read", "fs_read", {"path": "{R}/g/file-link"}, NOFOLLOW),
    ("planted-file-link-stat", "fs_stat", {"path": "{R}/g/file-link"}, NOFOLLOW),
    ("planted-dir-link-read", "fs_read", {"path": "{R}/g/dir-link/secret.txt"}, NOFOLLOW),
    ("planted-dir-link-list", "fs_list", {"path": "{R}/g/dir-link"}, NOFOLLOW),
    ("planted-dir-link-glob", "fs_glob", {"pattern": "{R}/g/dir-link/*"}, NOFOLLOW),
    (
        "planted-link-write",
        "fs_write",
        {"path": "{R}/rw/file-link", "data": "x"},
        NOFOLLOW,
    ),
    (
        "planted-dir-link-write",
        "fs_write",
        {"path": "{R}/rw/dir-link/secret.txt", "data": "x"},
        NOFOLLOW,
    ),
    ("planted-dir-link-mkdir", "fs_mkdir", {"path": "{R}/rw/dir-link/new"}, NOFOLLOW),
    ("planted-dir-link-remove", "fs_remove", {"path": "{R}/rw/dir-link/secret.txt"}, NOFOLLOW),
    ("proc-fd-outside-grant", "fs_read", {"path": "/proc/1/fd/0"}, DENY),
    ("proc-exe-outside-grant", "fs_read", {"path": "/proc/thread-self/exe"}, DENY),
    ("proc-fd-magic-link", "fs_read", {"path": "{P}/fd/0"}, NOFOLLOW),
    ("proc-fd-2", "fs_read", {"path": "{P}/fd/2"}, NOFOLLOW),
    ("proc-exe-magic-link", "fs_read", {"path": "{P}/exe"}, NOFOLLOW),
    ("proc-exe-stat", "fs_stat", {"path": "{P}/exe"}, NOFOLLOW),
    ("proc-cwd-through", "fs_read", {"path": "{P}/cwd/pyproject.toml"}, NOFOLLOW),
    ("proc-root-through", "fs_read", {"path": "{P}/root/etc/hostname"}, NOFOLLOW),
    ("proc-fd-list", "fs_list", {"path": "{P}/fd/0"}, NOFOLLOW),
    ("proc-self-is-a-link", "fs_read", {"path": "/proc/self/status"}, DENY),
]


@pytest.mark.parametrize(("name", "method", "args", "rule"), CASES, ids=[c[0] for c in CASES])
def test_refusals_name_only_what_the_guest_wrote(
    prober: Component,
    tables: Tables,
    world: Path,
    name: str,
    method: str,
    args: dict[str, Any],
    rule: str,
) -> None:
    """Each refusal has the expected rule, names the guest's own path, and nothing beyond it."""
    args = {k: v.replace("{P}", PROC) for k, v in fill(args, str(world)).items()}
    out = Probe(prober, tables)(method, **args)
    report = out.report
    assert report.get("error") == "not-permitted" and report["rule"] == rule, report
    written = args.get("path") or args["pattern"]
    assert written in report["message"], report
    rest = report["message"].replace(written, "")
    for secret in _secrets():
        assert secret not in rest, (secret, report)
    assert "TOP SECRET" not in json.dumps(report)


def test_a_real_proc_file_inside_a_grant_reads(prober: Component, tables: Tables) -> None:
    """/proc/PID is granted: its plain files read; only its (magic) links are refused."""
    out = Probe(prober, tables)("fs_read", path=f"{PROC}/status")
    assert "Name:" in out.report["ok"]


class Recorder(NullChannel):
    """A client that keeps what reaches it."""

    def __init__(self) -> None:
        self.progressed: list[tuple[float, float | None]] = []
        self.logged: list[tuple[str, Any]] = []

    def progress(self, progress: float, total: float | None, message: str | None) -> None:
        self.progressed.append((progress, total))

    def log(self, level: str, data: Any) -> None:
        self.logged.append((level, data))


def _mcp_call(component: Component, method: str, args: Mapping[str, Any]) -> tuple[Any, Any]:
    channel = Recorder()
    # No policy: progress and logs are always allowed, and refused only for their values.
    ctx = CallContext("prober", Limits(), channel)
    value = component.call(method, json.dumps(args), ctx).value
    assert not ctx.host_faults, ctx.host_faults
    return value, (channel, ctx.decisions)


# (value, total, forwarded)
PROGRESS: list[tuple[str, str | None, bool]] = [
    ("nan", None, False),
    ("inf", None, False),
    ("-inf", None, False),
    ("1", "nan", False),
    ("1", "inf", False),
    ("1", "2", True),
    ("0.5", None, True),
]


@pytest.mark.parametrize(("value", "total", "forwarded"), PROGRESS)
def test_progress_must_be_finite(
    prober_mcp: Component, value: str, total: str | None, forwarded: bool
) -> None:
    """progress(NaN) or an infinite total never reaches the client (it would read "null")."""
    report, (channel, decisions) = _mcp_call(
        prober_mcp, "mcp_progress", {"value": value, "total": total}
    )
    assert report == {"ok": None}
    if forwarded:
        assert channel.progressed == [(float(value), None if total is None else float(total))]
        assert decisions == []
    else:
        assert channel.progressed == []
        (refused,) = decisions
        assert (refused.allowed, refused.rule, refused.action) == (
            False,
            "mcp.bad-value",
            "progress",
        )


# (level, forwarded)
LEVELS: list[tuple[str, bool]] = [
    ("bogus", False),
    ("", False),
    ("info\n", False),
    ("warning; drop table", False),
    ("info", True),
    ("WARN", True),
    ("emergency", True),
    ("fatal", True),
    ("Debug", True),
]


@pytest.mark.parametrize(("level", "forwarded"), LEVELS)
def test_log_levels_are_known_ones(prober_mcp: Component, level: str, forwarded: bool) -> None:
    """A log level outside RFC 5424's (and the usual aliases) is refused, not read as info."""
    report, (channel, decisions) = _mcp_call(prober_mcp, "mcp_log", {"level": level})
    assert report == {"ok": None}
    if forwarded:
        assert channel.logged == [(level, "hello")]
    else:
        assert channel.logged == []
        (refused,) = decisions
        assert (refused.allowed, refused.rule) == (False, "mcp.bad-value")


SEGMENTS = ["..", ".", "", "g", "rw", "file-link", "dir-link", "secret.txt", "hidden-place", "x"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    method=st.sampled_from(["fs_read", "fs_stat", "fs_list", "fs_write", "fs_remove", "fs_mkdir"]),
    parts=st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=8),
)
def test_any_path_ends_clean_and_reveals_nothing(
    prober: Component, tables: Tables, world: Path, method: str, parts: list[str]
) -> None:
    """Any path built from dots, grants, links and the secret's names: a clean outcome, the
    secret neither read, changed nor named beyond what the guest wrote."""
    path = str(world) + "/" + "/".join(parts)
    args: dict[str, Any] = {"path": path} | ({"data": "x"} if method == "fs_write" else {})
    report = Probe(prober, tables)(method, **args).report
    assert report.get("error") in (None, "not-found", "not-permitted", "invalid-argument"), report
    assert "TOP SECRET" not in json.dumps(report)
    if "error" in report:
        assert "resolves to" not in report["message"]
        if "hidden-place" not in path:
            assert "hidden-place" not in report["message"], report
    assert (world / "hidden-place" / "secret.txt").read_text() == "TOP SECRET"
