"""Permission check latency against tables with 1,000 rules (mixed fs/http/tcp/shell).

Run: python bench/bench_checks.py [--iterations N]
Prints p50 and p99 per check in microseconds; the target is p50 <= 5 µs.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from skilld.permissions import SkillPermissions
from skilld.policy import compile_policies
from skilld.types import Decision

RULES_PER_KIND = 250  # x4 kinds = 1,000 rules


def policy_text(n: int) -> str:
    """A policy with ``n`` rules of each kind: fs trees and globs, URLs, host:port, programs."""
    lines = ["fs:"]
    for i in range(n):
        if i % 2:
            lines.append(f"  - path: /srv/tenant{i}/data\n    mode: rw")
        else:
            lines.append(f"  - path: /srv/tenant{i}/**/*.json")
    lines.append("http:")
    for i in range(n):
        host = f"*.svc{i}.example.com" if i % 2 else f"api{i}.example.com"
        lines.append(f"  - url: https://{host}/v{i % 7}/\n    methods: [GET, POST]")
    lines.append("tcp:")
    for i in range(n):
        host = f"10.{i // 256}.{i % 256}.0/24" if i % 2 else f"db{i}.internal"
        lines.append(f"  - host: '{host}'\n    ports: '{5000 + i}-{5010 + i}'")
    lines.append("shell:")
    for i in range(n):
        lines.append(f"  - program: /usr/bin/tool{i}\n    args: [run, '--id=*', '**']")
    return "\n".join(lines) + "\n"


def measure(fn: Callable[[], Decision], iterations: int) -> tuple[float, float]:
    """(p50, p99) in microseconds of ``fn`` over ``iterations`` timed calls."""
    for _ in range(min(1000, iterations)):
        fn()
    samples = []
    clock = time.perf_counter_ns
    for _ in range(iterations):
        t0 = clock()
        fn()
        samples.append(clock() - t0)
    samples.sort()
    return statistics.median(samples) / 1000, samples[int(0.99 * len(samples))] / 1000


def main() -> int:
    """Build the tables, time each check, print a table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "bench.yaml").write_text(policy_text(RULES_PER_KIND))
        t0 = time.perf_counter()
        tables = compile_policies(tmp).tables
        compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    c = SkillPermissions.from_tables(tables, "bench")
    load_s = time.perf_counter() - t0
    rules = sum(len(tables.skill("bench")[k]) for k in ("fs", "http", "tcp", "shell"))

    checks: list[tuple[str, Callable[[], Decision], bool]] = [
        ("fs read, tree hit", lambda: c.check("fs", "read", "/srv/tenant201/data/a/b/c.txt"), True),
        ("fs read, glob hit", lambda: c.check_path("/srv/tenant200/x/y/z.json", write=False), True),
        ("fs read, miss", lambda: c.check("fs", "read", "/etc/shadow"), False),
        (
            "http GET, host hit",
            lambda: c.check("http", "GET", "https://api200.example.com/v4/items?q=1"),
            True,
        ),
        ("http GET, suffix hit", lambda: c.check_url("https://a.svc201.example.com/v5/x"), True),
        ("http GET, miss", lambda: c.check("http", "GET", "https://evil.example.net/"), False),
        ("http address, public", lambda: c.check("http", "address", "93.184.216.34:443"), True),
        ("tcp connect, name hit", lambda: c.check("tcp", "connect", "db200.internal:5205"), True),
        ("tcp connect, CIDR hit", lambda: c.check_tcp("10.0.201.9", 5205), True),
        (
            "shell run, argv hit",
            lambda: c.check_argv(["/usr/bin/tool200", "run", "--id=7", "x"]),
            True,
        ),
        (
            "shell run, string form",
            lambda: c.check("shell", "run", "/usr/bin/tool200 run --id=7"),
            True,
        ),
    ]
    print(
        f"python {platform.python_version()} on {platform.machine()}, {rules} rules, "
        f"compile {compile_s * 1000:.0f} ms, load {load_s * 1000:.1f} ms, "
        f"{args.iterations} iterations per check"
    )
    print("| check | p50 µs | p99 µs |")
    print("|---|---|---|")
    worst = 0.0
    for name, fn, expect in checks:
        if fn().allowed != expect:
            print(f"unexpected decision for {name}: {fn()}", file=sys.stderr)
            return 1
        p50, p99 = measure(fn, args.iterations)
        worst = max(worst, p50)
        print(f"| {name} | {p50:.2f} | {p99:.2f} |")
    print(f"worst p50: {worst:.2f} µs (target 5 µs): {'ok' if worst <= 5 else 'OVER'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
