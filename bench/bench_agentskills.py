"""Agent Skills' script executors against plain ``python3 script.py``, side by side.

The same stdlib-only script (the ``csv-summary`` fixture's ``summarize.py`` on a small
CSV) run three ways, each call to the end with its output read:

1. ``python3 script.py`` as a plain subprocess: no confinement, the baseline;
2. the ``native`` executor: a confined host process (Landlock, namespaces, rlimits)
   through the registry (slot, workspace, audit record);
3. the ``wasm`` executor: the CPython runner component, a fresh instance per call with
   that call's WASI preopens, through the registry.

Run: ``python bench/bench_agentskills.py [--scale F]`` (builds a bundle of the fixture
skills first; the runner component is cached; ``--scale 0.1`` checks the bench works).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _util import row, timings

from skilld import agentskills
from skilld.bundle import build_bundle, open_bundle
from skilld.paths import cache_dir
from skilld.registry import Registry, SkillEntry
from skilld.sandbox import Sandbox
from skilld.types import Limits, SkillSpec

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "agentskills" / "fixtures"
CSV = "city,temp,rain\n" + "".join(f"c{i},{i % 30},{i * 0.5}\n" for i in range(200))


def main() -> None:
    """Build the fixture bundle, then time each way of running the script."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of iterations")
    args = parser.parse_args()
    n = max(5, int(50 * args.scale))
    with (
        tempfile.TemporaryDirectory(prefix="bench-agentskills-") as tmp,
        Sandbox(cache_dir()) as sandbox,
    ):
        work = Path(tmp)
        skills = work / "skills"
        skills.mkdir()
        shutil.copytree(FIXTURES / "skills" / "csv-summary", skills / "csv-summary")
        policies = work / "policies"
        shutil.copytree(FIXTURES / "policies", policies)
        for name in ("pdf-text.yaml", "release-notes.yaml"):
            (policies / name).unlink()
        bundle = work / "bundle"
        build_bundle(skills, policies, bundle, sandbox=sandbox, cache_dir=cache_dir())
        loaded = open_bundle(bundle, sandbox)
        locked = loaded.lock.agent_skills[0]
        assert loaded.lock.runner is not None
        runner = sandbox.load_native(
            bundle / loaded.lock.runner.native, loaded.lock.runner.native_sha256, name="pyrunner"
        )
        spec = SkillSpec.from_dict({**locked.spec, "id": locked.id, "version": locked.version})
        root = bundle / locked.root
        limits = Limits(timeout_ms=20_000)
        registry = Registry()
        for executor in ("wasm", "native"):
            backend = agentskills.open_backend(
                SkillSpec(f"csv-{executor}", spec.version, spec.description, spec.methods),
                root,
                None,
                executor,
                {"interpreters": ("python",)},
                {},
                limits,
                runner,
            )
            registry.add(
                SkillEntry(
                    spec=SkillSpec(f"csv-{executor}", spec.version, "", spec.methods),
                    component=backend,
                    limits=limits,
                )
            )
        args_ = {"script": "scripts/summarize.py", "stdin": CSV}
        script = root / "scripts" / "summarize.py"
        scratch = work / "plain"
        scratch.mkdir()

        def plain() -> None:
            done = subprocess.run(
                [sys.executable, str(script)],
                input=CSV.encode(),
                capture_output=True,
                cwd=scratch,
                check=True,
            )
            assert done.stdout

        def via(executor: str) -> None:
            out = registry.call_method(f"csv-{executor}", "run_script", args_)
            assert out.value["exit_status"] == 0, out.value["stderr"]

        results = {
            "plain python3 script.py": timings(plain, n=n),
            "native executor (confined process)": timings(lambda: via("native"), n=n),
            "wasm executor (CPython component)": timings(lambda: via("wasm"), n=n),
        }
    base = statistics.median(results["plain python3 script.py"])
    print(f"\n{n} calls each, ms\n")
    print("| way | median | p99 | median vs plain |")
    print("|---|---:|---:|---:|")
    for name, values in results.items():
        print(f"{row(name, values)} {statistics.median(values) / base:.2f}x |")
    native = statistics.median(results["native executor (confined process)"]) / base
    verdict = "met" if native <= 1.5 else "NOT met"
    print(f"\ntarget (issue 19): native executor <= 1.5x plain python3: {native:.2f}x, {verdict}")


if __name__ == "__main__":
    main()
