"""The registry: loaded skills, their tools, and the dispatch of one call.

It implements :class:`~skilld.registry.Dispatcher` on top of the sandbox.
``call`` resolves the tool, takes a slot of the skill's concurrency limit,
builds a :class:`~skilld.sandbox.CallContext` (limits, key-value namespace,
permission checker, the client channel, the orchestrator for ``invoke``), runs
the guest, and writes one audit record whatever the outcome.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from skilld.errors import (
    DeadlineExceeded,
    GuestError,
    HostCallError,
    MemoryExhausted,
    RegistryError,
    SkilldError,
    StackExhausted,
)
from skilld.policy import Exposure
from skilld.registry._contract import NullChannel, Tool, ToolAnnotations
from skilld.sandbox import CallContext, Component
from skilld.types import (
    AuditSink,
    CallOutput,
    ClientChannel,
    KeyValueStore,
    Limits,
    PermissionChecker,
    PromptSpec,
    ResourceSpec,
    SkillSpec,
)

_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def annotations_for(grants: Mapping[str, Any]) -> ToolAnnotations:
    """MCP tool hints from a skill's *effective* grants (its policy table), never its claims.

    Read-only: no rw files, no state, no shell, no non-GET HTTP, no TCP, no transfer.
    Destructive: it may change or delete (rw files, state, shell, transfer).
    Open world: it reaches other systems (HTTP, TCP, transfer, invoke).
    """
    rw_files = any(rule.get("mode") == "rw" for rule in grants.get("fs") or ())
    writes_http = any(
        set(rule.get("methods") or ("GET",)) - _READ_METHODS for rule in grants.get("http") or ()
    )
    changes = bool(rw_files or grants.get("kv") or grants.get("shell") or grants.get("transfer"))
    open_world = bool(
        grants.get("http") or grants.get("tcp") or grants.get("transfer") or grants.get("invoke")
    )
    read_only = not (changes or writes_http or grants.get("tcp"))
    return ToolAnnotations(
        read_only=read_only, destructive=changes, idempotent=read_only, open_world=open_world
    )


@dataclass
class SkillEntry:
    """One loaded skill and everything its calls need."""

    spec: SkillSpec
    component: Component
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

    def __post_init__(self) -> None:
        self.slots = threading.BoundedSemaphore(max(1, self.limits.max_concurrency))


def _digest(data: str) -> str:
    return hashlib.sha256(data.encode()).hexdigest()


class Registry:
    """Skills by id, tools by name; implements the Dispatcher contract.

    Args:
        audit: where one record per call goes (``None``: nowhere).
    """

    def __init__(self, audit: AuditSink | None = None):
        self._skills: dict[str, SkillEntry] = {}
        self._tools: dict[str, tuple[Tool, str, str | None]] = {}
        self._audit = audit
        self._ready = False

    # -- registration ------------------------------------------------------

    def add(self, entry: SkillEntry) -> None:
        """Register a loaded skill and its tools.

        Raises:
            RegistryError: the skill id or one of its tool names is taken.
        """
        sid = entry.spec.id
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
        self._skills[sid] = entry
        for tool, method in tools:
            self._tools[tool.name] = (tool, sid, method)

    def mark_ready(self) -> None:
        """Every skill is loaded: /readyz may say so."""
        self._ready = True

    def _tools_of(self, entry: SkillEntry) -> Sequence[tuple[Tool, str | None]]:
        spec, exp = entry.spec, entry.exposure
        methods = [m for m in spec.methods if m.name not in exp.hidden]
        if exp.per_skill:
            schema = {
                "type": "object",
                "properties": {
                    "method": {"enum": [m.name for m in methods]},
                    "args": {"type": "object"},
                },
                "required": ["method"],
                "additionalProperties": False,
            }
            listing = "; ".join(f"{m.name}: {m.description}" for m in methods)
            desc = exp.descriptions.get(spec.id, entry.description or spec.description)
            return [
                (
                    Tool(
                        exp.names.get(spec.id, spec.id),
                        f"{desc}\nMethods: {listing}",
                        schema,
                        None,
                        entry.annotations,
                        spec.id,
                        None,
                        exp.titles.get(spec.id),
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
                ),
                m.name,
            )
            for m in methods
        ]

    # -- the Dispatcher contract -------------------------------------------

    def tools(self) -> Sequence[Tool]:
        """Every exposed tool, in registration order."""
        return [t for t, _, _ in self._tools.values()]

    def skills(self) -> Sequence[SkillEntry]:
        """Every registered skill."""
        return list(self._skills.values())

    def ready(self) -> bool:
        """True once every skill is loaded."""
        return self._ready

    def call(self, tool: str, arguments: Mapping[str, Any], channel: ClientChannel) -> CallOutput:
        """Run one tool call to the end (see the module docstring).

        Raises:
            RegistryError: no such tool.
            GuestError, GuestFault: the guest's failure, audited.
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
        return self.call_method(sid, method, args, channel, caller="mcp")

    def call_method(
        self,
        skill_id: str,
        method: str,
        arguments: Mapping[str, Any],
        channel: ClientChannel | None = None,
        *,
        caller: str = "local",
        depth: int = 0,
        chain: tuple[str, ...] = (),
    ) -> CallOutput:
        """Call ``method`` of ``skill_id`` directly (tools, ``invoke``, ``skilld call``).

        Raises:
            RegistryError: no such skill.
            GuestError, GuestFault: the guest's failure, audited.
        """
        entry = self._skills.get(skill_id)
        if entry is None:
            raise RegistryError(f"no skill named '{skill_id}'")
        args_json = json.dumps(arguments, separators=(",", ":"), sort_keys=True)
        ctx = CallContext(
            skill_id=skill_id,
            limits=entry.limits,
            channel=channel or NullChannel(),
            kv=entry.kv,
            checker=entry.checker,
            invoker=lambda callee, m, a, d: self._invoke(skill_id, callee, m, a, d, ctx),
            services=entry.services,
            depth=depth,
            chain=chain,
        )
        started = time.time()
        t0 = time.perf_counter()
        outcome: str = "ok"
        out: CallOutput | None = None
        error: SkilldError | None = None
        # A nested call (invoke) never waits for a slot: waiting inside a call chain
        # that already holds slots of the same skill could deadlock it.
        wait = entry.limits.timeout_ms / 1000 if depth == 0 else 0
        if not entry.slots.acquire(timeout=wait):
            outcome = "busy"
            error = GuestError(
                "limit-exceeded",
                f"skill '{skill_id}' is at its limit of "
                f"{entry.limits.max_concurrency} concurrent calls",
            )
        else:
            try:
                out = entry.component.call(method, args_json, ctx)
            except SkilldError as exc:
                outcome, error = _outcome(exc), exc
            finally:
                entry.slots.release()
        self._emit(
            entry,
            method,
            caller,
            args_json,
            out,
            started,
            time.perf_counter() - t0,
            outcome,
            error,
            ctx,
        )
        if error is not None:
            raise error
        assert out is not None
        return out

    def _invoke(
        self, caller: str, callee: str, method: str, args_json: str, depth: int, ctx: CallContext
    ) -> str:
        checker = self._skills[caller].checker
        decision = None
        if checker is not None:
            # The compiled checker knows depth limits and cycles; a plain one only the edge.
            check_invoke = getattr(checker, "check_invoke", None)
            if check_invoke is not None:
                decision = ctx.record(check_invoke(callee, depth, ctx.chain))
            else:
                decision = ctx.record(checker.check("invoke", "call", callee))
        if decision is None or not decision.allowed:
            rule = decision.rule if decision else "default-deny"
            reason = decision.reason if decision else "no policy allows invoke"
            raise HostCallError(
                "not-permitted", f"'{caller}' may not invoke '{callee}': {reason}", rule=rule
            )
        try:
            args = json.loads(args_json)
        except json.JSONDecodeError as exc:
            raise HostCallError(
                "invalid-argument", f"invoke arguments are not JSON: {exc}"
            ) from exc
        try:
            out = self.call_method(
                callee,
                method,
                args,
                ctx.channel,
                caller=f"skill:{caller}",
                depth=depth,
                chain=(*ctx.chain, caller),
            )
        except RegistryError as exc:
            raise HostCallError("not-found", exc.message) from exc
        except GuestError as exc:
            raise HostCallError(exc.code, exc.message, rule=exc.rule) from exc
        except SkilldError as exc:
            raise HostCallError("internal", f"'{callee}' failed: {exc}") from exc
        return json.dumps(out.value)

    def _emit(
        self,
        entry: SkillEntry,
        method: str,
        caller: str,
        args_json: str,
        out: CallOutput | None,
        started: float,
        duration: float,
        outcome: str,
        error: SkilldError | None,
        ctx: CallContext,
    ) -> None:
        if self._audit is None:
            return
        record: dict[str, Any] = {
            "event": "call",
            "skill": entry.spec.id,
            "version": entry.spec.version,
            "method": method,
            "caller": caller,
            "depth": ctx.depth,
            "input_sha256": _digest(args_json),
            "output_sha256": _digest(json.dumps(out.value, sort_keys=True)) if out else None,
            "start": started,
            "duration_ms": round(duration * 1000, 3),
            "outcome": outcome,
            "limits_hit": [outcome] if outcome in ("deadline", "memory", "stack", "busy") else [],
            "error": str(error) if error else None,
            "decisions": [d.as_dict() for d in ctx.decisions],
        }
        if ctx.host_faults:
            record["host_faults"] = ctx.host_faults
        self._audit.emit(record)

    # -- resources and prompts ---------------------------------------------

    def resources(self) -> Sequence[ResourceSpec]:
        """Every resource and template the skills serve."""
        return [r for e in self._skills.values() for r in e.spec.resources]

    def _resource_owner(self, uri: str) -> SkillEntry:
        for entry in self._skills.values():
            for res in entry.spec.resources:
                if res.uri == uri or (res.template and _template_match(res.uri, uri)):
                    return entry
        raise RegistryError(f"no resource '{uri}'")

    def read_resource(self, uri: str, channel: ClientChannel) -> Sequence[CallOutput]:
        """Read a resource from the skill that serves it.

        Raises:
            RegistryError: no skill serves ``uri``.
        """
        entry = self._resource_owner(uri)
        ctx = CallContext(
            entry.spec.id,
            entry.limits,
            channel,
            kv=entry.kv,
            checker=entry.checker,
            services=entry.services,
        )
        return entry.component.read_resource(uri, ctx)

    def prompts(self) -> Sequence[PromptSpec]:
        """Every prompt the skills serve."""
        return [p for e in self._skills.values() for p in e.spec.prompts]

    def get_prompt(self, name: str, arguments: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
        """Render a prompt from the skill that serves it.

        Raises:
            RegistryError: no skill serves the prompt.
        """
        for entry in self._skills.values():
            if any(p.name == name for p in entry.spec.prompts):
                ctx = CallContext(
                    entry.spec.id,
                    entry.limits,
                    NullChannel(),
                    kv=entry.kv,
                    checker=entry.checker,
                    services=entry.services,
                )
                return entry.component.get_prompt(name, json.dumps(dict(arguments)), ctx)
        raise RegistryError(f"no prompt named '{name}'")


def _template_match(template: str, uri: str) -> bool:
    import re

    pattern = "".join(
        "[^/]+" if part.startswith("{") else re.escape(part)
        for part in re.split(r"(\{\w+\})", template)
    )
    return re.fullmatch(pattern, uri) is not None


def _outcome(exc: SkilldError) -> str:
    if isinstance(exc, DeadlineExceeded):
        return "deadline"
    if isinstance(exc, MemoryExhausted):
        return "memory"
    if isinstance(exc, StackExhausted):
        return "stack"
    if isinstance(exc, GuestError):
        return f"error:{exc.code}"
    return "fault"
