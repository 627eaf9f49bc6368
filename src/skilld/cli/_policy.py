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
            "--bundle. With --caller CALLER, ask who may list and call what instead: "
            "'--caller token:ci tool.call notes/add' (tool, prompt, resource or skill; list "
            "or call). Exit status 0 when allowed, 1 when denied, 2 for a usage error."
        ),
    )
    exp.add_argument("skill", metavar="SKILL", help="the skill id (with --caller: KIND.ACTION)")
    exp.add_argument(
        "action",
        metavar="ACTION",
        help="CAPABILITY.ACTION, one of: fs.read, fs.write (fs.list, ...), http.get (any "
        "method), http.address, tcp.connect, tcp.address, shell.run, shell.cwd, env.read, "
        "invoke.call, transfer.send, transfer.fetch, kv.get (kv.set, ...), mcp.sample, "
        "mcp.elicit",
    )
    exp.add_argument(
        "target",
        metavar="TARGET",
        nargs="?",
        help="path, URL, HOST:PORT, command line, skill id, NAME (none with --caller)",
    )
    exp.add_argument(
        "--caller",
        metavar="CALLER",
        help="ask for this caller: local, anonymous, token:NAME or oauth:ISSUER#SUBJECT",
    )
    exp.add_argument(
        "--group", action="append", default=[], metavar="G", help="with --caller: a group claim"
    )
    exp.add_argument(
        "--scope", action="append", default=[], metavar="S", help="with --caller: a scope"
    )
    exp.add_argument(
        "--skill",
        dest="serving",
        metavar="ID",
        help="with --caller: the skill serving the target (default: read from its name: "
        "SKILL/METHOD, SCHEME://SKILL/...; needed for prompts and renamed tools)",
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
    from skilld.policy import instances_text

    if args.caller is not None:
        return _explain_caller(args)
    if args.target is None:
        raise UsageError("explain needs SKILL ACTION TARGET (or --caller CALLER KIND.ACTION NAME)")
    explain_action(args.action)  # a typo is a usage error before anything is compiled
    tables, policies = _tables_for(args)
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
                source = _shown(rule["source"], policies)
    verdict = "allow" if decision.allowed else "deny"
    print(f"{verdict}: {args.skill} {args.action} {args.target}")
    print(f"  rule: {decision.rule}{source}")
    print(f"  why:  {decision.reason}")
    print(f"  instances: {instances_text(tables.limits(args.skill))}")
    recorded = "recorded on its spans" if tables.records_arguments(args.skill) else "never recorded"
    print(f"  arguments and results: {recorded} (telemetry.record_arguments)")
    return 0 if decision.allowed else 1


def _shown(source: str, policies: Path | None) -> str:
    """`` (SOURCE)`` with the policies directory named as the user gave it."""
    from skilld.policy import source_as_given

    return f" ({source_as_given(source, policies) if policies else source})"


def _explain_caller(args: argparse.Namespace) -> int:
    """``explain --caller CALLER KIND.ACTION NAME``: may this caller list or call that?

    Raises:
        UsageError: a malformed caller, question or target.
    """
    from skilld.permissions import TARGET_KINDS, CallerPolicy, Target

    if args.target is not None:
        raise UsageError(
            "with --caller, ask KIND.ACTION NAME (e.g. tool.call notes/add)",
            hint=f"kinds: {', '.join(TARGET_KINDS)}; actions: list, call",
        )
    question, name = args.skill, args.action
    kind, _, action = question.partition(".")
    if kind not in TARGET_KINDS or action not in ("list", "call"):
        raise UsageError(
            f"unknown question {question!r}",
            hint=f"KIND.ACTION with KIND one of {', '.join(TARGET_KINDS)}, ACTION list or call",
        )
    caller = _caller_of(args.caller, frozenset(args.group), frozenset(args.scope))
    skill = args.serving or _serving(kind, name)
    tables, policies = _tables_for(args, note=False)
    policy = CallerPolicy.from_tables(tables)
    decision = policy.may(caller, action, Target(kind, name, skill))
    source = policy.source(decision.rule)
    verdict = "allow" if decision.allowed else "deny"
    print(f"{verdict}: {caller.key} {action} {kind} {name} (skill {skill})")
    print(f"  rule: {decision.rule}{_shown(source, policies) if source else ''}")
    print(f"  why:  {decision.reason}")
    return 0 if decision.allowed else 1


def _caller_of(text: str, groups: frozenset[str], scopes: frozenset[str]) -> Any:
    """A :class:`~skilld.types.Caller` from its key's spelling (``Caller.key``).

    Raises:
        UsageError: none of local, anonymous, token:NAME, oauth:ISSUER#SUBJECT.
    """
    from skilld.types import Caller

    kind, _, rest = text.partition(":")
    if text in ("local", "anonymous") and not (groups or scopes):
        return Caller.local("cli") if text == "local" else Caller.anonymous()
    if kind == "token" and rest and not groups:
        return Caller.token(rest, scopes)
    issuer, hash_, subject = rest.rpartition("#")
    if kind == "oauth" and hash_ and issuer and subject:
        return Caller.oauth(issuer, subject, scopes, groups)
    raise UsageError(
        f"bad caller {text!r}",
        hint="local, anonymous, token:NAME (with --scope) or oauth:ISSUER#SUBJECT "
        "(with --group, --scope)",
    )


def _serving(kind: str, name: str) -> str:
    """The skill serving a target, read from its name (``SKILL/METHOD``, ``S://SKILL/...``).

    Raises:
        UsageError: the name does not say (a prompt; pass --skill).
    """
    if kind == "skill":
        return name
    if kind == "tool":
        return name.split("/", 1)[0]
    if kind == "resource" and "://" in name:
        return name.split("://", 1)[1].split("/", 1)[0]
    raise UsageError(f"which skill serves {kind} {name!r}?", hint="name it with --skill ID")


def _tables_for(args: argparse.Namespace, *, note: bool = True) -> tuple[Tables, Path | None]:
    """The tables explain answers from, and the policies directory they were compiled from
    (``note``: say when no skills' needs narrow the grants; caller rules never depend on them).

    Raises:
        UsageError: --skills with compiled tables.
        PolicyError: the policies do not compile, or the tables cannot be read.
    """
    from skilld.policy import compile_policies, load_tables

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
        if skills_dir is None and note:
            print(
                f"note: no skills/ beside {policies}: every grant counts, needed or not "
                "('skilld build' keeps only what skills need; pass --skills DIR)",
                file=sys.stderr,
            )
        tables = compile_policies(policies, needs, needs_sources=sources).tables
    return tables, policies
