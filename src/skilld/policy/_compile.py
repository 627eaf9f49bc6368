"""Compile ``policies/`` (and each skill's declared needs) into :class:`Tables`.

Deny by default: a skill gets what its policy (plus ``defaults.yaml``) grants,
intersected with what it declares it needs when the needs are known. A need no
grant covers is a *problem* (the caller decides whether that is fatal); a grant
nobody needs is a *warning* and is left out of the tables.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from skilld.errors import PolicyError
from skilld.policy import patterns as p
from skilld.policy._callers import compile_callers
from skilld.policy._kits import compile_kits
from skilld.policy._schema import (
    CAPABILITY_SECTIONS,
    NEEDS_KEYS,
    POLICY_KEYS,
    Exposure,
    Grants,
    InvokeRule,
    Rule,
    parse_grants,
)
from skilld.policy._tables import FORMAT, Tables
from skilld.policy._yaml import load_yaml
from skilld.types import Limits

DEFAULTS = "defaults.yaml"


@dataclass(frozen=True, slots=True)
class Finding:
    """A non-fatal observation of the compiler: where, which skill, what."""

    location: str
    skill: str
    message: str

    def __str__(self) -> str:
        return f"{self.location}: {self.message}"


@dataclass(frozen=True, slots=True)
class CompileResult:
    """The tables, plus what the compiler noticed.

    ``problems``: needs that no grant covers (the skill will be refused at run
    time); ``warnings``: grants nobody needs, invoke cycles.
    """

    tables: Tables
    warnings: tuple[Finding, ...] = ()
    problems: tuple[Finding, ...] = ()

    @property
    def digest(self) -> str:
        """The tables' digest (sha256 of their canonical JSON)."""
        return self.tables.digest

    @property
    def tables_bytes(self) -> bytes:
        """The canonical JSON of the tables, as written to ``policy/tables.json``."""
        return self.tables.to_json().encode()

    def grants_of(self, skill_id: str) -> frozenset[str]:
        """The host interfaces the skill's component may import (see :meth:`Tables.interfaces`).

        Raises:
            PolicyError: no such skill in the tables.
        """
        return self.tables.interfaces(skill_id)

    def raise_for_problems(self) -> None:
        """Make problems fatal.

        Raises:
            PolicyError: listing every problem, located at the first.
        """
        if self.problems:
            first = self.problems[0]
            detail = "; ".join(str(f) for f in self.problems[1:])
            raise PolicyError(
                first.message + (f"; also: {detail}" if detail else ""),
                location=first.location,
                hint="grant the need in policies/, or drop it from the skill's needs",
            )


def _describe(rule: Rule) -> str:
    t = rule.table()
    for key in ("path", "url", "host", "program", "name"):
        if key in t:
            extra = f" ({t['mode']})" if "mode" in t else ""
            return f"{t[key]}{extra}"
    if isinstance(rule, InvokeRule):
        return f"calls {', '.join((*rule.calls, *rule.remote_calls)) or 'nothing'}"
    return "(its key-value namespace)"


def _intersect(
    skill: str,
    section: str,
    grants: Sequence[Rule],
    needs: Sequence[Rule],
    problems: list[Finding],
    used: set[str],
) -> list[Rule]:
    if section == "invoke" and not needs:
        # Who may call this skill is the operator's word alone; the skill's own
        # calls need a need.
        kept: list[Rule] = [
            replace(g, calls=(), remote_calls=())
            for g in grants
            if isinstance(g, InvokeRule) and (g.called_by or g.remote_called_by)
        ]
        used.update(
            g.id for g in grants if isinstance(g, InvokeRule) and not g.calls and not g.remote_calls
        )
        return kept
    out: list[Rule] = []
    for need in needs:
        full = next((g for g in grants if g.covers(need)), None)  # type: ignore[arg-type]
        if full is not None:
            out.append(full.meet(need, need))  # type: ignore[arg-type]
            used.add(full.id)
            continue
        part = [g for g in grants if need.covers(g)]  # type: ignore[arg-type]
        for g in part:
            out.append(g.meet(need, g))  # type: ignore[arg-type]
            used.add(g.id)
        # "'notes' needs env SECRET, which its policy has not granted"
        what = f"'{skill}' needs {section} {_describe(need)}"
        if part:
            by = ", ".join(g.id for g in part)
            problems.append(
                Finding(need.source, skill, f"{what}, which is only partly granted (by {by})")
            )
        else:
            problems.append(
                Finding(need.source, skill, f"{what}, which its policy has not granted")
            )
    unique: dict[str, Rule] = {}
    for rule in out:
        unique.setdefault(repr(rule.table()), rule)
    return list(unique.values())


def _read(path: Path, label: str) -> object:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(f"cannot read: {exc.strerror}", location=label) from exc
    return load_yaml(text, label)


def compile_policies(
    policy_dir: str | Path,
    skills: Mapping[str, Mapping[str, Any] | None] | None = None,
    *,
    needs_sources: Mapping[str, str] | None = None,
) -> CompileResult:
    """Compile every ``<skill>.yaml`` (plus ``defaults.yaml``) in ``policy_dir``.

    Args:
        policy_dir: the ``policies/`` directory; ``kits/*.yaml`` in it are delegate's kits
            (``skilld.policy._kits``), ``callers/*.yaml`` who may call what
            (``skilld.policy._callers``), other subdirectories (``trust/``) are ignored.
        skills: when given, the known skills and their declared needs (``None``: not
            declared, take the grants as they are). A policy for a skill not in it,
            or an invoke reference to one, is an error.
        needs_sources: where each skill's needs were read (for locations).

    Raises:
        PolicyError: with ``file:line`` for the first thing that cannot compile.
    """
    root = Path(policy_dir)
    if not root.is_dir():
        raise PolicyError("not a directory", location=str(policy_dir))
    # The tables record each rule's source as `policies/x.yaml:LINE`, the same wherever the
    # directory sits (the bundle digest must not depend on it); what the user reads names
    # the directory as they gave it.
    documents: dict[str, tuple[str, object]] = {}
    try:
        for path in sorted(root.iterdir()):
            if path.is_file() and path.suffix in (".yaml", ".yml"):
                label = f"{root.name}/{path.name}"
                documents[path.name] = (label, _read(path, label))
        kits: dict[str, tuple[str, object]] = {}
        if (root / "kits").is_dir():
            for path in sorted((root / "kits").iterdir()):
                if path.is_file() and path.suffix in (".yaml", ".yml"):
                    label = f"{root.name}/kits/{path.name}"
                    kits[path.name] = (label, _read(path, label))
        callers = {}
        if (root / "callers").is_dir():
            for path in sorted((root / "callers").iterdir()):
                if path.is_file() and path.suffix in (".yaml", ".yml"):
                    label = f"{root.name}/callers/{path.name}"
                    callers[path.name] = (label, _read(path, label))
        result = compile_documents(
            documents, skills, needs_sources=needs_sources, kits=kits, callers=callers
        )
    except PolicyError as exc:
        exc.location = source_as_given(exc.location, policy_dir)
        raise
    return replace(
        result,
        warnings=tuple(_relocate(f, policy_dir) for f in result.warnings),
        problems=tuple(_relocate(f, policy_dir) for f in result.problems),
    )


def source_as_given(source: str | None, policy_dir: str | Path) -> str | None:
    """A rule's ``source`` (``policies/x.yaml:LINE``) with the directory named as given.

    The tables keep ``policies/x.yaml:6`` wherever the directory is; a user who passed
    ``mine/policies`` reads ``mine/policies/x.yaml:6``. Other locations pass unchanged.
    """
    stable = f"{Path(policy_dir).name}/"
    if source is not None and source.startswith(stable):
        return f"{str(policy_dir).rstrip('/') or '/'}/{source.removeprefix(stable)}"
    return source


def _relocate(finding: Finding, policy_dir: str | Path) -> Finding:
    return replace(finding, location=source_as_given(finding.location, policy_dir) or "")


def compile_documents(
    documents: Mapping[str, tuple[str, object]],
    skills: Mapping[str, Mapping[str, Any] | None] | None = None,
    *,
    needs_sources: Mapping[str, str] | None = None,
    kits: Mapping[str, tuple[str, object]] | None = None,
    callers: Mapping[str, tuple[str, object]] | None = None,
) -> CompileResult:
    """Compile parsed documents: file name → ``(label, parsed YAML)``; ``kits`` and
    ``callers`` likewise.

    Raises:
        PolicyError: as :func:`compile_policies`.
    """
    defaults = Grants("defaults", {})
    policies: dict[str, Grants] = {}
    for name, (label, doc) in sorted(documents.items()):
        stem = name.rsplit(".", 1)[0]
        if name in (DEFAULTS, "defaults.yml"):
            allowed = tuple(k for k in POLICY_KEYS if k not in ("skill", "invoke"))
            defaults = parse_grants(doc, "defaults", label, allowed=allowed)
            continue
        if not p.SKILL_ID.match(stem):
            raise PolicyError(
                f"'{stem}' is not a valid skill id",
                location=f"{label}:1",
                hint="name the file <skill-id>.yaml: lowercase letters, digits, '.', '_', '-'",
            )
        grants = parse_grants(doc, stem, label)
        declared = doc.get("skill") if isinstance(doc, Mapping) else None
        if declared is not None and declared != stem:
            line = grants.lines.get("skill", 1)
            raise PolicyError(
                f"skill: '{declared}' does not match the file name '{name}'",
                location=f"{label}:{line}",
            )
        if skills is not None and stem not in skills:
            raise PolicyError(
                f"policy for unknown skill '{stem}'",
                location=f"{label}:{grants.lines.get('skill', 1)}",
                hint=_known_hint(stem, skills),
            )
        policies[stem] = grants
    known = sorted(set(policies) | set(skills or ()))
    warnings: list[Finding] = _check_invoke_refs(policies, skills)
    problems: list[Finding] = []
    unused_defaults: dict[str, str] | None = None
    out: dict[str, Any] = {}
    for skill in known:
        own = policies.get(skill, Grants(f"{skill} (no policy)", {}))
        raw_needs = skills.get(skill) if skills is not None else None
        needs = None
        if raw_needs is not None:
            source = (needs_sources or {}).get(skill, f"needs of {skill}")
            needs = parse_grants(raw_needs, skill, source, allowed=NEEDS_KEYS)
        used: set[str] = set()
        table: dict[str, Any] = {}
        for section in CAPABILITY_SECTIONS:
            granted = [*defaults.rules.get(section, ()), *own.rules.get(section, ())]
            if needs is None:
                effective = granted
            else:
                effective = _intersect(
                    skill, section, granted, needs.rules.get(section, ()), problems, used
                )
            if section in ("invoke", "kv"):
                table[section] = effective[0].table() if effective else None
            else:
                table[section] = [r.table() for r in effective]
        if needs is not None:
            for section in CAPABILITY_SECTIONS:
                for g in own.rules.get(section, ()):
                    if g.id not in used:
                        warnings.append(
                            Finding(
                                g.source,
                                skill,
                                f"{g.id} is granted but '{skill}' does not need it; left out",
                            )
                        )
            mine = {
                g.id: g.source
                for rules in defaults.rules.values()
                for g in rules
                if g.id not in used
            }
            unused_defaults = (
                mine
                if unused_defaults is None
                else {k: v for k, v in unused_defaults.items() if k in mine}
            )
        limits = asdict(Limits())
        limits.update(defaults.limits)
        limits.update(own.limits)
        exposure = Exposure(**{**defaults.mcp, **own.mcp})
        if needs is not None:
            wanted = tuple(needs.mcp.get("client", ()))
            missing = [c for c in wanted if c not in exposure.client]
            if missing:
                where = needs.lines.get("mcp", 0)
                problems.append(
                    Finding(
                        f"{needs.source}:{where}" if where else needs.source,
                        skill,
                        f"mcp client feature(s) {', '.join(missing)} not granted to '{skill}'",
                    )
                )
            exposure = replace(exposure, client=tuple(c for c in exposure.client if c in wanted))
        table["limits"] = limits
        table["mcp"] = exposure.table()
        if own.scripts or defaults.scripts:
            table["scripts"] = {**defaults.scripts, **own.scripts}
        # Only when written, so that the tables (and bundle digests) of a policy without
        # it are what they were.
        if own.telemetry or defaults.telemetry:
            table["telemetry"] = {**defaults.telemetry, **own.telemetry}
        table["needs_checked"] = needs is not None
        out[skill] = table
    for rid, source in sorted((unused_defaults or {}).items()):
        warnings.append(Finding(source, "defaults", f"{rid} is granted but no skill needs it"))
    kit_tables = compile_kits(kits or {}, out)
    warnings += _cycles(out)
    data: dict[str, Any] = {"format": FORMAT, "skills": out}
    if kit_tables:
        data["kits"] = kit_tables
    caller_table, caller_notes = compile_callers(
        callers or {}, out if skills is not None else None
    )
    warnings += [Finding(where, "callers", message) for where, message in caller_notes]
    if caller_table is not None:
        data["callers"] = caller_table
    tables = Tables.from_data(data)
    return CompileResult(tables, tuple(warnings), tuple(problems))


def _known_hint(name: str, skills: Mapping[str, object]) -> str:
    close = difflib.get_close_matches(name, list(skills), n=1)
    if close:
        return f"did you mean '{close[0]}'?"
    return f"known skills: {', '.join(sorted(skills)) or 'none'}"


def _check_invoke_refs(
    policies: Mapping[str, Grants], skills: Mapping[str, object] | None
) -> list[Finding]:
    """Errors for invoke references to unknown skills; warnings for likely remote typos.

    Raises:
        PolicyError: ``calls``/``called_by`` name a skill not in the bundle, or
            ``remote_calls`` names one that is.
    """
    found: list[Finding] = []
    if skills is None:
        return found
    for skill, grants in policies.items():
        for rule in grants.rules.get("invoke", ()):
            assert isinstance(rule, InvokeRule)
            for key in ("calls", "called_by"):
                for ref in getattr(rule, key):
                    if ref != "*" and ref not in skills:
                        line = rule.lines.get(key, 0)
                        source = rule.source.rsplit(":", 1)[0]
                        raise PolicyError(
                            f"invoke.{key} names unknown skill '{ref}'",
                            location=f"{source}:{line}" if line else rule.source,
                            hint=_known_hint(ref, skills),
                        )
            # A remote callee is one this bundle does not hold: naming a local skill
            # there is a mistake (it would bypass the callee's called_by).
            for ref in rule.remote_calls:
                line = rule.lines.get("remote_calls", 0)
                where = f"{rule.source.rsplit(':', 1)[0]}:{line}" if line else rule.source
                close = difflib.get_close_matches(ref, list(skills), n=1, cutoff=0.75)
                if ref not in skills and close:
                    # Not provable here (the cluster decides what exists), but likely a typo.
                    found.append(
                        Finding(
                            where,
                            skill,
                            f"invoke.remote_calls names '{ref}', close to this bundle's "
                            f"'{close[0]}': a typo? (a remote name is only checked at call time)",
                        )
                    )
                if ref in skills:
                    raise PolicyError(
                        f"invoke.remote_calls names '{ref}', a skill of this bundle",
                        location=where,
                        hint=f"move '{ref}' to invoke.calls (remote_calls is for skills "
                        "only other nodes of the cluster hold)",
                    )
    return found


def _cycles(skills: Mapping[str, Any]) -> list[Finding]:
    graph: dict[str, list[str]] = {}
    for sid, table in skills.items():
        inv = table.get("invoke")
        calls = inv["calls"] if inv else []
        graph[sid] = [c for c in calls if _consents(skills.get(c), sid)]
    found: list[Finding] = []
    seen: set[frozenset[str]] = set()

    def walk(node: str, path: list[str]) -> None:
        for nxt in graph.get(node, []):
            if nxt in path:
                cycle = path[path.index(nxt) :]
                key = frozenset(cycle)
                if key not in seen:
                    seen.add(key)
                    ring = " → ".join([*cycle, nxt])
                    found.append(
                        Finding(
                            skills[nxt]["invoke"]["source"],
                            nxt,
                            f"invoke cycle {ring}: bounded only by max_depth",
                        )
                    )
            else:
                walk(nxt, [*path, nxt])

    for sid in sorted(graph):
        walk(sid, [sid])
    return found


def _consents(callee: Mapping[str, Any] | None, caller: str) -> bool:
    inv = callee.get("invoke") if callee else None
    if not inv:
        return False
    return caller in inv["called_by"] or "*" in inv["called_by"]
