"""A tool called locally and through another node of a cluster, side by side.

One bundle (``echo-wat``: a skill in WebAssembly text, no guest runtime, so the
numbers are skilld's own) is opened twice: as a plain node in this process (local
calls), and by a worker-only ``skilld serve --cluster --no-mcp`` process; an
entry-only node in this process routes its calls to that process over a real
nats-server on loopback. Each call goes through the registry, as a tool call of the
MCP layer does (slot, context, audit record), so the difference is what routing adds:
NATS request/reply, the holder's thread hand-off and the reply stream.

Rounds alternate local and remote; latencies are pooled. Prints p50 and p99 of each
and the remote/local ratio and difference.

Run: ``python bench/bench_cluster.py [--calls N] [--rounds R]``
"""

from __future__ import annotations

import argparse
import os
import queue
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _util import pct, timings

from skilld import paths
from skilld.bundle import build_bundle
from skilld.cluster import ClusterConfig
from skilld.node import Node, NodeConfig
from skilld.package import SigningKey, trust_file_bytes, trusted_key, write_private_key
from skilld.registry import NullChannel
from skilld.sandbox import Sandbox

ROOT = Path(__file__).resolve().parent.parent
TOOL = "echo-wat/echo"


def _bundle(tmp: Path) -> tuple[Path, dict[str, Path]]:
    """The echo-wat bundle trusting a fresh key per node, each for its own name only;
    returns (bundle, node -> key file)."""
    src = tmp / "src"
    (src / "policies" / "trust").mkdir(parents=True)
    keys = {}
    for node in ("holder", "entry"):
        key = SigningKey.generate()
        keys[node] = tmp / f"{node}.pem"
        write_private_key(key, keys[node])
        trusted = trusted_key(node, key.public_raw, [], cluster=[node])
        (src / "policies" / "trust" / f"{node}.pub.json").write_bytes(trust_file_bytes(trusted))
    shutil.copytree(ROOT / "skills" / "echo-wat", src / "skills" / "echo-wat")
    shutil.copy(ROOT / "policies" / "echo-wat.yaml", src / "policies" / "echo-wat.yaml")
    with Sandbox(paths.cache_dir()) as sandbox:
        build_bundle(
            src / "skills",
            src / "policies",
            tmp / "bundle",
            sandbox=sandbox,
            cache_dir=paths.cache_dir(),
        )
    return tmp / "bundle", keys


def _wait(proc: subprocess.Popen[str], pattern: str) -> re.Match[str]:
    found: queue.Queue[re.Match[str] | None] = queue.Queue()

    def read() -> None:
        assert proc.stderr is not None
        hit = False
        for line in proc.stderr:
            m = re.search(pattern, line)
            if m and not hit:
                hit = True
                found.put(m)
        if not hit:
            found.put(None)

    threading.Thread(target=read, daemon=True).start()
    match = found.get(timeout=120)
    if match is None:
        raise RuntimeError(f"{proc.args[0]} ended before {pattern!r}")
    return match


def main() -> None:
    """Print the side-by-side table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per round and side")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    parser.add_argument(
        "--quick", action="store_true", help="a few iterations: that it runs (CI; no targets)"
    )
    args = parser.parse_args()
    if args.quick:
        args.calls, args.rounds = 50, 1
    tmp = Path(tempfile.mkdtemp(prefix="skilld-bench-cluster-"))
    procs: list[subprocess.Popen[str]] = []
    try:
        bundle, keys = _bundle(tmp)
        nats = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "nats-server"),
                "-a",
                "127.0.0.1",
                "-p",
                "-1",
                "-js",
                "-sd",
                str(tmp / "js"),
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(nats)
        url = "nats://127.0.0.1:" + _wait(nats, r"client connections on [\d.]+:(\d+)").group(1)
        holder = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "skilld",
                "serve",
                "--bundle",
                str(bundle),
                "--state-dir",
                str(tmp / "holder"),
                "--cluster",
                url,
                "--node",
                "holder",
                "--cluster-key",
                str(keys["holder"]),
                "--no-mcp",
            ],
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ),
        )
        procs.append(holder)
        _wait(holder, "serving the cluster only")
        local = Node.open(NodeConfig(bundle=bundle, state_dir=tmp / "local"))
        entry = Node.open(
            NodeConfig(
                bundle=bundle,
                state_dir=tmp / "entry",
                serve_skills=False,
                cluster=ClusterConfig(url=url, node="entry", key_file=keys["entry"]),
            )
        )
        try:
            joined = threading.Event()
            entry.registry.watch(joined.set)
            if not any(t.name == TOOL for t in entry.registry.tools()):
                joined.wait(30)
            args_ = {"text": "hello"}

            def call_local() -> object:
                return local.registry.call(TOOL, args_, NullChannel())

            def call_remote() -> object:
                return entry.registry.call(TOOL, args_, NullChannel())

            results: dict[str, list[float]] = {"local": [], "remote": []}
            for _ in range(args.rounds):
                results["local"] += timings(call_local, n=args.calls, warmup=50)
                results["remote"] += timings(call_remote, n=args.calls, warmup=50)
        finally:
            entry.close()
            local.close()
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    lo, re_ = results["local"], results["remote"]
    print(f"\n{TOOL} through the registry, {args.rounds} x {args.calls} calls per side\n")
    print("| side | p50 ms | p99 ms |")
    print("|---|---|---|")
    for name, values in results.items():
        print(f"| {name} | {statistics.median(values) * 1e3:.3f} | {pct(values, 0.99) * 1e3:.3f} |")
    print(
        f"\nremote/local p50 {statistics.median(re_) / statistics.median(lo):.2f}, "
        f"p99 {pct(re_, 0.99) / pct(lo, 0.99):.2f}; remote adds "
        f"{(statistics.median(re_) - statistics.median(lo)) * 1e3:.3f} ms at p50"
    )


if __name__ == "__main__":
    main()
