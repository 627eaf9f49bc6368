"""The demo bundle: built from the source checkout's skills/ and policies/, cached by content.

The MCP conformance suite's skill (its ``test_*`` tools, resources and prompts) is not
part of the demo, and skilld reads no test files of its own accord: the conformance skill
is added only from a directory the caller names (``with_conformance``, ``skilld serve
--with-conformance DIR``), which holds ``skills/conformance/`` and
``policies/conformance.yaml`` (a source checkout's ``tests/``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from skilld import __version__, paths
from skilld.errors import UsageError


def _base() -> Path:
    return Path(os.environ.get("SKILLD_DEMO_DIR") or Path(__file__).resolve().parents[3])


def demo_sources() -> tuple[Path, Path]:
    """skills/ and policies/ of the demo: ``$SKILLD_DEMO_DIR``, else the source checkout.

    Raises:
        UsageError: neither holds both directories.
    """
    base = _base()
    skills, policies = base / "skills", base / "policies"
    if not (skills.is_dir() and policies.is_dir()):
        raise UsageError(
            "no demo skills and policies found",
            hint="pass --bundle DIR, or set SKILLD_DEMO_DIR to a directory holding "
            "skills/ and policies/",
        )
    return skills, policies


def conformance_sources(tests_dir: Path) -> tuple[Path, Path]:
    """The conformance skill's source directory and its policy, in ``tests_dir``.

    Raises:
        UsageError: ``tests_dir`` holds no ``skills/conformance/skill.yaml`` and
            ``policies/conformance.yaml``.
    """
    skill = tests_dir / "skills" / "conformance"
    policy = tests_dir / "policies" / "conformance.yaml"
    if not ((skill / "skill.yaml").is_file() and policy.is_file()):
        raise UsageError(
            "no conformance skill here: skills/conformance/skill.yaml and "
            "policies/conformance.yaml are needed",
            location=str(tests_dir),
            hint="pass the directory that holds them: a source checkout's tests/",
        )
    return skill, policy


def _digest(roots: list[Path]) -> str:
    # Everything the bundle is made of: its sources, the SDK and ABI compiled into every
    # skill, and this skilld (engine included) that compiles it.
    from skilld.sandbox import engine_fingerprint

    h = hashlib.sha256(f"{__version__} {engine_fingerprint()[1]}".encode())
    for root in (*roots, paths.sdk_dir(), paths.wit_dir(), paths.runner_dir()):
        files = [root] if root.is_file() else sorted(root.rglob("*"))
        for path in files:
            if path.is_file() and "__pycache__" not in path.parts:
                h.update(path.relative_to(root.parent).as_posix().encode() + b"\0")
                h.update(path.read_bytes())
    return h.hexdigest()[:16]


def demo_bundle(
    *, with_conformance: Path | None = None, progress: Callable[[str], None] | None = None
) -> Path:
    """The demo bundle in the cache, built from the demo sources when missing or stale.

    ``with_conformance`` names a directory holding the MCP conformance suite's skill
    (see :func:`conformance_sources`) to add (a bundle of its own in the cache, so the
    plain demo never serves its ``test_*`` tools). ``progress`` hears what a build does
    (default: timed lines on stderr).

    Raises:
        UsageError: no demo sources (see :func:`demo_sources`, :func:`conformance_sources`).
        PackageError, PolicyError, BundleError: building it failed.
    """
    skills, policies = demo_sources()
    extra = conformance_sources(with_conformance) if with_conformance is not None else None
    roots = [skills, policies, *(extra or ())]
    name = "demo-conformance-bundle" if extra else "demo-bundle"
    out = paths.cache_dir() / name / _digest(roots)
    if (out / "bundle.lock").is_file():
        return out
    if progress is None:
        start = time.monotonic()

        def progress(message: str) -> None:
            print(f"[{time.monotonic() - start:6.1f}s] {message}", file=sys.stderr, flush=True)

    what = f"{skills} and {policies}" + (" with the conformance skill" if extra else "")
    progress(f"building the demo bundle from {what} (first run only)")

    if extra is None:
        _build(skills, policies, out, progress)
        return out
    # build_bundle takes one skills and one policies directory: the demo's and the
    # conformance skill's are staged side by side (small text files; builds are cached
    # by source digest, so the staged copy costs no compile).
    with tempfile.TemporaryDirectory(prefix="skilld-demo-") as tmp:
        stage = Path(tmp)
        shutil.copytree(skills, stage / "skills", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(policies, stage / "policies")
        shutil.copytree(extra[0], stage / "skills" / extra[0].name)
        shutil.copyfile(extra[1], stage / "policies" / extra[1].name)
        _build(stage / "skills", stage / "policies", out, progress)
    return out


def _build(skills: Path, policies: Path, out: Path, progress: Callable[[str], None]) -> None:
    # The build toolchain (cryptography, componentize-py) only when building.
    from skilld.bundle import build_bundle
    from skilld.sandbox import Sandbox

    with Sandbox(paths.cache_dir()) as sandbox:
        build_bundle(
            skills,
            policies,
            out,
            sandbox=sandbox,
            cache_dir=paths.cache_dir(),
            progress=progress,
        )
