"""``skilld build``: verify packages, compile policy and native code, write a locked bundle."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from skilld import paths


def register(sub: Any) -> None:
    """Add ``skilld build``."""
    p: argparse.ArgumentParser = sub.add_parser(
        "build",
        help="build an appliance bundle from skills/ and policies/",
        description="Verify every package against policies/trust/, build and sign source "
        "skills (skill.yaml) and Agent Skills (SKILL.md, docs/agent-skills.md), compile the "
        "policy, AOT-compile every component for this engine and write "
        "a read-only bundle with bundle.lock. Same inputs and SOURCE_DATE_EPOCH give the "
        "same bundle digest.",
    )
    p.add_argument(
        "--skills",
        type=Path,
        default=Path("skills"),
        metavar="DIR",
        help="skill sources (DIR/NAME/skill.yaml) and signed .skill packages (default: skills/)",
    )
    p.add_argument(
        "--policies",
        type=Path,
        default=Path("policies"),
        metavar="DIR",
        help="one NAME.yaml per skill, with the trust keys in DIR/trust/ (default: policies/)",
    )
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        default=Path("bundle"),
        metavar="DIR",
        help="where to write the bundle (default: bundle/)",
    )
    p.add_argument(
        "--skill-key",
        type=Path,
        help="private key that signs skills built from source (default: an "
        "ephemeral build key, trusted for exactly those skills)",
    )
    p.add_argument("--bundle-key", type=Path, help="private key that signs bundle.lock")
    p.add_argument(
        "--previous",
        type=Path,
        metavar="LOCK",
        help="an earlier bundle.lock: refuse skill version downgrades",
    )
    p.add_argument("--allow-downgrade", action="store_true", help="permit lower versions")
    p.add_argument(
        "--lenient",
        action="store_true",
        help="report needs that no grant covers as warnings, not errors, and load Agent "
        "Skills as the specification's client guide allows (a name that differs from its "
        "directory, an over-long name or description: warnings)",
    )
    p.add_argument(
        "--wheelhouse",
        type=Path,
        metavar="DIR",
        help="wheels that Agent Skills' requirements are installed from (offline, at build)",
    )
    p.add_argument(
        "--sources",
        type=Path,
        metavar="FILE",
        help="packages to pull from OCI registries and image layouts (default: "
        "SKILLS/sources.yaml when present; docs/registry.md); tags are resolved once and "
        "pinned in bundle.lock",
    )
    p.add_argument(
        "--locked",
        type=Path,
        metavar="LOCK",
        help="an earlier bundle.lock: fetch every sources.yaml package at the digest it "
        "records (a moved tag stays pinned; a package the lock lacks is refused)",
    )
    p.add_argument(
        "-q", "--quiet", action="store_true", help="no progress lines (warnings still show)"
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Handle ``skilld build``."""
    from skilld.bundle import BuildOptions, build_bundle
    from skilld.sandbox import Sandbox

    start = time.monotonic()

    def progress(message: str) -> None:
        if not args.quiet:
            print(f"[{time.monotonic() - start:6.1f}s] {message}", file=sys.stderr, flush=True)

    cache = paths.cache_dir()
    options = BuildOptions(
        skill_key=args.skill_key,
        bundle_key=args.bundle_key,
        previous=args.previous,
        allow_downgrade=args.allow_downgrade,
        strict=not args.lenient,
        lenient=args.lenient,
        wheelhouse=args.wheelhouse,
        sources=args.sources,
        locked=args.locked,
        cache_dir=cache,
        progress=progress,
    )
    with Sandbox(cache) as sandbox:
        result = build_bundle(
            args.skills, args.policies, args.output, sandbox=sandbox, options=options
        )
    if args.quiet:  # progress carried them otherwise; quiet drops progress, never warnings
        for warning in result.warnings:
            print(f"warning: {warning}", file=sys.stderr)
    print(f"{'skill':<14} {'version':<9} {'methods':>7}  {'package':>9} {'native':>9}  grants")
    for row in result.rows:
        print(
            f"{row.id:<14} {row.version:<9} {row.methods:>7}  "
            f"{row.package_bytes / 1e6:>7.1f}MB {row.native_bytes / 1e6:>7.1f}MB  {row.grants}"
        )
    print(f"bundle {result.out}  digest {result.lock.bundle_digest}")
    print(
        f"policy {result.lock.policy_digest[:16]}  engine {result.lock.engine}  "
        f"({len(result.warnings)} warnings)"
    )
    return 0
