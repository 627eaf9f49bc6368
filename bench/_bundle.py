"""Dispatchers over the real demo bundle, for the benchmarks' ``--dispatcher`` option."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any


def echo_registry() -> Any:
    """The demo bundle's registry (wasm skills, policy checks, audit to a temp file)."""
    from skilld.audit import JsonLinesSink
    from skilld.cli._serve import _demo_bundle, load_registry

    state = Path(tempfile.mkdtemp(prefix="skilld-bench-"))
    registry, _sandbox, _timings = load_registry(
        _demo_bundle(), state, audit=JsonLinesSink(state / "audit.jsonl")
    )
    return registry


def echo_registry_cold() -> Any:
    """As :func:`echo_registry`, but every call instantiates (no pre-warmed instances)."""
    registry = echo_registry()
    for entry in registry.skills():
        entry.component._pool_limits = None
    return registry
