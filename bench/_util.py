"""Small helpers for the benchmarks: timing loops and a table printer."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def timings(fn: Callable[[], object], *, n: int, warmup: int = 3) -> list[float]:
    """Seconds per run of ``fn``, ``n`` runs after ``warmup``."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def row(name: str, values: list[float]) -> str:
    """One table row in milliseconds: median, p99."""
    return f"| {name} | {statistics.median(values) * 1e3:.3f} | {pct(values, 0.99) * 1e3:.3f} |"
