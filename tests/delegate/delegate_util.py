"""Helpers for delegate's tests: a bundle loaded into a registry, the service behind it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from skilld.audit import MemorySink
from skilld.cli._serve import load_registry
from skilld.delegate import SKILL_ID, DelegateBackend, DelegateService, InferenceConfig
from skilld.registry import Registry


def loaded(bundle: Path, state: Path, config: InferenceConfig | None = None) -> Any:
    """(registry, sandbox, audit sink) of ``bundle``, its kits' tiers from ``config``."""
    sink = MemorySink()
    registry, sandbox, _ = load_registry(
        bundle, state, audit=sink, delegate_config=config or InferenceConfig()
    )
    return registry, sandbox, sink


def service_of(registry: Registry) -> DelegateService:
    """The delegate service behind a registry's ``delegate`` skill."""
    entry = next(e for e in registry.skills() if e.spec.id == SKILL_ID)
    assert isinstance(entry.component, DelegateBackend)
    return entry.component.service
