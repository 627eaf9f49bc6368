"""``skilld skill new|build``: write and build Python skills."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from skilld.errors import UsageError

_TEMPLATE_YAML = """\
id: {id}
name: {title}
version: 0.1.0
description: {title} skill.
# What the skill asks for, in the policy's vocabulary (see docs/policy.md).
# Each key also decides which host interfaces the component imports.
needs:
  kv: {{}}
"""

_TEMPLATE_PY = '''\
"""{title}: describe what this skill does."""

from __future__ import annotations

from skilld_sdk import Skill, SkillError, kv

skill = Skill()


@skill.method
def hello(name: str = "world") -> str:
    """Greet someone and count the greetings.

    Args:
        name: who to greet.
    """
    if not name:
        raise SkillError("invalid-argument", "name must not be empty")
    count = int(kv.get("count") or b"0") + 1
    kv.set("count", str(count))
    return f"hello, {{name}} (#{{count}})"
'''


# The policy `skill new` writes beside the skill: exactly what the template needs.
_TEMPLATE_POLICY = """\
# {id}: what the operator grants the skill (docs/policy.md); deny by default.
# The skill's needs (skills/{id}/skill.yaml) must each be granted here.
skill: {id}
kv: {{}}
limits:
  memory: 96MiB
  wall_time: 5s
"""


def register(sub: Any) -> None:
    """Add ``skilld skill new`` and ``skilld skill build``."""
    p: argparse.ArgumentParser = sub.add_parser("skill", help="write and build Python skills")
    ssub = p.add_subparsers(dest="skill_command", metavar="SUBCOMMAND")
    new = ssub.add_parser(
        "new",
        help="scaffold a new skill directory",
        description="Create NAME/ with skill.yaml and skill.py to start from, and the "
        "policy granting what it needs (POLICIES/NAME.yaml), so that the next build serves it.",
    )
    new.add_argument("name", help="the skill id (lowercase letters, digits, dashes)")
    new.add_argument(
        "--dir", type=Path, default=Path("skills"), help="parent directory (default: skills/)"
    )
    new.add_argument(
        "--policies",
        type=Path,
        default=Path("policies"),
        metavar="POLICIES",
        help="where the skill's policy goes (default: policies/)",
    )
    new.set_defaults(handler=run_new)
    build = ssub.add_parser(
        "build",
        help="build a skill into a WebAssembly component",
        description="Compile DIR (skill.yaml + skill.py) with componentize-py. Builds are "
        "cached by a digest of the sources, the SDK and the ABI.",
    )
    build.add_argument("dir", type=Path, metavar="DIR", help="the skill source directory")
    build.add_argument(
        "-o",
        "--output",
        type=Path,
        required=True,
        metavar="OUT.wasm",
        help="the component to write",
    )
    build.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="build cache (default: $SKILLD_CACHE or ~/.cache/skilld)",
    )
    build.set_defaults(handler=run_build)

    def usage(_args: argparse.Namespace) -> int:
        p.print_help(sys.stderr)
        return 2

    p.set_defaults(handler=usage)


def run_new(args: argparse.Namespace) -> int:
    """Handle ``skilld skill new``."""
    if not re.fullmatch(r"[a-z][a-z0-9-]{0,62}", args.name):
        raise UsageError(f"skill id {args.name!r} must be lowercase letters, digits and dashes")
    target = args.dir / args.name
    if target.exists():
        raise UsageError(f"{target} already exists; not overwriting it")
    policy = args.policies / f"{args.name}.yaml"
    target.mkdir(parents=True)
    title = args.name.replace("-", " ").title()
    (target / "skill.yaml").write_text(_TEMPLATE_YAML.format(id=args.name, title=title))
    (target / "skill.py").write_text(_TEMPLATE_PY.format(title=title))
    print(f"created {target}/skill.yaml and {target}/skill.py")
    if policy.exists():
        print(f"kept {policy}: it must grant what {target}/skill.yaml needs (kv)")
    else:
        args.policies.mkdir(parents=True, exist_ok=True)
        policy.write_text(_TEMPLATE_POLICY.format(id=args.name))
        print(f"created {policy} (grants kv, the template's one need)")
    print(f"try it: skilld skill build {target} -o {args.name}.wasm")
    print(
        f"serve it: skilld build --skills {args.dir} --policies {args.policies} -o bundle "
        "&& skilld serve --bundle bundle"
    )
    return 0


def run_build(args: argparse.Namespace) -> int:
    """Handle ``skilld skill build``."""
    from skilld.package.build import build_component

    if not args.dir.is_dir():
        raise UsageError(f"no such directory: {args.dir}")
    print(f"building {args.dir} ...", file=sys.stderr)
    out = build_component(args.dir, cache_dir=args.cache_dir, out=args.output)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)", file=sys.stderr)
    return 0
