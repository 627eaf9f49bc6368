"""One word per outcome: for every error class a call can end with, the audit record,
``/metrics`` and the ``tool_call`` log line say the class's own ``outcome``."""

from __future__ import annotations

import contextlib
import re
from typing import Any

import pytest
import structlog

from skilld import errors
from skilld.audit import MemorySink
from skilld.call import CallContext
from skilld.errors import SkilldError
from skilld.mcp import ServeConfig
from skilld.mcp._metrics import Metrics
from skilld.mcp._server import McpService
from skilld.registry import Registry, SkillEntry
from skilld.types import CallOutput, Limits, MethodSpec, SkillSpec
from support.mcp_fakes import memory_session

pytestmark = pytest.mark.anyio

# Classes whose constructor is not ``cls(message)``.
_MAKE: dict[type[SkilldError], Any] = {
    errors.GuestError: lambda: errors.GuestError("not-found", "no such note"),
    errors.HostCallError: lambda: errors.HostCallError("io", "disk said no", rule="r1"),
    errors.SkillBusy: lambda: errors.SkillBusy("fails", 1),
    errors.PermissionDenied: lambda: errors.PermissionDenied("no grant", rule="default-deny"),
    errors.ProgramRejected: lambda: errors.ProgramRejected([(1, 1, "r", "bad")]),
    errors.ConfinementUnavailable: lambda: errors.ConfinementUnavailable("no", feature="x"),
    errors.ProgramNotStarted: lambda: errors.ProgramNotStarted("no", errno=2),
}


def _every(cls: type[SkilldError]) -> list[type[SkilldError]]:
    found = [cls]
    for sub in cls.__subclasses__():
        found += _every(sub)
    return found


ERRORS = [(_MAKE.get(c) or (lambda c=c: c("boom")))() for c in _every(SkilldError)]


class _Fails:
    """A skill whose call raises the error its arguments name."""

    def call(self, method: str, args_json: str, ctx: CallContext) -> CallOutput:
        raise self.next

    next: BaseException = RuntimeError("unset")

    def read_resource(self, uri: str, ctx: CallContext) -> list[CallOutput]:
        raise AssertionError("not served")

    def get_prompt(self, name: str, args_json: str, ctx: CallContext) -> list[dict[str, Any]]:
        raise AssertionError("not served")


def _outcomes_in(metrics: Metrics) -> dict[str, int]:
    found: dict[str, int] = {}
    for m in re.finditer(
        r'skilld_tool_calls_total\{[^}]*outcome="([^"]+)"\} (\d+)', metrics.render()
    ):
        found[m[1]] = int(m[2])
    return found


@pytest.mark.parametrize("error", [*ERRORS, RuntimeError("a bug")], ids=lambda e: type(e).__name__)
async def test_audit_metrics_and_log_say_the_same_word(error: BaseException) -> None:
    """The record, the counter's label and the log line agree, and are the class's outcome."""
    sink = MemorySink()
    registry = Registry(audit=sink)
    backend = _Fails()
    backend.next = error
    spec = SkillSpec("fails", "1.0.0", "fails", (MethodSpec("run", "run", {"type": "object"}),))
    registry.add(SkillEntry(spec=spec, component=backend, limits=Limits(timeout_ms=2000)))
    registry.mark_ready()
    lines: list[dict[str, Any]] = []

    def keep(_logger: Any, _name: str, event: dict[str, Any]) -> Any:
        lines.append(event)
        raise structlog.DropEvent

    log = structlog.wrap_logger(
        None, processors=[keep], wrapper_class=structlog.make_filtering_bound_logger(0)
    )
    metrics = Metrics()
    service = McpService(registry, ServeConfig(inline_ms=0), log, metrics)
    async with memory_session(service) as session:
        # A RegistryError is a protocol error (raised here); the ring ran all the same.
        with contextlib.suppress(Exception):
            await session.call_tool("fails/run", {})
    word = error.outcome if isinstance(error, SkilldError) else SkilldError.outcome
    (record,) = [r for r in sink.records if r.get("event") == "call"]
    (line,) = [e for e in lines if e.get("event") == "tool_call"]
    assert (record["outcome"], line["outcome"], _outcomes_in(metrics)) == (word, word, {word: 1})
