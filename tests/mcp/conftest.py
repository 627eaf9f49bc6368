"""The MCP layer's tests run on asyncio (uvicorn needs it)."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    """Every async test here runs on asyncio."""
    return "asyncio"
