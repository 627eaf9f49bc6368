"""Dispatchers over the real demo bundle, for the benchmarks' ``--dispatcher`` option."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any


def prepare() -> None:
    """Build the demo bundle now (progress on stderr), so no benchmark times a build.

    ``bench_mcp.py`` calls a dispatcher module's ``prepare`` before it starts servers: with
    a cold cache the build takes minutes, far longer than a server is given to start.
    """
    from skilld.node import demo_bundle

    demo_bundle()


def echo_registry() -> Any:
    """The demo bundle's registry (wasm skills, policy checks, audit to a temp file)."""
    from skilld.node import Node, NodeConfig, demo_bundle

    state = Path(tempfile.mkdtemp(prefix="skilld-bench-"))
    # The node lives as long as the benchmark process: its registry is all a bench uses.
    return Node.open(NodeConfig(bundle=demo_bundle(), state_dir=state)).registry


def echo_registry_cold() -> Any:
    """As :func:`echo_registry`, but every call instantiates (no pre-warmed instances)."""
    registry = echo_registry()
    for entry in registry.skills():
        entry.component._pool_limits = None
    return registry


def echo_registry_fresh() -> Any:
    """As :func:`echo_registry`, every skill under ``instances: fresh`` (an instance per call)."""
    registry = echo_registry()
    for entry in registry.skills():
        entry.limits = replace(entry.limits, instance_calls=1)
    return registry


# The issuer bench_mcp's jwt side trusts (its JWTs' ``iss``).
BENCH_ISSUER = "https://issuer.bench.invalid"


def bench_callers() -> Any:
    """A caller policy letting the bench issuer's subjects call every skill, for a server
    with authentication on: there a caller no rule names gets nothing (docs/policy.md,
    Callers), and the rule's check is part of what a JWT caller costs."""
    from skilld.permissions import CallerPolicy
    from skilld.policy import compile_documents, load_yaml

    text = f"rules:\n  - id: bench\n    who: [{{issuer: '{BENCH_ISSUER}'}}]\n    skills: ['*']\n"
    callers = {"bench.yaml": ("bench/callers/bench.yaml", load_yaml(text, "bench.yaml"))}
    return CallerPolicy.from_tables(compile_documents({}, callers=callers).tables)
