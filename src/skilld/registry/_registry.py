"""The registry: loaded skills, their tools, and the dispatch of one call.

It implements :class:`~skilld.registry.Dispatcher` on top of the sandbox.
``call`` resolves the tool, takes a slot of the skill's concurrency limit,
builds a :class:`~skilld.sandbox.CallContext` (limits, key-value namespace,
permission checker, the client channel, the orchestrator for ``invoke``), runs
the guest, and writes one audit record whatever the outcome. Resource reads and
prompts run guest code too, and take the same path (``Registry._run``).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from skilld.audit import CallRecorder
from skilld.call import CallContext, Inline
from skilld.errors import (
    CallCancelled,
    DeadlineExceeded,
    GuestError,
    HostCallError,
    RegistryError,
    RunOnThread,
    SkilldError,
    UsageError,
)
from skilld.policy import Exposure
from skilld.registry._contract import NullChannel, SkillBackend, Tool, ToolAnnotations
from skilld.types import (
    AuditSink,
    CallOutput,
    ClientChannel,
    KeyValueStore,
    Limits,
    MethodSpec,
    PermissionChecker,
    PromptSpec,
    ResourceSpec,
    SkillSpec,
)

T = TypeVar("T")

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

    def __post_init__(self) -> None:
        self.slots = threading.BoundedSemaphore(max(1, self.limits.max_concurrency))


class InlineStrategy:
    """When a call is tried inline, and how it gives up (see :class:`skilld.call.Inline`).

    After an attempt at a method gave up having run guest code, the next ``backoff``
    calls of that method go straight to a thread: a method that always needs one (it
    calls kv, say) wastes an attempt in ``backoff + 1``, not each. One that gave up
    before its guest ran is tried again at once.
    """

    def __init__(self, backoff: int = 32):
        self._backoff = backoff
        # (skill, method) -> inline attempts still to skip after one gave up
        self._skipping: dict[tuple[str, str], int] = {}

    def start(self, key: tuple[str, str], budget_s: float) -> Inline:
        """An attempt at a call of ``key`` = (skill, method) of about ``budget_s``.

        Raises:
            RunOnThread: the method is backing off; nothing ran.
        """
        skip = self._skipping.get(key, 0)
        if skip > 0:
            self._skipping[key] = skip - 1
            raise RunOnThread
        return Inline.for_s(budget_s)

    def gave_up(self, key: tuple[str, str], exc: RunOnThread) -> None:
        """An attempt at ``key`` gave up: back off when its guest ran."""
        if exc.ran:
            self._skipping[key] = self._backoff

    def forget(self, skill_id: str) -> None:
        """A skill left: drop what was learnt about its methods."""
        self._skipping = {k: v for k, v in self._skipping.items() if k[0] != skill_id}


# A call waiting for a slot looks at its client's cancellation this often.
_SLOT_SLICE_S = 0.05


def _take_slot(slots: threading.BoundedSemaphore, wait_s: float, channel: ClientChannel) -> bool:
    """A slot within ``wait_s``, given up as soon as the client cancels the call."""
    if slots.acquire(blocking=False):
        return True
    end = time.monotonic() + wait_s
    while not channel.cancelled():
        left = end - time.monotonic()
        if left <= 0:
            return False
        if slots.acquire(timeout=min(left, _SLOT_SLICE_S)):
            return True
    return False


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
        # Skills come and go while serving (a cluster's remote skills): add and remove
        # replace the two maps whole under this lock, so readers on other threads never
        # see one half-changed and never need the lock.
        self._changing = threading.Lock()
        self._watchers: list[Callable[[], None]] = []
        self._gauges: list[Callable[[], Mapping[str, tuple[str, float]]]] = []
        self._inline = InlineStrategy()

    # -- registration ------------------------------------------------------

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
            self._inline.forget(skill_id)
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

        Arguments are not checked against the tool's input schema here: the MCP
        layer does that before it calls (a per-skill tool's schema holds each
        method's parameters, see :func:`per_skill_schema`).

        Raises:
            RegistryError: no such tool.
            UsageError: a per-skill tool's ``args`` is not an object.
            GuestError, GuestFault: the guest's failure, audited.
        """
        sid, method, args = self._resolve(tool, arguments)
        return self.call_method(sid, method, args, channel, caller="mcp")

    def call_inline(
        self, tool: str, arguments: Mapping[str, Any], channel: ClientChannel, budget_s: float
    ) -> CallOutput:
        """Try the call on this thread without blocking it for more than about ``budget_s``.

        For the MCP server's event loop: a quick guest that needs no blocking host
        call finishes here, saving the hand-off to a worker thread and back (at 16
        concurrent calls most of skilld's overhead, docs/mcp.md). The attempt gives
        up with :class:`RunOnThread`, unaudited and unseen, when the skill has no
        free slot, its instance would be slow to create, or the guest runs too long
        or makes a host call that could block; the caller then runs :meth:`call` on
        a worker thread. A method that gave up is not tried inline for its next
        calls (:class:`InlineStrategy`; one that gave up before its guest ran is tried again).

        Raises:
            RunOnThread: as above.
            RegistryError, UsageError, GuestError, GuestFault: as for :meth:`call`.
        """
        sid, method, args = self._resolve(tool, arguments)
        return self.call_method(sid, method, args, channel, caller="mcp", inline_s=budget_s)

    def _resolve(
        self, tool: str, arguments: Mapping[str, Any]
    ) -> tuple[str, str, Mapping[str, Any]]:
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
        inline_s: float | None = None,
        deadline: float | None = None,
        remote_caller: tuple[str, str] | None = None,
    ) -> CallOutput:
        """Call ``method`` of ``skill_id`` directly (tools, ``invoke``, ``skilld call``).

        ``inline_s`` makes it an inline attempt of about that long (see :meth:`call_inline`;
        a routed call from another node of a cluster is tried inline the same way).
        ``deadline`` (monotonic; a nested call's caller's) ends the call sooner than its
        own wall time would. ``remote_caller`` (node, skill) makes it an ``invoke``
        routed from another node of a cluster: the callee's own policy must consent.

        Raises:
            RegistryError: no such skill.
            GuestError, GuestFault: the guest's failure, audited; ``not-permitted``
                (audited) when ``remote_caller`` has no consent.
            RunOnThread: an inline attempt gave up (nothing audited).
        """
        entry = self._skills.get(skill_id)
        if entry is None:
            raise RegistryError(f"no skill named '{skill_id}'")
        args_json = json.dumps(arguments, separators=(",", ":"), sort_keys=True)
        key = (skill_id, method)
        inline = None if inline_s is None else self._inline.start(key, inline_s)

        def guest(ctx: CallContext) -> CallOutput:
            if remote_caller is not None:
                _consent(entry, *remote_caller, ctx)
            return entry.component.call(method, args_json, ctx)

        try:
            return self._run(
                entry,
                method,
                args_json,
                channel,
                guest,
                caller=caller,
                depth=depth,
                chain=chain,
                inline=inline,
                deadline=deadline,
            )
        except RunOnThread as exc:
            self._inline.gave_up(key, exc)
            raise

    def _run(
        self,
        entry: SkillEntry,
        method: str,
        input_text: str,
        channel: ClientChannel | None,
        guest: Callable[[CallContext], T],
        *,
        caller: str,
        depth: int = 0,
        chain: tuple[str, ...] = (),
        target: str | None = None,
        inline: Inline | None = None,
        deadline: float | None = None,
    ) -> T:
        """The one way guest code runs: a slot of the skill, a fresh context, one audit record.

        Tool calls, ``invoke``, resource reads and prompts all come through here.

        Raises:
            GuestError: ``limit-exceeded`` when no slot frees up in time; the guest's own.
            GuestFault: the guest trapped, ran out of time, memory or stack, or was cancelled.
        """
        skill_id = entry.spec.id
        recorder = CallRecorder(
            skill_id,
            entry.spec.version,
            method,
            caller=caller,
            input=input_text,
            depth=depth,
            target=target,
        )
        ctx = CallContext(
            skill_id=skill_id,
            recorder=recorder,
            limits=entry.limits,
            # The sandbox stops the guest once this channel says the client cancelled.
            channel=channel or NullChannel(),
            kv=entry.kv,
            checker=entry.checker,
            invoker=lambda callee, m, a, d: self._invoke(skill_id, callee, m, a, d, ctx),
            services=entry.services,
            depth=depth,
            chain=chain,
            inline=inline,
            # A nested call ends by its caller's deadline if that comes first; others
            # get theirs when the guest starts (instantiation included).
            deadline=None
            if deadline is None
            else min(deadline, time.monotonic() + entry.limits.timeout_ms / 1000),
        )
        # The started record goes out (flushed) before the first state write is made,
        # so a write that completed just before a crash names its call (docs/runtime.md).
        ctx.before_first_write = lambda: self._emit(recorder.started())
        outcome: str = "ok"
        out: T | None = None
        error: SkilldError | None = None
        # A nested call (invoke) never waits for a slot: waiting inside a call chain
        # that already holds slots of the same skill could deadlock it. Nor does an
        # inline attempt: waiting is for a thread, not the event loop.
        wait = entry.limits.timeout_ms / 1000 if depth == 0 and inline is None else 0
        if not _take_slot(entry.slots, wait, ctx.channel):
            if inline is not None:
                inline.give_up()
            if ctx.channel.cancelled():
                outcome, error = (
                    "cancelled",
                    CallCancelled(
                        f"{skill_id}: the client cancelled the call while it waited for a slot"
                    ),
                )
            else:
                outcome = "busy"
                error = GuestError(
                    "limit-exceeded",
                    f"skill '{skill_id}' is at its limit of "
                    f"{entry.limits.max_concurrency} concurrent calls",
                )
        else:
            try:
                out = guest(ctx)
            except SkilldError as exc:
                outcome, error = exc.outcome, exc
            finally:
                entry.slots.release()
                # The invoker and hook closures refer back to ctx; without them the
                # context is freed at once rather than by the garbage collector.
                ctx.invoker = None
                ctx.before_first_write = None
        self._emit(
            recorder.finish(
                outcome, output=None if error is not None else _audited(out), error=error
            )
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
                deadline=ctx.deadline,
            )
        except RegistryError as exc:
            raise HostCallError("not-found", exc.message) from exc
        except GuestError as exc:
            raise HostCallError(exc.code, exc.message, rule=exc.rule) from exc
        except DeadlineExceeded as exc:
            raise HostCallError(
                "timeout",
                f"'{callee}' was stopped at its deadline (its own wall time or what was left "
                f"of '{caller}''s, whichever came first)",
            ) from exc
        except CallCancelled as exc:
            raise HostCallError("cancelled", f"'{callee}' was cancelled") from exc
        except SkilldError as exc:
            raise HostCallError("internal", f"'{callee}' failed: {exc}") from exc
        return json.dumps(out.value)

    def _emit(self, record: dict[str, Any]) -> None:
        """Send one record to the audit sink, if there is one.

        Raises:
            AuditError: the sink could not record.
        """
        if self._audit is not None:
            self._audit.emit(record)

    def refused(
        self, skill: str, label: str, arguments: Mapping[str, Any], outcome: str, error: str
    ) -> None:
        """Audit a request the MCP layer refused before any guest code ran.

        ``label`` is the tool's name, ``resource:URI`` or ``prompt:NAME``; ``outcome``
        says why (``invalid-argument``, ``busy``, ``draining``). The record has the
        shape of a call's, with ``refused: true``, no output and no decisions; its
        method is the tool's method where the tool names one, else ``label``.

        Raises:
            AuditError: the sink could not record.
        """
        if self._audit is None:
            return
        method = label
        found = self._tools.get(label)
        if found is not None:
            method = found[2] if found[2] is not None else str(arguments.get("method", ""))
        entry = self._skills.get(skill)
        input_text = json.dumps(arguments, separators=(",", ":"), sort_keys=True, default=str)
        recorder = CallRecorder(
            skill,
            entry.spec.version if entry is not None else None,
            method,
            caller="mcp",
            input=input_text,
        )
        self._audit.emit(recorder.finish(outcome, error=error, refused=True))

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

    def resource_skill(self, uri: str) -> str:
        """The id of the skill serving ``uri``.

        Raises:
            RegistryError: no skill serves ``uri``.
        """
        return self._resource_owner(uri).spec.id

    def read_resource(self, uri: str, channel: ClientChannel) -> Sequence[CallOutput]:
        """Read a resource from the skill that serves it, as a call: slot, context, audit.

        Raises:
            RegistryError: no skill serves ``uri``.
            GuestError, GuestFault: as for :meth:`call`, audited.
        """
        entry = self._resource_owner(uri)
        return self._run(
            entry,
            "read-resource",
            uri,
            channel,
            lambda ctx: entry.component.read_resource(uri, ctx),
            caller="mcp",
            target=uri,
        )

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

    def get_prompt(
        self, name: str, arguments: Mapping[str, Any], channel: ClientChannel
    ) -> Sequence[Mapping[str, Any]]:
        """Render a prompt from the skill that serves it, as a call: slot, context, audit.

        Raises:
            RegistryError: no skill serves the prompt.
            GuestError, GuestFault: as for :meth:`call`, audited.
        """
        entry = self._prompt_owner(name)
        args_json = json.dumps(dict(arguments), separators=(",", ":"), sort_keys=True)
        return self._run(
            entry,
            "get-prompt",
            args_json,
            channel,
            lambda ctx: entry.component.get_prompt(name, args_json, ctx),
            caller="mcp",
            target=name,
        )


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


def _audited(out: object) -> Any:
    """The JSON value an audit record digests: a call's value, or each output's in turn."""
    if isinstance(out, CallOutput):
        return out.value
    if isinstance(out, list | tuple):
        return [_audited(item) for item in out]
    return out


def _template_match(template: str, uri: str) -> bool:
    pattern = "".join(
        "[^/]+" if part.startswith("{") else re.escape(part)
        for part in re.split(r"(\{\w+\})", template)
    )
    return re.fullmatch(pattern, uri) is not None


def _consent(entry: SkillEntry, node: str, caller: str, ctx: CallContext) -> None:
    """This node's consent to an ``invoke`` of ``entry`` by ``caller`` of cluster ``node``.

    Raises:
        GuestError: ``not-permitted`` (the decision is recorded for the audit).
    """
    target = f"{node}/{caller}"
    decision = None if entry.checker is None else entry.checker.check("invoke", "called-by", target)
    if decision is not None:
        ctx.record(decision)
    if decision is None or not decision.allowed:
        reason = decision.reason if decision else "no policy allows invoke"
        raise GuestError(
            "not-permitted",
            f"'{caller}' of node {node} may not invoke '{entry.spec.id}': {reason}",
            rule=decision.rule if decision else "default-deny",
            location=entry.spec.id,
        )
