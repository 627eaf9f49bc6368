"""Helpers for delegate's tests: a bundle opened as a node, the service behind it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from skilld.delegate import SKILL_ID, DelegateBackend, DelegateService, InferenceConfig
from skilld.node import Node, NodeConfig
from skilld.registry import Registry


class AuditFile:
    """The audit records a node wrote so far (its JSON lines file, read on each look)."""

    def __init__(self, path: Path):
        self.path = path

    @property
    def records(self) -> list[dict[str, Any]]:
        """Every record, in order."""
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line]


def opened(bundle: Path, state: Path, config: InferenceConfig | None = None) -> Node:
    """A node of ``bundle`` with state (and audit) in ``state``, its kits' tiers from ``config``."""
    return Node.open(
        NodeConfig(bundle=bundle, state_dir=state, delegate=config or InferenceConfig())
    )


def service_of(registry: Registry) -> DelegateService:
    """The delegate service behind a registry's ``delegate`` skill."""
    entry = next(e for e in registry.skills() if e.spec.id == SKILL_ID)
    assert isinstance(entry.component, DelegateBackend)
    return entry.component.service
