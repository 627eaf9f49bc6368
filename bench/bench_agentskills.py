"""Agent Skills' script executors against plain ``python3 script.py``, side by side.

The same stdlib-only script (the ``csv-summary`` fixture's ``summarize.py`` on a small
CSV) run three ways, each call to the end with its output read:

1. ``python3 script.py`` as a plain subprocess: no confinement, the baseline;
2. the ``native`` executor: a confined host process (Landlock, namespaces, rlimits)
   through the registry (slot, workspace, audit record);
3. the ``wasm`` executor: the CPython runner component, a fresh instance per call with
   that call's WASI preopens, through the registry.

Then the tokens a client receives per activation (tier 2), before and after the body
was sent once: *before* rebuilds the old answer (a JSON copy of the body and file index
beside the Markdown text), *after* is what the backend answers now (the body once,
wrapped as the client guide shows). Tokens are estimated as characters / 4.
``--bundle DIR`` measures the Agent Skills of another built bundle instead.

Run: ``python bench/bench_agentskills.py [--scale F] [--bundle DIR]`` (builds a bundle
of the fixture skills first; the runner component is cached; ``--scale 0.1`` checks the
bench works).
"""

from __future__ import annotations

import argparse
import json
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
from skilld.registry import Call, Registry, SkillEntry
from skilld.sandbox import Sandbox
from skilld.types import Limits, SkillSpec

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "agentskills" / "fixtures"
CSV = "city,temp,rain\n" + "".join(f"c{i},{i % 30},{i * 0.5}\n" for i in range(200))


def _old_activation(backend: agentskills.AgentSkillBackend) -> str:
    """The tier-2 answer as it was: the Markdown text plus a JSON copy of body and index."""
    index = [
        {"path": backend._paths[r.uri], "uri": r.uri, "mime_type": r.mime_type}
        for r in backend.spec.resources
        if not r.template
    ]
    listing = "\n".join(f"- {f['path']} ({f['uri']})" for f in index)
    text = f"{backend.body}\n\n---\nFiles of this skill (read one as an MCP resource):\n{listing}"
    value = {"name": backend.spec.id, "instructions": backend.body, "files": index}
    return json.dumps(value, ensure_ascii=False) + text


def activation_tokens(bundle: Path, sandbox: Sandbox) -> None:
    """Print tokens per activation, before and after, for each Agent Skill of ``bundle``."""
    loaded = open_bundle(bundle, sandbox)
    print("\n| skill | tokens before | tokens after | after / before |")
    print("|---|---:|---:|---:|")
    totals = [0, 0]
    for locked in loaded.lock.agent_skills:
        spec = SkillSpec.from_dict({**locked.spec, "id": locked.id, "version": locked.version})
        # No executor: activation only, so the work directory is never written.
        backend = agentskills.AgentSkillBackend(spec, bundle / locked.root, None, bundle)
        before, after = len(_old_activation(backend)) // 4, len(backend.activation_text()) // 4
        totals[0] += before
        totals[1] += after
        print(f"| {locked.id} | {before} | {after} | {after / before:.2f} |")
    print(f"| all | {totals[0]} | {totals[1]} | {totals[1] / max(totals[0], 1):.2f} |")


def main() -> None:
    """Build the fixture bundle, then time each way of running the script."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of iterations")
    parser.add_argument("--bundle", type=Path, help="measure activation tokens of this bundle")
    parser.add_argument(
        "--quick", action="store_true", help="a few iterations: that it runs (CI; no targets)"
    )
    args = parser.parse_args()
    if args.quick:
        args.scale = 0.1
    if args.bundle is not None:
        with Sandbox(cache_dir()) as sandbox:
            activation_tokens(args.bundle, sandbox)
        return
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
            out = registry.call_method(Call(f"csv-{executor}", "run_script", args_))
            assert out.value["exit_status"] == 0, out.value["stderr"]

        activation_tokens(bundle, sandbox)
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
