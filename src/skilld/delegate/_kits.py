"""Kits as the service sees them: read from the compiled tables, never from YAML."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from skilld.errors import DelegateError
from skilld.policy import D_LEVELS, W_LEVELS, Tables


@dataclass(frozen=True, slots=True)
class Grade:
    """A kit's Grade(w, d): world coupling and effects ceiling, from compiled grants.

    ``why`` lists the grants that set it (``skill: grant``), ``skills`` every skill
    a program over the kit can reach (its tools' skills and whom they may invoke).
    """

    w: int
    d: int
    why: tuple[str, ...]
    skills: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        """The JSON form reported in every result."""
        return {
            "w": self.w,
            "d": self.d,
            "label": f"Grade({self.w}, {self.d})",
            "w_means": W_LEVELS[self.w],
            "d_means": D_LEVELS[self.d],
            "from": list(self.why),
        }


@dataclass(frozen=True, slots=True)
class KitTool:
    """One function of a kit: the skill method it calls and its parameters in order."""

    name: str
    skill: str
    method: str
    params: tuple[str, ...]
    description: str


@dataclass(frozen=True, slots=True)
class Pattern:
    """A template (a regex over the whole intent) or a keyword rule, and its program."""

    id: str
    program: str
    params: tuple[str, ...]
    source: str
    regex: re.Pattern[str] | None = None
    keywords: tuple[str, ...] = ()
    captures: tuple[tuple[str, re.Pattern[str]], ...] = ()

    def match(self, intent: str) -> dict[str, str | None] | None:
        """The program's parameters when ``intent`` matches this entry, else None."""
        text = " ".join(intent.split())
        if self.regex is not None:
            m = self.regex.fullmatch(text)
            return None if m is None else dict(m.groupdict())
        words = set(re.findall(r"[\w.-]+", text.lower()))
        if not all(k in words for k in self.keywords):
            return None
        found: dict[str, str | None] = {}
        for name, regex in self.captures:
            cm = regex.search(text)
            found[name] = cm.group(name) if cm else None
        return found


@dataclass(frozen=True, slots=True)
class Kit:
    """A compiled kit: its tools, inference patterns, caps and grade."""

    name: str
    description: str
    runner: str
    tools: Mapping[str, KitTool]
    grade: Grade
    templates: tuple[Pattern, ...]
    rules: tuple[Pattern, ...]
    max_calls: int
    max_output: int
    timeout_ms: int
    memory_bytes: int
    source: str

    def info(self) -> dict[str, Any]:
        """What ``kit_info`` returns."""
        return {
            "kit": self.name,
            "description": self.description,
            "grade": self.grade.as_dict(),
            "tools": {
                t.name: {
                    "calls": f"{t.skill}/{t.method}",
                    "params": list(t.params),
                    "description": t.description,
                }
                for t in self.tools.values()
            },
            "limits": {
                "tool_calls": self.max_calls,
                "output_bytes": self.max_output,
                "wall_time_ms": self.timeout_ms,
                "memory_bytes": self.memory_bytes,
            },
            "templates": [{"id": t.id, "pattern": _pattern(t)} for t in self.templates],
            "rules": [{"id": r.id, "keywords": list(r.keywords)} for r in self.rules],
        }


def _pattern(entry: Pattern) -> str:
    return entry.regex.pattern if entry.regex is not None else ""


def load_kits(tables: Tables, methods: Mapping[str, Sequence[Any]]) -> dict[str, Kit]:
    """Every kit of ``tables``; ``methods`` by skill id (``MethodSpec``s) give parameter order.

    Raises:
        DelegateError: a kit names a method the skill does not describe.
    """
    out: dict[str, Kit] = {}
    for name, raw in sorted(tables.kits.items()):
        tools: dict[str, KitTool] = {}
        for func, t in raw["tools"].items():
            spec = next((m for m in methods.get(t["skill"], ()) if m.name == t["method"]), None)
            if spec is None:
                raise DelegateError(
                    f"kit '{name}' tool '{func}' names {t['skill']}/{t['method']}, which is "
                    "not a method of a loaded skill",
                    location=t["source"],
                )
            # Positional arguments bind the required parameters in their declared order (the
            # lock keeps "required" as a list; "properties" comes back sorted); optional
            # ones are passed by name.
            required = tuple(str(r) for r in spec.params_schema.get("required") or ())
            tools[func] = KitTool(func, t["skill"], t["method"], required, spec.description)
        g = raw["grade"]
        lim = raw["limits"]
        out[name] = Kit(
            name=name,
            description=raw["description"],
            runner=raw["runner"],
            tools=tools,
            grade=Grade(g["w"], g["d"], tuple(g["why"]), tuple(g["skills"])),
            templates=tuple(_entry(e) for e in raw["templates"]),
            rules=tuple(_entry(e) for e in raw["rules"]),
            max_calls=lim["tool_calls"],
            max_output=lim["output_bytes"],
            timeout_ms=lim["timeout_ms"],
            memory_bytes=lim["memory_bytes"],
            source=raw["source"],
        )
    return out


def _entry(raw: Mapping[str, Any]) -> Pattern:
    flags = re.IGNORECASE
    return Pattern(
        id=raw["id"],
        program=raw["program"],
        params=tuple(raw["params"]),
        source=raw["source"],
        regex=re.compile(raw["pattern"], flags) if "pattern" in raw else None,
        keywords=tuple(raw.get("keywords", ())),
        captures=tuple((k, re.compile(v, flags)) for k, v in raw.get("captures", {}).items()),
    )
