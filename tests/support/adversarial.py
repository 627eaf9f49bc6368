"""Helpers of the adversarial suite: compile a policy, call the prober, check its report."""

from __future__ import annotations

import http.server
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skilld.permissions import SkillPermissions
from skilld.policy import Tables, compile_policies
from skilld.registry import NullChannel
from skilld.sandbox import CallContext, Component
from skilld.types import ClientChannel, Decision, KeyValueStore


def compile_dir(directory: Path, policies: Mapping[str, str]) -> Tables:
    """Write ``{skill_id: yaml}`` as ``<skill_id>.yaml`` into ``directory`` and compile it."""
    directory.mkdir(parents=True, exist_ok=True)
    for skill_id, text in policies.items():
        (directory / f"{skill_id}.yaml").write_text(text)
    result = compile_policies(directory, dict.fromkeys(policies))
    assert not result.problems, result.problems
    return result.tables


@dataclass
class Outcome:
    """What one prober call reported, and the decisions the host took for it."""

    report: dict[str, Any]
    decisions: list[Decision] = field(default_factory=list)

    @property
    def error(self) -> str | None:
        """The error code, or None when the call succeeded."""
        value = self.report.get("error")
        return None if value is None else str(value)


@dataclass
class Probe:
    """Calls the prober under one skill's compiled tables."""

    component: Component
    tables: Tables
    skill_id: str = "prober"
    kv: KeyValueStore | None = None
    channel: ClientChannel = field(default_factory=NullChannel)

    def __call__(self, prober_method: str, /, **args: Any) -> Outcome:
        """Run ``prober_method`` with ``args``; return the report and the decisions."""
        checker = SkillPermissions.from_tables(self.tables, self.skill_id)
        ctx = CallContext(self.skill_id, checker.limits, self.channel, kv=self.kv, checker=checker)
        value = self.component.call(prober_method, json.dumps(args), ctx).value
        assert isinstance(value, dict), value
        assert not ctx.host_faults, ctx.host_faults
        return Outcome(value, list(ctx.decisions))


def assert_outcome(out: Outcome, expected: tuple[Any, ...]) -> None:
    """Check a report against ``("ok", value)``, ``("ok", callable)``,
    ``("deny", rule, fragment)`` or ``("error", code, fragment)``."""
    kind = expected[0]
    if kind == "ok":
        assert "ok" in out.report, out.report
        want = expected[1]
        if callable(want):
            assert want(out.report["ok"]), out.report
        else:
            assert out.report["ok"] == want, out.report
    elif kind == "deny":
        _, rule, fragment = expected
        assert out.report.get("error") == "not-permitted", out.report
        assert out.report["rule"] == rule, out.report
        assert fragment in out.report["message"], out.report
    else:
        _, code, fragment = expected
        assert out.report.get("error") == code, out.report
        assert fragment in out.report["message"], out.report


class WebHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        if "/redirect" in self.path:
            target = self.path.split("to=", 1)[1]
            self.send_response(302)
            self.send_header("Location", target)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if "/big" in self.path:
            body = b"x" * 5000
        else:
            length = int(self.headers.get("Content-Length") or 0)
            sent = self.rfile.read(length) if length else b""
            body = f"{self.command} {self.path} {sent.decode()}".strip().encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _answer

    def log_message(self, *args: Any) -> None:
        pass


def case_ids(cases: Sequence[tuple[Any, ...]]) -> list[str]:
    """Readable ids: the first element of each case."""
    return [str(c[0]) for c in cases]


def fill(value: Any, root: str) -> Any:
    """``value`` with every ``{R}`` in its strings replaced by ``root``."""
    if isinstance(value, str):
        return value.replace("{R}", root)
    if isinstance(value, list):
        return [fill(v, root) for v in value]
    if isinstance(value, tuple):
        return tuple(fill(v, root) for v in value)
    if isinstance(value, dict):
        return {k: fill(v, root) for k, v in value.items()}
    return value
