"""The demo bundle: built from the source checkout's skills/ and policies/, cached by content."""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

from skilld import __version__, paths
from skilld.errors import UsageError


def demo_sources() -> tuple[Path, Path]:
    """skills/ and policies/ of the demo: ``$SKILLD_DEMO_DIR``, else the source checkout.

    Raises:
        UsageError: neither holds both directories.
    """
    base = Path(os.environ.get("SKILLD_DEMO_DIR") or Path(__file__).resolve().parents[3])
    skills, policies = base / "skills", base / "policies"
    if not (skills.is_dir() and policies.is_dir()):
        raise UsageError(
            "no demo skills and policies found",
            hint="pass --bundle DIR, or set SKILLD_DEMO_DIR to a directory holding "
            "skills/ and policies/",
        )
    return skills, policies


def demo_bundle() -> Path:
    """The demo bundle in the cache, built from the demo sources when missing or stale.

    Raises:
        UsageError: no demo sources (see :func:`demo_sources`).
        PackageError, PolicyError, BundleError: building it failed.
    """
    from skilld.sandbox import Sandbox, engine_fingerprint

    skills, policies = demo_sources()
    # Everything the demo bundle is made of: its sources, the SDK and ABI compiled into
    # every skill, and this skilld (engine included) that compiles it.
    h = hashlib.sha256(f"{__version__} {engine_fingerprint()[1]}".encode())
    for root in (skills, policies, paths.sdk_dir(), paths.wit_dir()):
        for path in sorted(root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                h.update(path.relative_to(root.parent).as_posix().encode() + b"\0")
                h.update(path.read_bytes())
    out = paths.cache_dir() / "demo-bundle" / h.hexdigest()[:16]
    if not (out / "bundle.lock").is_file():
        print(
            f"building the demo bundle from {skills} and {policies} (first run only) ...",
            file=sys.stderr,
            flush=True,
        )
        start = time.monotonic()
        # The build toolchain (cryptography, componentize-py) only when building.
        from skilld.bundle import build_bundle

        with Sandbox(paths.cache_dir()) as sandbox:
            build_bundle(
                skills,
                policies,
                out,
                sandbox=sandbox,
                cache_dir=paths.cache_dir(),
                progress=lambda m: print(
                    f"[{time.monotonic() - start:6.1f}s] {m}", file=sys.stderr, flush=True
                ),
            )
    return out
