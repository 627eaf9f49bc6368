"""delegate's fixtures: the demo bundle (kits notes and text) opened as a node."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from skilld.bundle import BuildResult
from skilld.delegate import DelegateService
from skilld.registry import Registry
from support.delegate import AuditFile, opened, service_of


@pytest.fixture(scope="session")
def kits_registry(
    demo_bundle: BuildResult, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Registry, AuditFile]]:
    """The demo bundle served in-process (templates and rules only), and its audit records."""
    state = tmp_path_factory.mktemp("state")
    with opened(demo_bundle.out, state) as node:
        yield node.registry, AuditFile(state / "audit.jsonl")


@pytest.fixture(scope="session")
def service(kits_registry: tuple[Registry, AuditFile]) -> DelegateService:
    """The delegate service of the demo bundle."""
    return service_of(kits_registry[0])
