"""The catalogue: loaded skills, their tools, resources and prompts, and tool naming.

What a name means: :meth:`Catalogue.add` and :meth:`Catalogue.remove` change the skills
(a cluster's remote skills come and go while serving), :meth:`Catalogue.resolve` turns a
tool name and its arguments into (skill, method, arguments), :meth:`Catalogue.view` is
what one caller may list and call (``_access.py``). Running a call is ``_dispatch.py``'s.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from skilld.call import CallGate
from skilld.errors import GuestError, RegistryError, UsageError
from skilld.permissions import CallerPolicy
from skilld.policy import Exposure
from skilld.registry._access import CallerView
from skilld.registry._contract import AnswersInline, SkillBackend, Tool, ToolAnnotations
from skilld.types import (
    Caller,
    KeyValueStore,
    Limits,
    MethodSpec,
    PermissionChecker,
    PromptSpec,
    ResourceSpec,
    SkillSpec,
)

_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Keywords whose value maps names to subschemas (every other object value is one schema).
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions"})
# Keywords whose value is data, never a schema: a "$ref" key inside is not a reference.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})


def annotations_for(grants: Mapping[str, Any]) -> ToolAnnotations:
    """MCP tool hints from a skill's *effective* grants (its policy table), never its claims.

    Read-only: no rw files, no state, no shell, no non-GET HTTP, no TCP, no transfer, no invoke.
    Destructive: it may change or delete (rw files, state, shell, transfer, invoke).
    Open world: it reaches other systems (HTTP, TCP, transfer, invoke).

    ``invoke`` counts as all of these: the skills it may call can hold any grant,
    and the hints must not promise more than the whole call chain keeps.
    """
    rw_files = any(rule.get("mode") == "rw" for rule in grants.get("fs") or ())
    writes_http = any(
        set(rule.get("methods") or ("GET",)) - _READ_METHODS for rule in grants.get("http") or ()
    )
    invokes = bool((grants.get("invoke") or {}).get("calls"))
    changes = bool(
        rw_files or grants.get("kv") or grants.get("shell") or grants.get("transfer") or invokes
    )
    open_world = bool(grants.get("http") or grants.get("tcp") or grants.get("transfer") or invokes)
    read_only = not (changes or writes_http or grants.get("tcp"))
    return ToolAnnotations(
        read_only=read_only, destructive=changes, idempotent=read_only, open_world=open_world
    )


@dataclass
class SkillEntry:
    """One loaded skill and everything its calls need."""

    spec: SkillSpec
    # A wasm Component in the sandbox, or any other backend (host-implemented, remote).
    component: SkillBackend
    limits: Limits = field(default_factory=Limits)
    kv: KeyValueStore | None = None
    checker: PermissionChecker | None = None
    exposure: Exposure = field(default_factory=Exposure)
    annotations: ToolAnnotations = field(
        default_factory=lambda: ToolAnnotations(
            read_only=False, destructive=True, idempotent=False, open_world=True
        )
    )
    description: str | None = None  # from the signed manifest, when there is one
    services: dict[str, Any] = field(default_factory=dict)
    # policy telemetry.record_arguments: its calls' spans carry arguments and results
    record_arguments: bool = False

    def __post_init__(self) -> None:
        # The skill's one concurrency gate (policy ``max_concurrency``), whoever calls.
        self.gate = CallGate(self.spec.id, self.limits.max_concurrency)


class Catalogue:
    """Skills by id, tools by name, resources and prompts by owner."""

    def __init__(self) -> None:
        self._skills: dict[str, SkillEntry] = {}
        self._tools: dict[str, tuple[Tool, str, str | None]] = {}
        self._ready = False
        # Skills come and go while serving (a cluster's remote skills): add and remove
        # replace the two maps whole under this lock, so readers on other threads never
        # see one half-changed and never need the lock.
        self._changing = threading.Lock()
        self._watchers: list[Callable[[], None]] = []
        self._gauges: list[Callable[[], Mapping[str, tuple[str, float]]]] = []
        # Who may list and call what: the bundle's caller rules (the node sets them); until
        # then, those of a bundle without any (local and anonymous callers only).
        self._callers = CallerPolicy()

    def use_callers(self, policy: CallerPolicy) -> None:
        """Answer who may list and call what from ``policy`` (the bundle's compiled rules)."""
        self._callers = policy

    def view(self, caller: Caller) -> CallerView:
        """What ``caller`` may list, and the decision for each call it makes."""
        return CallerView(self._callers, caller, self)

    def add(self, entry: SkillEntry) -> None:
        """Register a loaded skill and its tools.

        Raises:
            RegistryError: the skill id or one of its tool names is taken.
        """
        sid = entry.spec.id
        with self._changing:
            if sid in self._skills:
                raise RegistryError(f"skill '{sid}' is registered twice")
            tools = list(self._tools_of(entry))
            for tool, _method in tools:
                if tool.name in self._tools:
                    raise RegistryError(
                        f"tool name '{tool.name}' of skill '{sid}' is already taken "
                        f"by skill '{self._tools[tool.name][1]}'",
                        hint="rename it in the policy's mcp.names",
                    )
            self._skills = {**self._skills, sid: entry}
            self._tools = {**self._tools, **{t.name: (t, sid, m) for t, m in tools}}
        if self._ready:
            self._changed()

    def remove(self, skill_id: str) -> SkillEntry:
        """Unregister a skill and its tools (a cluster node that left); returns its entry.

        Calls already running keep their entry and finish; new calls find no such tool.

        Raises:
            RegistryError: no skill ``skill_id`` is registered.
        """
        with self._changing:
            entry = self._skills.get(skill_id)
            if entry is None:
                raise RegistryError(f"no skill named '{skill_id}'")
            self._skills = {k: v for k, v in self._skills.items() if k != skill_id}
            self._tools = {k: v for k, v in self._tools.items() if v[1] != skill_id}
        self._changed()
        return entry

    def watch(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on the changing thread) whenever skills are added or removed
        after the registry is ready: the MCP layer sends ``list_changed`` notifications."""
        self._watchers.append(callback)

    def add_gauges(self, source: Callable[[], Mapping[str, tuple[str, float]]]) -> None:
        """Report ``source()``'s gauges (name -> (help, value)) with :meth:`gauges`: the
        cluster's membership shows in /metrics this way."""
        self._gauges.append(source)

    def gauges(self) -> dict[str, tuple[str, float]]:
        """The gauges of every source added, by name."""
        return {name: value for source in self._gauges for name, value in source().items()}

    def _changed(self) -> None:
        for callback in list(self._watchers):
            callback()

    def mark_ready(self) -> None:
        """Every skill is loaded: /readyz may say so."""
        self._ready = True

    def _tools_of(self, entry: SkillEntry) -> Sequence[tuple[Tool, str | None]]:
        spec, exp = entry.spec, entry.exposure
        methods = [m for m in spec.methods if m.name not in exp.hidden]
        component = entry.component
        inline = isinstance(component, AnswersInline) and component.answers_inline
        if exp.per_skill:
            if not methods:  # every method hidden: a tool that can do nothing is not listed
                return []
            listing = "; ".join(f"{m.name}: {m.description}" for m in methods)
            desc = exp.descriptions.get(spec.id, entry.description or spec.description)
            return [
                (
                    Tool(
                        exp.names.get(spec.id, spec.id),
                        f"{desc}\nMethods: {listing}",
                        per_skill_schema(methods),
                        None,
                        entry.annotations,
                        spec.id,
                        None,
                        exp.titles.get(spec.id),
                        exp.tasks.get(spec.id),
                        inline,
                    ),
                    None,
                )
            ]
        return [
            (
                Tool(
                    name=exp.names.get(m.name, f"{spec.id}/{m.name}"),
                    description=exp.descriptions.get(m.name, m.description or spec.description),
                    input_schema=m.params_schema,
                    output_schema=m.result_schema,
                    annotations=entry.annotations,
                    skill_id=spec.id,
                    method=m.name,
                    title=exp.titles.get(m.name),
                    task_support=exp.tasks.get(m.name),
                    inline=inline,
                ),
                m.name,
            )
            for m in methods
        ]

    def tools(self) -> Sequence[Tool]:
        """Every exposed tool, in registration order."""
        return [t for t, _, _ in self._tools.values()]

    def skills(self) -> Sequence[SkillEntry]:
        """Every registered skill."""
        return list(self._skills.values())

    def ready(self) -> bool:
        """True once every skill is loaded."""
        return self._ready

    def tool_of(self, skill_id: str, method: str) -> str | None:
        """The name of the tool exposing ``method`` of ``skill_id`` (its per-method tool,
        else its skill's per-skill tool); None when no tool exposes it."""
        per_skill = None
        for name, (_tool, sid, m) in self._tools.items():
            if sid != skill_id:
                continue
            if m == method:
                return name
            entry = self._skills.get(sid)
            if m is None and entry is not None and method not in entry.exposure.hidden:
                per_skill = name
        return per_skill

    def resolve(
        self, tool: str, arguments: Mapping[str, Any]
    ) -> tuple[str, str, Mapping[str, Any]]:
        """(skill, method, arguments) of a call of ``tool``.

        A per-skill tool names its method in the arguments (``method``, ``args``).

        Raises:
            RegistryError: no such tool.
            GuestError: ``not-found``, a per-skill tool's method does not exist or is hidden.
            UsageError: a per-skill tool's ``args`` is not an object.
        """
        found = self._tools.get(tool)
        if found is None:
            raise RegistryError(f"no tool named '{tool}'")
        _tool, sid, method = found
        args: Mapping[str, Any] = arguments
        if method is None:  # a per-skill tool names its method in the arguments
            method = str(arguments.get("method", ""))
            args = arguments.get("args") or {}
            if (
                method not in {m.name for m in self._skills[sid].spec.methods}
                or method in self._skills[sid].exposure.hidden
            ):
                raise GuestError("not-found", f"skill '{sid}' has no method '{method}'")
            if not isinstance(args, Mapping):
                raise UsageError(f"'args' of tool '{tool}' must be an object", location=tool)
        return sid, method, args

    def resources(self) -> Sequence[ResourceSpec]:
        """Every resource and template the skills serve."""
        return [r for e in self._skills.values() for r in e.spec.resources]

    def _resource_owner(self, uri: str) -> SkillEntry:
        for entry in self._skills.values():
            for res in entry.spec.resources:
                if res.uri == uri or (res.template and _template_match(res.uri, uri)):
                    return entry
        raise RegistryError(f"no resource '{uri}'")

    def resource_skill(self, uri: str) -> str:
        """The id of the skill serving ``uri``.

        Raises:
            RegistryError: no skill serves ``uri``.
        """
        return self._resource_owner(uri).spec.id

    def gate(self, skill_id: str) -> CallGate:
        """The concurrency gate of ``skill_id``: every call of it holds one of its slots.

        Raises:
            RegistryError: no skill ``skill_id`` is registered.
        """
        entry = self._skills.get(skill_id)
        if entry is None:
            raise RegistryError(f"no skill named '{skill_id}'")
        return entry.gate

    def prompts(self) -> Sequence[PromptSpec]:
        """Every prompt the skills serve."""
        return [p for e in self._skills.values() for p in e.spec.prompts]

    def _prompt_owner(self, name: str) -> SkillEntry:
        for entry in self._skills.values():
            if any(p.name == name for p in entry.spec.prompts):
                return entry
        raise RegistryError(f"no prompt named '{name}'")

    def prompt_skill(self, name: str) -> str:
        """The id of the skill serving the prompt ``name``.

        Raises:
            RegistryError: no skill serves it.
        """
        return self._prompt_owner(name).spec.id


def per_skill_schema(methods: Sequence[MethodSpec]) -> dict[str, Any]:
    """The input schema of a per-skill tool: ``method`` names one, ``args`` fits its parameters.

    One ``oneOf`` branch per method, told apart by a ``const`` on ``method``, so a
    client sees each method's own parameter schema and the MCP layer checks the
    arguments against it before the guest runs. A method's local ``$ref``s are
    rebased to where its schema now sits.
    """
    branches: list[dict[str, Any]] = []
    for index, method in enumerate(methods):
        params = _rebased(method.params_schema, f"#/oneOf/{index}/properties/args")
        branch: dict[str, Any] = {
            "title": method.name,
            "properties": {"method": {"const": method.name}, "args": params},
            # Without arguments a method gets {}: ask for them when that cannot do.
            "required": ["method", "args"] if params.get("required") else ["method"],
        }
        if method.description:
            branch["description"] = method.description
        branches.append(branch)
    return {
        "type": "object",
        "properties": {
            "method": {"enum": [m.name for m in methods]},
            "args": {"type": "object"},
        },
        "required": ["method"],
        "additionalProperties": False,
        "oneOf": branches,
    }


def _rebased(schema: Mapping[str, Any], base: str) -> dict[str, Any]:
    """``schema`` moved to the JSON pointer ``base`` of a larger schema; its local refs follow.

    ``$schema`` goes: it is only meaningful at the root of a document.
    """

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(item) for item in node]
        if not isinstance(node, Mapping):
            return node
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str) and value.startswith("#"):
                out[key] = base + value[1:]
            elif key in _DATA_KEYWORDS:
                out[key] = value
            elif key in _SCHEMA_MAPS and isinstance(value, Mapping):
                out[key] = {name: walk(sub) for name, sub in value.items()}
            else:
                out[key] = walk(value)
        return out

    rebased: dict[str, Any] = walk({k: v for k, v in schema.items() if k != "$schema"})
    return rebased


def _template_match(template: str, uri: str) -> bool:
    pattern = "".join(
        "[^/]+" if part.startswith("{") else re.escape(part)
        for part in re.split(r"(\{\w+\})", template)
    )
    return re.fullmatch(pattern, uri) is not None
