"""Cold start to the first answered tools/list: skilld serving the demo bundle vs a bare MCPServer.

Both are started as new processes over stdio by the SDK's own client, which times
from spawning the process to the ``tools/list`` answer. The cost of each extra 18 MB
skill is measured twice: end to end (skilld serving a 1-skill bundle against a
3-skill one of echo, notes and the conformance skill, where ``serve`` hashes the
bundle while it imports), and in
process (``open_bundle`` alone, nothing to overlap with, plus one skill's hash and
deserialize).

    python bench/bench_coldstart.py [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

ROOT = Path(__file__).resolve().parent.parent
BARE = """
from mcp.server.mcpserver import MCPServer
server = MCPServer("bare")

@server.tool()
def echo(text: str) -> str:
    return text

server.run("stdio")
"""


async def time_to_tools(argv: list[str], env: dict[str, str]) -> float:
    """Seconds from spawning ``argv`` to its answer to tools/list."""
    start = time.perf_counter()
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = await session.list_tools()
        elapsed = time.perf_counter() - start
        assert tools.tools
    return elapsed


def _bundle_with(skills: list[str], out: Path) -> Path:
    from skilld.bundle import build_bundle
    from skilld.paths import cache_dir
    from skilld.sandbox import Sandbox

    src = out.parent / f"src-{out.name}"
    (src / "skills").mkdir(parents=True)
    (src / "policies").mkdir()
    for name in skills:
        # three Python skills: the demo's two and the conformance suite's (kept with the tests)
        base = ROOT if (ROOT / "skills" / name).is_dir() else ROOT / "tests"
        shutil.copytree(base / "skills" / name, src / "skills" / name)
        if len(skills) == 1:  # the demo policies name each other; alone, a bare policy
            (src / "policies" / f"{name}.yaml").write_text(f"skill: {name}\n")
        else:
            shutil.copy(base / "policies" / f"{name}.yaml", src / "policies")
    shutil.copy(ROOT / "policies" / "defaults.yaml", src / "policies")
    with Sandbox(cache_dir()) as sandbox:
        build_bundle(
            src / "skills",
            src / "policies",
            out,
            sandbox=sandbox,
            cache_dir=cache_dir(),
            strict=False,
        )
    return out


def native_costs(demo: Path, single: Path, runs: int) -> dict[str, float]:
    """Median ms to open the 1-skill and 3-skill bundles, and one native load alone."""
    from skilld.bundle import LOCK, Lock, open_bundle
    from skilld.sandbox import Sandbox

    out: dict[str, float] = {}
    with Sandbox() as sandbox:
        for label, bundle in (("open 1-skill bundle", single), ("open 3-skill bundle", demo)):
            times = []
            for _ in range(runs):
                t = time.perf_counter()
                open_bundle(bundle, sandbox)
                times.append(time.perf_counter() - t)
            out[label] = statistics.median(times) * 1000
        lock = Lock.read(demo / LOCK)
        skill = lock.skills[0]
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            sandbox.load_native(demo / skill.native, lock.files[skill.native], name=skill.id)
            times.append(time.perf_counter() - t)
        out[f"one native load ({skill.id}, hash + deserialize)"] = statistics.median(times) * 1000
    out["per extra skill (3-skill minus 1-skill, / 2)"] = (
        out["open 3-skill bundle"] - out["open 1-skill bundle"]
    ) / 2
    return out


async def main(runs: int) -> None:
    """Print the comparison as Markdown tables."""
    env = {**os.environ}
    with tempfile.TemporaryDirectory() as tmp:
        tmpd = Path(tmp)
        demo = _bundle_with(["echo", "notes", "conformance"], tmpd / "demo")
        single = _bundle_with(["echo"], tmpd / "single")
        bare_argv = [sys.executable, "-c", BARE]

        def skilld_argv(bundle: Path) -> list[str]:
            return [
                sys.executable,
                "-m",
                "skilld",
                "serve",
                "--bundle",
                str(bundle),
                "--transport",
                "stdio",
                "--state-dir",
                str(tmpd / "state"),
                "--log-file",
                str(tmpd / "serve.log"),
            ]

        results: dict[str, list[float]] = {
            "bare MCPServer": [],
            "skilld (3 skills)": [],
            "skilld (1 skill)": [],
        }
        for _ in range(runs):  # interleaved, so drift hits all alike
            results["bare MCPServer"].append(await time_to_tools(bare_argv, env))
            results["skilld (3 skills)"].append(await time_to_tools(skilld_argv(demo), env))
            results["skilld (1 skill)"].append(await time_to_tools(skilld_argv(single), env))
        print(f"## Cold start to the first tools/list answer ({runs} runs, ms)\n")
        print("| server | median | min | max |\n|---|---|---|---|")
        for name, values in results.items():
            print(
                f"| {name} | {statistics.median(values) * 1000:.0f} | "
                f"{min(values) * 1000:.0f} | {max(values) * 1000:.0f} |"
            )
        ratio = statistics.median(results["skilld (3 skills)"]) / statistics.median(
            results["bare MCPServer"]
        )
        print(f"\nratio skilld / bare: {ratio:.2f}")
        extra = (
            statistics.median(results["skilld (3 skills)"])
            - statistics.median(results["skilld (1 skill)"])
        ) / 2
        print(f"per extra skill, end to end (3-skill minus 1-skill, / 2): {extra * 1000:.1f} ms\n")
        print("## Loading verified native code in process (ms, median)\n")
        print("| what | ms |\n|---|---|")
        for label, ms in native_costs(demo, single, runs).items():
            print(f"| {label} | {ms:.1f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument(
        "--quick", action="store_true", help="a few iterations: that it runs (CI; no targets)"
    )
    args = parser.parse_args()
    anyio.run(main, 1 if args.quick else args.runs)
