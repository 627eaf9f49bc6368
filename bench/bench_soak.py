"""A soak: `skilld serve` under steady load for minutes, its memory sampled over time.

Starts ``skilld serve --transport http`` on the demo bundle (or ``--bundle``) in its
own process with its own state directory, then runs ``--concurrency`` callers for
``--duration`` seconds. Each caller opens a Streamable HTTP session, makes
``--session-calls`` calls cycling through a mix of tools (the Python echo, notes
add/get with a kv write, the WebAssembly-text echo), closes the session and opens
another, so per-session state is churned as real clients churn it. The server's RSS
(``/proc/PID/status``) is sampled every ``--sample`` seconds; after the load an idle
period (``--idle``) shows whether memory comes back.

Prints a table per minute (RSS at the end of the minute, calls, errors, p50/p99) and
the growth from minute 2 to the end, the figure the target is stated in::

    python bench/bench_soak.py --duration 600 --concurrency 16     # the full soak
    python bench/bench_soak.py --duration 120                      # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from _util import pct
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

# (tool, arguments) cycled by every caller; {i} is the call's number.
MIX: list[tuple[str, dict[str, str]]] = [
    ("echo/echo", {"text": "hello {i}"}),
    ("notes_add", {"title": "soak-{c}-{i}", "body": "body {i}"}),
    ("notes/get", {"title": "soak-{c}-{i}"}),
    ("echo-wat/echo", {"text": "hello {i}"}),
]


@dataclass
class Stats:
    """What the callers saw, with when they saw it (seconds since the load started)."""

    calls: list[tuple[float, float]] = field(default_factory=list)  # (at, latency)
    errors: list[tuple[float, str]] = field(default_factory=list)
    rss: list[tuple[float, float]] = field(default_factory=list)  # (at, MB)


def rss_mb(pid: int) -> float:
    """Resident set size of ``pid`` in MB (Linux)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def start_server(bundle: Path | None, state: Path) -> tuple[subprocess.Popen[str], str]:
    """``skilld serve`` on a free port; returns the process and its /mcp URL."""
    argv = [sys.executable, "-m", "skilld", "serve", "--transport", "http", "--port", "0"]
    argv += ["--state-dir", str(state), "--log-file", str(state / "serve.log")]
    if bundle is not None:
        argv += ["--bundle", str(bundle)]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    log = state / "serve.log"
    deadline = time.monotonic() + 900  # the first run may build the demo bundle
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"skilld serve exited with {proc.returncode}: {proc.stderr.read()}")
        if log.exists():
            for line in log.read_text().splitlines():
                if line.startswith("{") and json.loads(line).get("event") == "serving":
                    # Keep reading stderr so a full pipe never blocks the server.
                    threading.Thread(target=proc.stderr.read, daemon=True).start()
                    return proc, json.loads(line)["url"]
        time.sleep(0.2)  # polling a child process that is starting up
    proc.kill()
    raise SystemExit("skilld serve did not start in 15 minutes")


async def caller(url: str, c: int, end: float, t0: float, session_calls: int, stats: Stats) -> None:
    """Call the mix until ``end``, a new session every ``session_calls`` calls."""
    i = 0
    while time.monotonic() < end:
        try:
            async with (
                streamable_http_client(url) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                for _ in range(session_calls):
                    if time.monotonic() >= end:
                        break
                    tool, template = MIX[i % len(MIX)]
                    args = {k: v.format(i=i // len(MIX), c=c) for k, v in template.items()}
                    started = time.monotonic()
                    result = await session.call_tool(tool, args)
                    now = time.monotonic()
                    if result.is_error:
                        text = "".join(getattr(b, "text", "") for b in result.content)
                        stats.errors.append((now - t0, f"{tool}: {text[:120]}"))
                    else:
                        stats.calls.append((now - t0, now - started))
                    i += 1
        except Exception as exc:  # noqa: BLE001 - a soak counts failures, it does not stop
            while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
                exc = exc.exceptions[0]
            stats.errors.append((time.monotonic() - t0, f"{type(exc).__name__}: {exc}"[:200]))


async def sampler(pid: int, end: float, t0: float, every: float, stats: Stats) -> None:
    """Sample the server's RSS every ``every`` seconds until ``end``."""
    while True:
        now = time.monotonic()
        stats.rss.append((now - t0, rss_mb(pid)))
        if now >= end:
            return
        await anyio.sleep(min(every, end - now))


async def soak(args: argparse.Namespace, pid: int, url: str) -> Stats:
    """Run the load, then the idle period, sampling all along."""
    stats = Stats()
    t0 = time.monotonic()
    load_end = t0 + args.duration
    async with anyio.create_task_group() as tg:
        tg.start_soon(sampler, pid, load_end + args.idle, t0, args.sample, stats)
        async with anyio.create_task_group() as load:
            for c in range(args.concurrency):
                load.start_soon(caller, url, c, load_end, t0, args.session_calls, stats)
    return stats


def _rss_at(stats: Stats, at: float) -> float:
    """The last RSS sample taken at or before ``at``."""
    before = [mb for t, mb in stats.rss if t <= at + 1e-6]
    return before[-1] if before else stats.rss[0][1]


def report(stats: Stats, args: argparse.Namespace) -> None:
    """The per-minute table and the summary."""
    print(f"concurrency {args.concurrency}, {args.duration:.0f} s load, {args.idle:.0f} s idle")
    print("| minute | RSS MB (end) | calls | errors | p50 ms | p99 ms |")
    print("|---|---|---|---|---|---|")
    minutes = int((args.duration + 59) // 60)
    for m in range(minutes):
        lo, hi = m * 60, min((m + 1) * 60, args.duration)
        lat = [latency for at, latency in stats.calls if lo <= at < hi]
        errs = sum(1 for at, _ in stats.errors if lo <= at < hi)
        p50 = f"{pct(lat, 0.5) * 1e3:.1f}" if lat else "-"
        p99 = f"{pct(lat, 0.99) * 1e3:.1f}" if lat else "-"
        print(f"| {m + 1} | {_rss_at(stats, hi):.0f} | {len(lat)} | {errs} | {p50} | {p99} |")
    all_lat = [latency for _, latency in stats.calls]
    start_rss = _rss_at(stats, min(120.0, args.duration / 5))
    end_rss = _rss_at(stats, args.duration)
    idle_rss = stats.rss[-1][1]
    print()
    print(f"calls {len(all_lat)}, errors {len(stats.errors)}", end="")
    if all_lat:
        print(f", p50 {pct(all_lat, 0.5) * 1e3:.1f} ms, p99 {pct(all_lat, 0.99) * 1e3:.1f} ms")
    peak = max(mb for _, mb in stats.rss)
    print(f"RSS: first sample {stats.rss[0][1]:.0f} MB, peak {peak:.0f} MB")
    growth = (end_rss - start_rss) / start_rss * 100
    print(
        f"RSS growth from {min(120.0, args.duration / 5):.0f} s to the end of the load: "
        f"{start_rss:.0f} -> {end_rss:.0f} MB ({growth:+.1f}%); after {args.idle:.0f} s idle: "
        f"{idle_rss:.0f} MB"
    )
    for at, text in stats.errors[:5]:
        print(f"  error at {at:.1f} s: {text}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600, help="seconds of load (600)")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent callers (16)")
    parser.add_argument("--idle", type=float, default=30, help="idle seconds after the load")
    parser.add_argument("--sample", type=float, default=5, help="seconds between RSS samples")
    parser.add_argument("--session-calls", type=int, default=200, help="calls per session")
    parser.add_argument("--bundle", type=Path, help="bundle to serve (default: the demo)")
    parser.add_argument(
        "--quick", action="store_true", help="a few iterations: that it runs (CI; no targets)"
    )
    args = parser.parse_args()
    if args.quick:
        args.duration, args.idle, args.sample = 8.0, 2.0, 1.0
    state = Path(tempfile.mkdtemp(prefix="skilld-soak-"))
    proc, url = start_server(args.bundle, state)
    try:
        stats = anyio.run(soak, args, proc.pid, url)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    report(stats, args)
    print(f"server exit code {proc.returncode}; its log: {state / 'serve.log'}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
