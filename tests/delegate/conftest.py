"""delegate's fixtures: the demo bundle (kits notes and text) loaded into a registry."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from delegate_util import loaded, service_of

from skilld.audit import MemorySink
from skilld.bundle import BuildResult
from skilld.delegate import DelegateService
from skilld.registry import Registry


@pytest.fixture(scope="session")
def kits_registry(
    demo_bundle: BuildResult, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Registry, MemorySink]]:
    """The demo bundle served in-process (templates and rules only), auditing to memory."""
    registry, sandbox, sink = loaded(demo_bundle.out, tmp_path_factory.mktemp("state"))
    yield registry, sink
    sandbox.close()


@pytest.fixture(scope="session")
def service(kits_registry: tuple[Registry, MemorySink]) -> DelegateService:
    """The delegate service of the demo bundle."""
    return service_of(kits_registry[0])
