"""The MCP layer's tests run on asyncio (uvicorn needs it); the wasm conformance skill."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from skilld.audit import MemorySink
from skilld.permissions import SkillPermissions
from skilld.policy import compile_policies
from skilld.registry import NullChannel, Registry, SkillEntry
from skilld.sandbox import CallContext, Sandbox
from support.env import ROOT


@pytest.fixture
def anyio_backend() -> str:
    """Every async test here runs on asyncio."""
    return "asyncio"


@pytest.fixture
def conformance(
    sandbox: Sandbox, component_path: Callable[[str], Path], tmp_path: Path
) -> tuple[Registry, MemorySink]:
    """The conformance skill under its policy (sample and elicit granted), auditing to memory."""
    policy = (ROOT / "tests" / "policies" / "conformance.yaml").read_text()
    assert "wall_time: 120s" in policy  # shortened below, for the deadline test
    (tmp_path / "conformance.yaml").write_text(policy.replace("wall_time: 120s", "wall_time: 5s"))
    compiled = compile_policies(tmp_path, {"conformance": None})
    assert not compiled.problems, compiled.problems
    checker = SkillPermissions.from_tables(compiled.tables, "conformance")
    comp = sandbox.load(component_path("conformance").read_bytes(), name="conformance")
    spec = comp.describe(CallContext("conformance", checker.limits, NullChannel()))
    sink = MemorySink()
    registry = Registry(audit=sink)
    registry.add(
        SkillEntry(
            spec=dataclasses.replace(spec, id="conformance"),
            component=comp,
            limits=checker.limits,
            checker=checker,
        )
    )
    registry.mark_ready()
    return registry, sink


@pytest.fixture
def conformance_exposed(
    sandbox: Sandbox, component_path: Callable[[str], Path], tmp_path: Path
) -> tuple[Registry, MemorySink]:
    """The conformance skill with its policy's whole exposure (names and ``mcp.tasks``)."""
    (tmp_path / "conformance.yaml").write_text(
        (ROOT / "tests" / "policies" / "conformance.yaml").read_text()
    )
    compiled = compile_policies(tmp_path, {"conformance": None})
    checker = SkillPermissions.from_tables(compiled.tables, "conformance")
    comp = sandbox.load(component_path("conformance").read_bytes(), name="conformance")
    spec = comp.describe(CallContext("conformance", checker.limits, NullChannel()))
    sink = MemorySink()
    registry = Registry(audit=sink)
    registry.add(
        SkillEntry(
            spec=dataclasses.replace(spec, id="conformance"),
            component=comp,
            limits=checker.limits,
            checker=checker,
            exposure=checker.exposure,
        )
    )
    registry.mark_ready()
    return registry, sink
