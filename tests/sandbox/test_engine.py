"""The engine: pooled instances where the address space allows, on demand where it does not."""

from __future__ import annotations

import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from support.env import cache_env

Loader = Callable[[str], Path]

CALL_ECHO = """
import json, sys
from pathlib import Path
from skilld.registry import NullChannel
from skilld.sandbox import CallContext, Sandbox
from skilld.types import Limits

with Sandbox(Path(sys.argv[2])) as sandbox:
    echo = sandbox.load(Path(sys.argv[1]).read_bytes(), name="echo")
    ctx = CallContext("echo", Limits(memory_bytes=64 << 20), NullChannel())
    print(sandbox.engine.pooling, echo.call("echo", json.dumps({"text": "hi"}), ctx).value)
"""


def _limit_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))


def test_limited_address_space_falls_back_to_on_demand(component_path: Loader) -> None:
    """Under ulimit -v the engine allocates on demand (the pool could not be mapped), says so,
    and calls still work; without the limit it pools."""
    wasm = component_path("echo")
    cache = cache_env()["SKILLD_CACHE"]
    argv = [sys.executable, "-c", CALL_ECHO, str(wasm), cache]
    limited = subprocess.run(
        argv, capture_output=True, text=True, timeout=120, preexec_fn=_limit_address_space
    )
    assert limited.returncode == 0, limited.stderr
    assert limited.stdout.split() == ["False", "hi"]
    assert "address space is limited (ulimit -v)" in limited.stderr
    free = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    assert free.stdout.split() == ["True", "hi"]
