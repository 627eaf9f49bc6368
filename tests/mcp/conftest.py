"""The MCP layer's tests run on asyncio (uvicorn needs it); the wasm conformance skill."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from skilld.audit import MemorySink
from skilld.registry import Registry
from skilld.sandbox import Sandbox
from support.conformance import conformance_registry


@pytest.fixture
def anyio_backend() -> str:
    """Every async test here runs on asyncio."""
    return "asyncio"


@pytest.fixture
def conformance(
    sandbox: Sandbox, component_path: Callable[[str], Path], tmp_path: Path
) -> tuple[Registry, MemorySink]:
    """The conformance skill under its policy (sample and elicit granted), auditing to memory."""
    # the wall time shortened, for the deadline test
    return conformance_registry(
        sandbox,
        component_path("conformance"),
        tmp_path,
        replacing={"wall_time: 120s": "wall_time: 5s"},
    )


@pytest.fixture
def conformance_exposed(
    sandbox: Sandbox, component_path: Callable[[str], Path], tmp_path: Path
) -> tuple[Registry, MemorySink]:
    """The conformance skill with its policy's whole exposure (names and ``mcp.tasks``)."""
    return conformance_registry(sandbox, component_path("conformance"), tmp_path, exposed=True)
