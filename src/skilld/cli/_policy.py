"""``skilld policy compile|explain``: compile ``policies/`` and ask the tables questions."""

from __future__ import annotations

import argparse
import json
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skilld.errors import PolicyError, UsageError

if TYPE_CHECKING:
    from skilld.policy import Tables


def register(sub: Any) -> None:
    """Add ``skilld policy compile`` and ``skilld policy explain``."""
    p: argparse.ArgumentParser = sub.add_parser(
        "policy", help="compile policies and explain decisions"
    )
    psub = p.add_subparsers(dest="policy_command", metavar="SUBCOMMAND")
    comp = psub.add_parser(
        "compile",
        help="compile policies/ into permission tables",
        description=(
            "Parse every <skill>.yaml (and defaults.yaml) in POLICIES, check each skill's "
            "declared needs against its grants when --skills is given, and write the "
            "tables (canonical JSON). Warnings and problems go to stderr."
        ),
    )
    comp.add_argument("policies", type=Path, metavar="POLICIES", help="the policies directory")
    comp.add_argument(
        "--skills",
        type=Path,
        metavar="DIR",
        help="directory of skills (DIR/*/skill.yaml or DIR/*.skill) whose needs to check",
    )
    comp.add_argument(
        "-o", "--output", type=Path, metavar="FILE", help="write the tables here (default: stdout)"
    )
    comp.add_argument("--strict", action="store_true", help="fail when a need is not granted")
    comp.set_defaults(handler=_compile)

    exp = psub.add_parser(
        "explain",
        help="would the policy allow this? which rule, and why",
        description=(
            "Answer one question, e.g. 'notes fs.read /data/notes/a.txt', "
            "'notes http.get https://api.example.com/x', 'notes shell.run \"git status\"', "
            "'notes invoke.call echo'. The answer comes from the tables a build keeps: "
            "compiled from POLICIES with the needs of the skills in --skills (grants a skill "
            "does not need are left out, as 'skilld build' does), or read from --tables or "
            "--bundle. Exit status 0 when allowed, 1 when denied, 2 for a usage error."
        ),
    )
    exp.add_argument("skill", metavar="SKILL", help="the skill id")
    exp.add_argument(
        "action",
        metavar="ACTION",
        help="CAPABILITY.ACTION, one of: fs.read, fs.write (fs.list, ...), http.get (any "
        "method), http.address, tcp.connect, tcp.address, shell.run, shell.cwd, env.read, "
        "invoke.call, transfer.send, transfer.fetch, kv.get (kv.set, ...), mcp.sample, "
        "mcp.elicit",
    )
    exp.add_argument(
        "target", metavar="TARGET", help="path, URL, HOST:PORT, command line, skill id, NAME"
    )
    src = exp.add_mutually_exclusive_group()
    src.add_argument(
        "--policies", type=Path, metavar="DIR", help="compile this directory (default: policies/)"
    )
    src.add_argument(
        "--tables",
        type=Path,
        metavar="FILE",
        help="use compiled tables (skilld policy compile -o)",
    )
    src.add_argument(
        "--bundle", type=Path, metavar="DIR", help="use the tables of this built bundle"
    )
    exp.add_argument(
        "--skills",
        type=Path,
        metavar="DIR",
        help="the skills whose needs the grants are intersected with (default: the skills/ "
        "directory beside POLICIES, when there is one)",
    )
    exp.set_defaults(handler=_explain)
    p.set_defaults(handler=lambda _args: _help(p))


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _read_needs(skills_dir: Path) -> tuple[dict[str, Mapping[str, Any] | None], dict[str, str]]:
    if not skills_dir.is_dir():
        raise UsageError(f"--skills {skills_dir}: not a directory")
    from skilld.policy import load_yaml

    needs: dict[str, Mapping[str, Any] | None] = {}
    sources: dict[str, str] = {}
    for entry in sorted(skills_dir.iterdir()):
        if (entry / "skill.yaml").is_file():
            label = str(entry / "skill.yaml")
            doc = load_yaml((entry / "skill.yaml").read_text(encoding="utf-8"), label)
            if not isinstance(doc, Mapping):
                raise PolicyError("skill.yaml must be a mapping", location=f"{label}:1")
            sid = str(doc.get("id") or entry.name)
            needs[sid] = doc.get("needs") or {}
            sources[sid] = label
        elif entry.suffix == ".skill" and entry.is_file():
            # Only the declared needs are read here; `skilld build` verifies packages.
            try:
                with zipfile.ZipFile(entry) as archive:
                    manifest = json.loads(archive.read("skill.json"))
            except (OSError, KeyError, zipfile.BadZipFile, json.JSONDecodeError) as exc:
                raise PolicyError(f"cannot read skill.json: {exc}", location=str(entry)) from exc
            if not isinstance(manifest, Mapping) or not isinstance(manifest.get("id"), str):
                raise PolicyError("skill.json has no id", location=str(entry))
            needs[manifest["id"]] = manifest.get("needs") or {}
            sources[manifest["id"]] = f"{entry}:skill.json"
    return needs, sources


def _compile(args: argparse.Namespace) -> int:
    from skilld.policy import compile_policies

    skills, sources = (None, None)
    if args.skills is not None:
        skills, sources = _read_needs(args.skills)
    result = compile_policies(args.policies, skills, needs_sources=sources)
    for finding in result.warnings:
        print(f"warning: {finding}", file=sys.stderr)
    for finding in result.problems:
        print(f"problem: {finding}", file=sys.stderr)
    if args.strict:
        result.raise_for_problems()
    tables = result.tables
    if args.output is None:
        print(tables.to_json())
    else:
        tables.write(args.output)
        print(
            f"wrote {args.output}: {len(tables.skills)} skills, "
            f"{len(result.warnings)} warnings, {len(result.problems)} problems, "
            f"digest sha256:{tables.digest}"
        )
    return 0


def _explain(args: argparse.Namespace) -> int:
    from skilld.permissions import explain, explain_action
    from skilld.policy import compile_policies, instances_text, load_tables, source_as_given

    explain_action(args.action)  # a typo is a usage error before anything is compiled
    tables: Tables
    policies: Path | None = None
    if args.skills is not None and (args.tables or args.bundle):
        raise UsageError("--skills goes with --policies: compiled tables already hold the needs")
    if args.tables is not None:
        tables = load_tables(args.tables)
    elif args.bundle is not None:
        tables = load_tables(args.bundle / "policy" / "tables.json")
    else:
        policies = args.policies or Path("policies")
        skills_dir = args.skills
        if skills_dir is None and (policies.parent / "skills").is_dir():
            skills_dir = policies.parent / "skills"
        needs, sources = _read_needs(skills_dir) if skills_dir else (None, None)
        if skills_dir is None:
            print(
                f"note: no skills/ beside {policies}: every grant counts, needed or not "
                "('skilld build' keeps only what skills need; pass --skills DIR)",
                file=sys.stderr,
            )
        tables = compile_policies(policies, needs, needs_sources=sources).tables
    try:
        table = tables.skill(args.skill)
    except PolicyError as exc:
        # An unknown skill is a question that cannot be asked (2), not a denial (1).
        raise UsageError(exc.message, location=exc.location, hint=exc.hint) from exc
    decision = explain(tables, args.skill, args.action, args.target)
    source = ""
    for section in table.values():
        rules = section if isinstance(section, tuple) else (section,)
        for rule in rules:
            if isinstance(rule, Mapping) and rule.get("id") == decision.rule:
                shown = source_as_given(rule["source"], policies) if policies else rule["source"]
                source = f" ({shown})"
    verdict = "allow" if decision.allowed else "deny"
    print(f"{verdict}: {args.skill} {args.action} {args.target}")
    print(f"  rule: {decision.rule}{source}")
    print(f"  why:  {decision.reason}")
    print(f"  instances: {instances_text(tables.limits(args.skill))}")
    return 0 if decision.allowed else 1
