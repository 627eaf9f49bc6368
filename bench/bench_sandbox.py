"""Sandbox costs, side by side in one run.

1. Loading a Python component: from the native-code cache vs JIT compiling it.
2. Instantiate + call for ``echo`` (a fresh store and instance per call).
3. A call's cost against the same skill function called as plain Python.

Run: ``python bench/bench_sandbox.py`` (builds ``skills/echo`` first, cached).
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _util import row, timings

from skilld.package.build import build_component, default_cache_dir
from skilld.registry import NullChannel
from skilld.sandbox import CallContext, Sandbox
from skilld.sandbox._native import compile_component
from skilld.types import Limits

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    """Print the three comparisons as Markdown tables."""
    wasm_path = build_component(ROOT / "skills" / "echo", cache_dir=default_cache_dir())
    wasm = wasm_path.read_bytes()
    print(f"echo component: {len(wasm) / 1e6:.1f} MB")
    with tempfile.TemporaryDirectory() as tmp, Sandbox(Path(tmp)) as sb:
        compile_t = timings(lambda: compile_component(sb.engine, wasm, name="echo"), n=3, warmup=0)
        sb.load(wasm, name="echo")  # fills the cache
        cached_t = timings(lambda: sb.load(wasm, name="echo"), n=20)
        print("\n## Loading a Python component (ms)\n\n| path | median | p99 |\n|---|---|---|")
        print(row("JIT compile", compile_t))
        print(row("native-code cache (digest checked)", cached_t))
        ratio = statistics.median(compile_t) / statistics.median(cached_t)
        print(f"\nratio compile / cached: {ratio:.0f}x")

        comp = sb.load(wasm, name="echo")
        ctx = CallContext("echo", Limits(), NullChannel())
        args = json.dumps({"text": "hello"})
        call_t = timings(lambda: comp.call("echo", args, ctx), n=300, warmup=10)

        spec = importlib.util.spec_from_file_location(
            "echo_skill", ROOT / "skills" / "echo" / "skill.py"
        )
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        sys.modules["echo_skill"] = mod
        spec.loader.exec_module(mod)
        plain_t = timings(lambda: mod.skill.call("echo", args), n=3000, warmup=100)
        print("\n## One call of echo (ms)\n\n| path | median | p99 |\n|---|---|---|")
        print(row("sandbox: new store + instance + call", call_t))
        print(row("plain Python: same SDK method in-process", plain_t))
        ratio = statistics.median(call_t) / statistics.median(plain_t)
        print(f"\nratio sandboxed / plain: {ratio:.0f}x")


if __name__ == "__main__":
    main()
