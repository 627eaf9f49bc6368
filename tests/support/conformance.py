"""The wasm conformance skill in a registry of its own, under its test policy as a test edits it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from skilld.audit import MemorySink
from skilld.permissions import SkillPermissions
from skilld.policy import compile_policies
from skilld.registry import NullChannel, Registry, SkillEntry
from skilld.sandbox import CallContext, Sandbox
from support.env import ROOT


def conformance_registry(
    sandbox: Sandbox,
    component: Path,
    policy_dir: Path,
    *,
    replacing: Mapping[str, str] | None = None,
    exposed: bool = False,
) -> tuple[Registry, MemorySink]:
    """A ready registry holding the conformance skill (``component``), auditing to memory.

    Its policy is ``tests/policies/conformance.yaml`` with each ``replacing`` key (which
    must be there) replaced by its value, compiled in ``policy_dir``; ``exposed``: with the
    policy's exposure (tool names and ``mcp.tasks``).
    """
    policy = (ROOT / "tests" / "policies" / "conformance.yaml").read_text()
    for old, new in (replacing or {}).items():
        assert old in policy, f"tests/policies/conformance.yaml no longer says {old!r}"
        policy = policy.replace(old, new)
    (policy_dir / "conformance.yaml").write_text(policy)
    compiled = compile_policies(policy_dir, {"conformance": None})
    assert not compiled.problems, compiled.problems
    checker = SkillPermissions.from_tables(compiled.tables, "conformance")
    comp = sandbox.load(component.read_bytes(), name="conformance")
    spec = comp.describe(CallContext("conformance", checker.limits, NullChannel()))
    sink = MemorySink()
    registry = Registry(audit=sink)
    registry.add(
        SkillEntry(
            spec=dataclasses.replace(spec, id="conformance"),
            component=comp,
            limits=checker.limits,
            checker=checker,
            **({"exposure": checker.exposure} if exposed else {}),
        )
    )
    registry.mark_ready()
    return registry, sink
