"""Where a Python call's time goes: one instance's life, phase by phase.

For each of ``--calls`` rounds, on one thread, with the epoch ticker running as in a call:

- ``instantiate``: a store and an instance from the engine's pooling allocator
  (the guest's start code included: relocations, constructors, table set-up);
- ``warm-up``: the host's warm-up call (``call`` of the method "", which the guest
  answers "not found"), as the background worker runs it before a call takes the
  instance;
- ``first call``: the first real call on that instance (``echo``), what a client waits for;
- ``second call``: another call on the same instance: what a call would cost if an
  instance were reused (skilld never does: the number is the floor that reuse would reach);
- ``free``: closing the store, which hands the slot back to the pool (its memory reset).

``--keep-resident MIB`` and ``--warm-slots N`` override the pooling allocator's settings
(``skilld.sandbox._engine``) for this process only; ``--wasm FILE`` measures another build
of the component (compiled in memory, not cached). Run from ``bench/``::

    python bench_instance.py --calls 300
    python bench_instance.py --calls 300 --keep-resident 16
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
from pathlib import Path

from skilld.call import CallContext, entered
from skilld.registry import NullChannel
from skilld.sandbox import Component, Sandbox, _engine
from skilld.sandbox._sandbox import _free
from skilld.types import Limits

PHASES = ("instantiate", "warm-up", "first call", "second call", "free")


def _load(sandbox: Sandbox, wasm: Path | None) -> Component:
    if wasm is not None:
        return sandbox.load(wasm.read_bytes(), name="echo")
    from skilld.package.build import build_component

    root = Path(__file__).resolve().parent.parent
    cache = Path(os.environ.get("SKILLD_CACHE") or root / ".cache" / "skilld")
    return sandbox.load(
        build_component(root / "skills" / "echo", cache_dir=cache).read_bytes(), name="echo"
    )


def measure(comp: Component, calls: int) -> tuple[dict[str, list[float]], list[float]]:
    """Per-phase seconds of ``calls`` instance lives, and the process CPU seconds of each."""
    engine = comp.sandbox.engine
    limits = Limits()
    found = comp._exports.call
    phases: dict[str, list[float]] = {p: [] for p in PHASES}
    cpu: list[float] = []
    for i in range(calls):
        c0 = time.process_time()
        t0 = time.perf_counter()
        engine.ticker.enter()
        try:
            inst = comp._fresh(limits.memory_bytes)
            t1 = time.perf_counter()
            func = inst.instance.get_func(inst.store, found)
            assert func is not None
            marks = [t1]
            for method, args in (
                ("", "{}"),
                ("echo", json.dumps({"text": f"a{i}"})),
                ("echo", json.dumps({"text": f"b{i}"})),
            ):
                ctx = CallContext("echo", limits, NullChannel())
                inst.streams.ctx = ctx
                inst.interrupt.arm(inst.store, ctx, 10.0)
                with entered(ctx):
                    func(inst.store, method, args)
                    func.post_return(inst.store)
                marks.append(time.perf_counter())
        finally:
            engine.ticker.leave()
        _free(inst)
        t5 = time.perf_counter()
        cpu.append(time.process_time() - c0)
        for phase, (a, b) in zip(PHASES, zip([t0, *marks], [*marks, t5], strict=True), strict=True):
            phases[phase].append(b - a)
    return phases, cpu


def main() -> None:
    """Parse the options, measure, print one table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--keep-resident", type=int, help="MiB of linear memory kept resident")
    parser.add_argument("--warm-slots", type=int, help="unused warm slots the pool keeps")
    parser.add_argument("--wasm", type=Path, help="another build of the echo component")
    parser.add_argument(
        "--quick", action="store_true", help="a few iterations: that it runs (CI; no targets)"
    )
    args = parser.parse_args()
    if args.quick:
        args.calls = 20
    if args.keep_resident is not None:
        _engine._POOL_KEEP_RESIDENT = args.keep_resident << 20
    if args.warm_slots is not None:
        _engine._POOL_WARM_SLOTS = args.warm_slots
    with Sandbox(None if args.wasm else _cache()) as sandbox:
        comp = _load(sandbox, args.wasm)
        measure(comp, 10)  # the first instances of a slot pay its mapping: not counted
        phases, cpu = measure(comp, args.calls)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    load = os.getloadavg()
    print(
        f"echo (CPython guest), {args.calls} instance lives; keep-resident "
        f"{_engine._POOL_KEEP_RESIDENT >> 20} MiB, warm slots {_engine._POOL_WARM_SLOTS}; "
        f"load average {load[0]:.1f}; peak RSS {peak:.0f} MiB\n"
    )
    print("| phase | median us | min us |\n|---|---|---|")
    for phase, values in phases.items():
        print(f"| {phase} | {statistics.median(values) * 1e6:.0f} | {min(values) * 1e6:.0f} |")
    print(f"| process CPU per life | {statistics.median(cpu) * 1e6:.0f} | {min(cpu) * 1e6:.0f} |")


def _cache() -> Path:
    root = Path(__file__).resolve().parent.parent
    return Path(os.environ.get("SKILLD_CACHE") or root / ".cache" / "skilld")


if __name__ == "__main__":
    main()
