"""Sandbox costs, side by side in one run.

1. Loading a Python component: from the native-code cache vs JIT compiling it, and
   the sha256 of the native file alone (the share of a cached load spent checking it).
2. One call of ``echo``: instantiating alone; a call in a new store and instance; a
   call on a pre-warmed instance (``Component.prewarm``, its worker given time to warm
   between calls), both under ``instances: fresh``; a call on the caller's warm instance
   (the default: it served the same caller's previous call); the same SDK method called
   as plain Python.
3. The host side of ``fs.read`` under a compiled policy: before (the path made canonical
   with ``realpath``, checked, then walked from ``/`` with ``O_NOFOLLOW``; kept here
   only) and after (folded, checked, resolved beneath the grant's root with ``openat2``,
   and with the component walk used where ``openat2`` is missing).
4. A command: ``shell.run`` of ``/bin/true`` (confined by ``skilld.confine``: a fork of
   the long-lived launcher, the skill's uid, Landlock, seccomp, rlimits, the subreaper)
   against an unconfined ``subprocess.run`` of it; the target (issue 19) is a confined
   ``/bin/true`` within 5 ms median.

Run: ``python bench/bench_sandbox.py [--scale F]`` (builds ``skills/echo`` first,
cached; ``--scale 0.1`` runs a tenth of the iterations, to check the bench works).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _util import row, timings

from skilld import confine
from skilld.digest import sha256_fd
from skilld.package.build import build_component
from skilld.paths import cache_dir
from skilld.permissions import SkillPermissions
from skilld.policy import compile_policies
from skilld.registry import NullChannel
from skilld.sandbox import CallContext, Component, Sandbox
from skilld.sandbox._native import compile_component
from skilld.sandbox.abi import decide, shell
from skilld.sandbox.abi import fs as fs_abi
from skilld.types import Decision, Limits

ROOT = Path(__file__).resolve().parent.parent


def settle(pool: ThreadPoolExecutor) -> None:
    """Return once every task submitted to ``pool`` so far has finished."""
    # Its queue is first in, first out, so its workers can all meet at the barrier
    # only after each has finished what it took before.
    workers = pool._max_workers  # no public "wait until idle" on an executor
    barrier = threading.Barrier(workers + 1, timeout=60)
    for _ in range(workers):
        pool.submit(barrier.wait)
    barrier.wait()


def settled_timings(
    fn: Callable[[], object], pool: ThreadPoolExecutor, *, n: int, warmup: int
) -> list[float]:
    """Seconds per run of ``fn``, with ``pool``'s background work finished before each."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        settle(pool)
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def hash_native(path: Path) -> str:
    """The sha256 of a native file, read the way a cached load reads it."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return sha256_fd(fd)
    finally:
        os.close(fd)


def instantiate(comp: Component, limits: Limits) -> None:
    """A new store and instance of ``comp``, no call, then freed."""
    # Private: instantiating alone has no public entry point; it is what every
    # call without a pre-warmed instance pays before the guest runs.
    ticker = comp.sandbox.engine.ticker
    ticker.enter()
    try:
        inst = comp._fresh(limits.memory_bytes)
    finally:
        ticker.leave()
    inst.store.close()


def old_read(ctx: CallContext, path: str) -> bytes:
    """``fs.read`` as it was before descriptors only (check by canonical path, then walk)."""
    canon = os.path.realpath(path)
    # Asked typed, as every fs host call asks: the compiled checker refuses an fs question
    # put to its plain ``check`` (this crashed the bench before its command rows).
    decide(ctx, "fs", "read", canon, question=lambda checker: checker.check_path(canon))
    parts = [p for p in canon.split("/") if p]
    dfd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            nxt = os.open(
                part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd
            )
            os.close(dfd)
            dfd = nxt
        fd = os.open(
            parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dfd
        )
    finally:
        os.close(dfd)
    try:
        os.fstat(fd)
        return os.read(fd, 1 << 20)
    finally:
        os.close(fd)


def fs_read_section(n: int) -> None:
    """Print the host side of fs.read before and after, side by side."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(os.path.realpath(tmp))
        (root / "policies").mkdir()
        grant = root / "data" / "notes"
        (grant / "2026" / "11").mkdir(parents=True)
        target = grant / "2026" / "11" / "today.md"
        target.write_text("x" * 4096)
        (root / "policies" / "bench.yaml").write_text(f"fs:\n  - path: {grant}\n")
        result = compile_policies(root / "policies", {"bench": None})
        checker = SkillPermissions.from_tables(result.tables, "bench")
        ctx = CallContext("bench", Limits(), NullChannel(), checker=checker)
        path = str(target)

        def new_read() -> None:
            ctx.decisions.clear()
            fs_abi.read(ctx, path)

        def before() -> None:
            ctx.decisions.clear()
            old_read(ctx, path)

        assert old_read(ctx, path) == fs_abi.read(ctx, path)
        before_t = timings(before, n=n, warmup=100)
        after_t = timings(new_read, n=n, warmup=100)
        saved = fs_abi.USE_OPENAT2
        fs_abi.USE_OPENAT2 = False
        try:
            walk_t = timings(new_read, n=n, warmup=100)
        finally:
            fs_abi.USE_OPENAT2 = saved
        depth = len(target.parts) - 1
        print(f"\n## fs.read, host side, 4 KiB file {depth} directories deep (ms)\n")
        print("| path | median | p99 |\n|---|---|---|")
        print(row("before: realpath, check, walk from / with O_NOFOLLOW", before_t))
        print(row("after: fold, check, openat2 beneath the grant's root", after_t))
        print(row("after, no openat2: fold, check, component walk", walk_t))
        ratio = statistics.median(after_t) / statistics.median(before_t)
        print(f"\nratio after / before: {ratio:.2f}x (openat2: {fs_abi.USE_OPENAT2})")


def main() -> None:
    """Print the comparisons as Markdown tables."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scale", type=float, default=1.0, help="iteration count factor")
    parser.add_argument(
        "--quick", action="store_true", help="a few iterations: that it runs (CI; no targets)"
    )
    args = parser.parse_args()
    if args.quick:
        args.scale = 0.01

    def n(count: int) -> int:
        return max(1, round(count * args.scale))

    wasm_path = build_component(ROOT / "skills" / "echo", cache_dir=cache_dir())
    wasm = wasm_path.read_bytes()
    print(f"echo component: {len(wasm) / 1e6:.1f} MB")
    # A fresh native-code cache, so the first load compiles; --quick uses the shared one.
    with (
        tempfile.TemporaryDirectory() as tmp,
        Sandbox(cache_dir() if args.quick else Path(tmp)) as sb,
    ):
        # A JIT compile takes seconds (minutes on a busy machine): --quick leaves it out.
        compile_t = (
            [math.nan]
            if args.quick
            else timings(lambda: compile_component(sb.engine, wasm, name="echo"), n=n(3), warmup=0)
        )
        sb.load(wasm, name="echo")  # fills the cache
        cached_t = timings(lambda: sb.load(wasm, name="echo"), n=n(20))
        assert sb.cache is not None
        native = sb.cache.root / f"{hashlib.sha256(wasm).hexdigest()}.cwasm"
        sha_t = timings(lambda: hash_native(native), n=n(20))
        size_mb = native.stat().st_size / 1e6
        print("\n## Loading a Python component (ms)\n\n| path | median | p99 |\n|---|---|---|")
        print(row("JIT compile", compile_t))
        print(row("native-code cache (digest checked)", cached_t))
        print(row(f"sha256 of the native file alone ({size_mb:.0f} MB)", sha_t))
        ratio = statistics.median(compile_t) / statistics.median(cached_t)
        share = statistics.median(sha_t) / statistics.median(cached_t)
        print(f"\nratio compile / cached: {ratio:.0f}x; sha256 share of a cached load: {share:.0%}")

        limits = Limits(instance_calls=1)  # instances: fresh
        ctx = CallContext("echo", limits, NullChannel())
        args_json = json.dumps({"text": "hello"})
        comp = sb.load(wasm, name="echo")
        inst_t = settled_timings(
            lambda: instantiate(comp, limits), sb.background, n=n(100), warmup=5
        )
        call_t = settled_timings(
            lambda: comp.call("echo", args_json, ctx), sb.background, n=n(300), warmup=10
        )
        warm = sb.load(wasm, name="echo")
        warm.prewarm(limits)
        warm_t = settled_timings(
            lambda: warm.call("echo", args_json, ctx), sb.background, n=n(300), warmup=10
        )
        reused = sb.load(wasm, name="echo")
        reuse_ctx = CallContext("echo", Limits(), NullChannel())
        reuse_t = settled_timings(
            lambda: reused.call("echo", args_json, reuse_ctx), sb.background, n=n(300), warmup=10
        )

        spec = importlib.util.spec_from_file_location(
            "echo_skill", ROOT / "skills" / "echo" / "skill.py"
        )
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        sys.modules["echo_skill"] = mod
        spec.loader.exec_module(mod)
        plain_t = timings(lambda: mod.skill.call("echo", args_json), n=n(3000), warmup=100)
        print("\n## One call of echo (ms)\n\n| path | median | p99 |\n|---|---|---|")
        print(row("instantiate only: new store + instance, no call", inst_t))
        print(row("sandbox: new store + instance + call", call_t))
        print(row("sandbox: call on a pre-warmed instance", warm_t))
        print(row("sandbox: call on the caller's warm instance (reused)", reuse_t))
        print(row("plain Python: same SDK method in-process", plain_t))
        ratio = statistics.median(call_t) / statistics.median(plain_t)
        print(f"\nratio sandboxed / plain: {ratio:.0f}x")
    fs_read_section(n(20_000))
    bench_commands(n)


class _AllowAll:
    """A checker that allows everything: the bench measures the runner, not the tables."""

    def check(self, capability: str, action: str, target: str) -> Decision:
        return Decision(True, capability, action, target, "bench", "bench")

    def check_argv(self, argv: Sequence[str], cwd: str | None = None) -> Decision:
        return Decision(True, "shell", "run", " ".join(argv), "bench", "bench")


# Issue 19's target for a confined /bin/true, median.
TARGET_MS = 5.0


def bench_commands(n: Callable[[int], int]) -> None:
    """Print a confined ``shell.run`` of /bin/true beside an unconfined subprocess.run."""
    ctx = CallContext("bench", Limits(), NullChannel(), checker=_AllowAll())
    shell_t = timings(lambda: shell.run(ctx, {"argv": ["/bin/true"]}), n=n(40))
    runner_t = timings(
        lambda: confine.run(
            ["/bin/true"], confinement=confine.Confinement(), deadline=time.monotonic() + 10
        ),
        n=n(40),
    )
    plain_t = timings(lambda: subprocess.run(["/bin/true"], check=True), n=n(200))
    print("\n## A command: /bin/true (ms)\n\n| path | median | p99 |\n|---|---|---|")
    print(row("shell.run, confined (check + launcher fork + uid + Landlock + seccomp)", shell_t))
    print(row("skilld.confine.run alone", runner_t))
    print(row("subprocess.run, unconfined", plain_t))
    print(f"\nprofile: {confine.profile().describe()}")
    median = statistics.median(runner_t) * 1e3
    verdict = "met" if median <= TARGET_MS else "NOT met"
    print(f"target: confined /bin/true <= {TARGET_MS} ms median: {median:.2f} ms, {verdict}")
    ratio = statistics.median(shell_t) / statistics.median(plain_t)
    print(f"ratio confined shell.run / unconfined subprocess.run: {ratio:.1f}x")


if __name__ == "__main__":
    main()
