"""Kits: named sets of skill methods a delegated program may call, compiled with the policy.

A kit is ``policies/kits/<name>.yaml`` (docs/delegate.md)::

    kit: notes
    description: Read and write short notes.
    tools:                     # function name in the program -> skill/method
      add: notes/add
      titles: notes/list
    limits: {wall_time: 5s, memory: 128MiB, tool_calls: 16, output: 64KiB}
    templates:                 # intent patterns -> programs; captures become parameters
      - id: add-note
        pattern: 'add a note (?P<title>\\w+) saying (?P<body>.+)'
        program: |
          add(title=title, body=body)
          result = titles()
    rules:                     # every keyword in the intent -> a program
      - id: list
        keywords: [list, notes]
        program: result = titles()

Compiling a kit adds to the tables: ``kits[<name>]`` (tools, templates, rules, caps
and the kit's :func:`grade`), a runner entry ``skills["kit.<name>"]`` whose only
grant is ``invoke`` of the kit's skills (the runner component runs under it), the
kit's consent on each callee (``called_by``: declaring a kit over a skill's method is
the operator allowing that call), and ``skills["pyrunner"]`` for the component's
load-time import check.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping
from dataclasses import asdict
from typing import Any

from skilld.errors import PolicyError
from skilld.policy import patterns as p
from skilld.policy._schema import (
    Exposure,
    Where,
    _check_keys,
    _fail,
    _line,
    _list,
    _mapping,
    _str_list,
)
from skilld.types import Limits

RUNNER = "pyrunner"
RUNNER_METHOD = "run_program"
KIT_PREFIX = "kit."
_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}\Z")
_FUNC = re.compile(r"^[a-z][a-z0-9_]{0,31}\Z")
# An entry of templates / rules: (keys it takes, keys it needs).
_ENTRY_KEYS = {
    "templates": (("id", "pattern", "program"), ("id", "pattern", "program")),
    "rules": (("id", "keywords", "captures", "program"), ("id", "keywords", "program")),
}
# A keyword is one word as the rules tier splits an intent into words.
_KEYWORD = re.compile(r"^[\w.-]+\Z")
_KIT_KEYS = ("kit", "description", "tools", "limits", "templates", "rules")
_MAX_CALLS = 16
_MAX_OUTPUT = 64 * 1024
_KIT_LIMITS = Limits(memory_bytes=128 * 1024 * 1024, timeout_ms=10_000)
_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

# Grade levels, in docs/delegate.md's words.
W_LEVELS = ("pure", "read-only access", "runs commands", "writes")
D_LEVELS = ("no effects", "its own state", "this host", "other systems")


def kit_runner_id(kit: str) -> str:
    """The skill id of a kit's runner entry in the tables and the registry."""
    return KIT_PREFIX + kit


def grade_of(table: Mapping[str, Any]) -> tuple[int, int, list[str]]:
    """(w, d, reasons) of one skill's effective grants (docs/delegate.md, "Grades").

    w, world coupling: 0 pure; 1 read-only access (fs ro, http GET/HEAD/OPTIONS, env);
    2 runs commands (shell); 3 writes (fs rw, kv, other http methods, tcp, transfer).
    d, effects ceiling: 0 none; 1 the skill's own state (kv); 2 this host (fs rw,
    shell); 3 other systems (http methods other than GET/HEAD/OPTIONS, tcp, transfer).
    """
    w, d, why = 0, 0, []

    def bump(nw: int, nd: int, reason: str) -> None:
        nonlocal w, d
        w, d = max(w, nw), max(d, nd)
        why.append(reason)

    for rule in table.get("fs") or ():
        if rule.get("mode") == "rw":
            bump(3, 2, f"fs rw {rule.get('path')}")
        else:
            bump(1, 0, f"fs ro {rule.get('path')}")
    for rule in table.get("http") or ():
        methods = set(rule.get("methods") or ("GET",))
        if methods - _READ_METHODS:
            bump(3, 3, f"http {'/'.join(sorted(methods))} {rule.get('url')}")
        else:
            bump(1, 0, f"http read {rule.get('url')}")
    if table.get("env"):
        bump(1, 0, "env")
    if table.get("shell"):
        bump(2, 2, "shell " + ", ".join(str(r.get("program")) for r in table["shell"]))
    if table.get("kv"):
        bump(3, 1, "kv")
    if table.get("tcp"):
        bump(3, 3, "tcp")
    if table.get("transfer"):
        bump(3, 3, "transfer")
    return w, d, why


def _closure(skills: Mapping[str, Any], roots: set[str]) -> list[str]:
    """``roots`` and every skill they may invoke, transitively (a grade covers the chain)."""
    seen: list[str] = []
    todo = sorted(roots)
    while todo:
        sid = todo.pop()
        if sid in seen or sid not in skills:
            continue
        seen.append(sid)
        inv = skills[sid].get("invoke")
        todo.extend(inv["calls"] if inv else ())
    return sorted(seen)


def compile_kits(
    documents: Mapping[str, tuple[str, object]],
    skills: MutableMapping[str, Any],
) -> dict[str, Any]:
    """Compile kit documents (file name -> (label, YAML)) against the compiled ``skills``.

    Adds each kit's runner entry, its consent on callees and the ``pyrunner`` entry
    to ``skills``; returns the ``kits`` table.

    Raises:
        PolicyError: a malformed kit, an unknown skill, a bad pattern (``file:line``).
    """
    kits: dict[str, Any] = {}
    for name, (label, doc) in sorted(documents.items()):
        stem = name.rsplit(".", 1)[0]
        where = Where(label, 1)
        if not _NAME.match(stem):
            raise _fail(where, f"'{stem}' is not a valid kit name", "lowercase, digits, _ and -")
        m = _mapping(doc, where, "a kit")
        _check_keys(m, _KIT_KEYS, where, "a kit", required=("tools",))
        if m.get("kit", stem) != stem:
            raise _fail(_line(m, "kit", where), f"kit: '{m['kit']}' does not match '{name}'")
        kits[stem] = _kit(stem, m, where, skills)
    if not kits:
        return kits
    callers: dict[str, set[str]] = {}
    for kit in kits.values():
        own = sorted({t["skill"] for t in kit["tools"].values()})
        for sid in own:
            callers.setdefault(sid, set()).add(kit["runner"])
        skills[kit["runner"]] = _runner_table(kit["runner"], own, kit["source"], kit["limits"])
    for sid, runners in sorted(callers.items()):
        _consent(skills[sid], runners)
    skills[RUNNER] = _runner_table(RUNNER, sorted(callers), "kits", None)
    return kits


def _kit(name: str, m: Mapping[str, Any], where: Where, skills: Mapping[str, Any]) -> Any:
    tools_where = _line(m, "tools", where)
    tools: dict[str, Any] = {}
    for func, target in _mapping(m["tools"], tools_where, "tools").items():
        at = _line(m["tools"], func, tools_where)
        if not _FUNC.match(func):
            raise _fail(at, f"'{func}' is not a valid function name", "lowercase, digits and _")
        if not isinstance(target, str) or target.count("/") != 1:
            raise _fail(at, f"tool '{func}' must name skill/method, got {target!r}")
        sid, method = target.split("/")
        if sid not in skills or sid == RUNNER or sid.startswith(KIT_PREFIX):
            known = ", ".join(s for s in sorted(skills) if not s.startswith(KIT_PREFIX))
            raise _fail(at, f"tool '{func}' names unknown skill '{sid}'", f"known: {known}")
        tools[func] = {"skill": sid, "method": method, "source": str(at)}
    if not tools:
        raise _fail(tools_where, "a kit needs at least one tool")
    reach = _closure(skills, {t["skill"] for t in tools.values()})
    w, d, why = 0, 0, []
    for sid in reach:
        sw, sd, reasons = grade_of(skills[sid])
        w, d = max(w, sw), max(d, sd)
        why += [f"{sid}: {r}" for r in reasons]
    return {
        "source": str(where),
        "description": str(m.get("description") or f"the tools of kit {name}"),
        "runner": kit_runner_id(name),
        "tools": tools,
        "grade": {"w": w, "d": d, "why": why, "skills": reach},
        "limits": _kit_limits(m, where),
        "templates": _patterns(m, "templates", where, set(tools)),
        "rules": _patterns(m, "rules", where, set(tools)),
    }


def _kit_limits(m: Mapping[str, Any], where: Where) -> dict[str, int]:
    out = {
        "memory_bytes": _KIT_LIMITS.memory_bytes,
        "timeout_ms": _KIT_LIMITS.timeout_ms,
        "tool_calls": _MAX_CALLS,
        "output_bytes": _MAX_OUTPUT,
    }
    if "limits" not in m:
        return out
    lw = _line(m, "limits", where)
    lm = _mapping(m["limits"], lw, "limits")
    _check_keys(lm, ("memory", "wall_time", "tool_calls", "output"), lw, "kit limits")
    parsers = {
        "memory": ("memory_bytes", p.parse_size),
        "wall_time": ("timeout_ms", p.parse_duration_ms),
        "output": ("output_bytes", p.parse_size),
        "tool_calls": ("tool_calls", _count),
    }
    for key, value in lm.items():
        field, parse = parsers[key]
        try:
            out[field] = parse(value)
        except ValueError as exc:
            raise _fail(_line(lm, key, lw), f"limits.{key}: {exc}") from exc
    return out


def _count(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 1000:
        return value
    raise ValueError(f"bad count {value!r}: a whole number 1..1000")


def _patterns(m: Mapping[str, Any], key: str, where: Where, tools: set[str]) -> list[Any]:
    if key not in m:
        return []
    kw = _line(m, key, where)
    out = []
    for i, item in enumerate(_list(m[key], kw, key)):
        at = _line(m[key], i, kw)
        im = _mapping(item, at, f"an entry of {key}")
        allowed, need = _ENTRY_KEYS[key]
        _check_keys(im, allowed, at, f"an entry of {key}", required=need)
        program = im["program"]
        if not isinstance(program, str) or not program.strip():
            raise _fail(_line(im, "program", at), "program must be non-empty text")
        entry: dict[str, Any] = {"id": str(im["id"]), "program": program, "source": str(at)}
        names: set[str] = set()
        if key == "templates":
            regex = _regex(im["pattern"], _line(im, "pattern", at))
            entry["pattern"] = regex.pattern
            names = set(regex.groupindex)
        else:
            kw_at = _line(im, "keywords", at)
            words = _str_list(im["keywords"], kw_at, "a keyword")
            for word in words:
                if not _KEYWORD.match(word):
                    raise _fail(kw_at, f"keyword {word!r} must be one word (letters, digits, _.-)")
            entry["keywords"] = [w.lower() for w in words]
            caps: dict[str, str] = {}
            if "captures" in im:
                cw = _line(im, "captures", at)
                for cname, cpat in _mapping(im["captures"], cw, "captures").items():
                    regex = _regex(cpat, _line(im["captures"], cname, cw))
                    if list(regex.groupindex) != [cname]:
                        raise _fail(cw, f"capture '{cname}' needs one group named (?P<{cname}>...)")
                    caps[cname] = regex.pattern
            entry["captures"] = caps
            names = set(caps)
        clash = sorted(names & tools)
        if clash:
            raise _fail(at, f"capture '{clash[0]}' has the name of a kit tool")
        entry["params"] = sorted(names)
        out.append(entry)
    return out


def _regex(value: object, where: Where) -> re.Pattern[str]:
    if not isinstance(value, str) or not value:
        raise _fail(where, f"a pattern must be non-empty text, got {value!r}")
    try:
        regex = re.compile(value, re.IGNORECASE)
    except re.error as exc:
        raise _fail(where, f"bad pattern: {exc}") from exc
    for group in regex.groupindex:
        if not _FUNC.match(group):
            raise _fail(where, f"capture name '{group}' must be lowercase, digits and _")
    return regex


def _runner_table(
    sid: str, calls: list[str], source: str, limits: Mapping[str, int] | None
) -> dict[str, Any]:
    base = asdict(Limits())
    if limits is not None:
        base.update(memory_bytes=limits["memory_bytes"], timeout_ms=limits["timeout_ms"])
    return {
        "fs": [],
        "http": [],
        "tcp": [],
        "shell": [],
        "env": [],
        "transfer": [],
        "kv": None,
        "invoke": {
            "id": f"{sid}.invoke",
            "source": source,
            "calls": calls,
            "called_by": [],
            "max_depth": 4,
        },
        "limits": base,
        # The runner's method is reached only through delegate, never as an MCP tool.
        "mcp": Exposure(hidden=(RUNNER_METHOD,)).table(),
        "needs_checked": True,
    }


def _consent(table: MutableMapping[str, Any], runners: set[str]) -> None:
    """Let the kits' runners call this skill (its own ``calls`` stay as they were)."""
    inv = dict(table.get("invoke") or {})
    if not inv:
        inv = {"id": "kits.consent", "source": "kits", "calls": [], "max_depth": 4}
    inv["called_by"] = sorted(set(inv.get("called_by", [])) | runners)
    table["invoke"] = inv


def check_kit_methods(kits: Mapping[str, Any], methods: Mapping[str, set[str]]) -> None:
    """Refuse a kit tool naming a method its skill does not have (``methods``: by skill id).

    Raises:
        PolicyError: at the tool's ``file:line``.
    """
    for kit in kits.values():
        for func, tool in kit["tools"].items():
            have = methods.get(tool["skill"], set())
            if tool["method"] not in have:
                raise PolicyError(
                    f"kit tool '{func}' names method '{tool['method']}', which skill "
                    f"'{tool['skill']}' does not have",
                    location=tool["source"],
                    hint=f"methods: {', '.join(sorted(have)) or 'none'}",
                )
