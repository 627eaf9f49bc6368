"""``skilld skills list``: the skills a bundle serves, plainly or as ``<available_skills>``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    """Add ``skilld skills list``."""
    p: argparse.ArgumentParser = sub.add_parser(
        "skills",
        help="list the skills a bundle serves",
        description="List the skills of a bundle (from its bundle.lock) or of a skills/ "
        "directory of Agent Skills (validated on the way).",
    )
    ssub = p.add_subparsers(dest="skills_command", metavar="COMMAND", required=True)
    ls: argparse.ArgumentParser = ssub.add_parser("list", help="name, kind and description")
    where = ls.add_mutually_exclusive_group(required=True)
    where.add_argument("--bundle", type=Path, help="a built bundle")
    where.add_argument("--skills", type=Path, help="a directory of Agent Skills (SKILL.md)")
    ls.add_argument(
        "--xml",
        action="store_true",
        help="print the <available_skills> block agents put in a system prompt",
    )
    ls.add_argument("--lenient", action="store_true", help="validate as the client guide allows")
    ls.set_defaults(handler=run_list)


def run_list(args: argparse.Namespace) -> int:
    """Handle ``skilld skills list``.

    Raises:
        BundleError: the bundle's lock is missing or malformed.
        AgentSkillError: an Agent Skill in ``--skills`` is invalid.
    """
    from skilld import agentskills

    rows: list[tuple[str, str, str, str]] = []  # name, kind, description, location
    if args.bundle is not None:
        from skilld.bundle import Lock

        lock = Lock.read(args.bundle / "bundle.lock")
        for a in lock.agent_skills:
            where = agentskills.resource_uri(a.id, agentskills.SKILL_MD)
            rows.append((a.id, f"agent-skill ({a.executor})", a.description, where))
        for s in lock.skills:
            rows.append((s.id, "wasm", s.description, f"{args.bundle / s.package}"))
    else:
        for d in sorted(args.skills.iterdir()):
            if d.is_dir() and agentskills.is_agent_skill(d):
                md = agentskills.parse_skill_md(d, lenient=args.lenient)
                rows.append((md.id, "agent-skill", md.description, str(d / agentskills.SKILL_MD)))
    rows.sort()
    if args.xml:
        print(agentskills.available_skills_xml((n, d, w) for n, _k, d, w in rows))
        return 0
    width = max((len(r[0]) for r in rows), default=4)
    for name, kind, description, _where in rows:
        first = description.strip().splitlines()[0] if description.strip() else ""
        print(f"{name:<{width}}  {kind:<22}  {first}")
    return 0
