"""The one service layer: ``delegate``, ``run_program``, ``validate_program``, kits.

The CLI and the MCP tools both call :class:`DelegateService`. A program runs as a
registry call of its kit's runner entry (``kit.<name>``: the CPython runner
component under a policy that may invoke exactly the kit's skills), so it takes a
slot, gets a deadline and a memory cap and leaves an audit record like any call.
:class:`KitRunner`, the backend of that entry, stands between the guest and the
registry's ``invoke``: it lets through only the kit's (skill, method) pairs, counts
calls, and writes the trace. The MCP tools are :class:`DelegateBackend`, a
host-implemented :class:`~skilld.registry.SkillBackend` registered as the skill
``delegate``.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from skilld import telemetry
from skilld.call import Call, CallContext
from skilld.delegate._infer import InferenceConfig, infer, monotonic_budget, no_program
from skilld.delegate._kits import Kit, load_kits
from skilld.delegate._validate import check_program, validate
from skilld.errors import (
    DelegateError,
    ErrorCode,
    GuestError,
    GuestFault,
    HostCallError,
    ProgramRejected,
    UsageError,
)
from skilld.policy import RUNNER_METHOD, Exposure, Tables
from skilld.registry import Registry, SkillBackend, SkillEntry, ToolAnnotations
from skilld.types import (
    Caller,
    CallOutput,
    ClientChannel,
    Decision,
    Limits,
    MethodSpec,
    PermissionChecker,
    SkillSpec,
)

SKILL_ID = "delegate"
# A program run outside any call (the CLI, tests) is the local user's.
_LOCAL = Caller.local()
# A tool result larger than this is kept in the trace as its digest and size.
TRACE_INLINE_BYTES = 1024
# Kit runner calls run nested under the delegate call (they never wait for a slot).
_NESTED = 1


@dataclass
class TraceEntry:
    """One tool call of a program, as the result's ``trace`` lists it."""

    step: int
    tool: str
    args: Any
    result: Any = None
    result_sha256: str | None = None
    result_bytes: int | None = None
    duration_ms: float = 0.0
    success: bool = False
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON form; a large result appears as its digest and size only."""
        out: dict[str, Any] = {
            "step": self.step,
            "tool": self.tool,
            "args": self.args,
            "duration_ms": self.duration_ms,
            "success": self.success,
            "error": self.error,
        }
        if self.result_sha256 is not None:
            out["result_sha256"] = self.result_sha256
            out["result_bytes"] = self.result_bytes
        else:
            out["result"] = self.result
        return out


@dataclass
class _Run:
    """What a kit runner call records for the service (one per program run)."""

    trace: list[TraceEntry] = field(default_factory=list)


# The program run in progress on this thread: the service sets it around the
# registry call of the kit's runner; KitRunner (same thread) fills its trace.
_CURRENT: ContextVar[_Run | None] = ContextVar("skilld_delegate_run", default=None)


class KitRunner:
    """The backend of a kit's runner entry: the runner component behind a kit gate."""

    def __init__(self, component: SkillBackend, kit: Kit):
        self.component = component
        self.kit = kit
        self.targets = {(t.skill, t.method): t.name for t in kit.tools.values()}

    def call(self, method: str, args_json: str, ctx: CallContext) -> CallOutput:
        """Run the program in the component; every tool call is gated and traced.

        Raises:
            RunOnThread: on an inline attempt (a program always needs a thread).
            GuestError, GuestFault: the runner's failure.
        """
        ctx.thread_only()
        run = _CURRENT.get() or _Run()
        upstream = ctx.invoker
        if upstream is None:  # pragma: no cover - the registry always sets one
            raise GuestError("internal", "the kit runner has no invoker")

        def gate(skill: str, target: str, args: str, depth: int) -> str:
            name = self.targets.get((skill, target))
            rule = f"kit.{self.kit.name}.tools"
            if name is None:
                reason = f"{skill}/{target} is not a tool of kit '{self.kit.name}'"
                ctx.record(Decision(False, "invoke", "call", f"{skill}/{target}", rule, reason))
                raise HostCallError(ErrorCode.NOT_PERMITTED, reason, rule=rule)
            if len(run.trace) >= self.kit.max_calls:
                reason = f"more than {self.kit.max_calls} tool calls"
                ctx.record(Decision(False, "invoke", "call", f"{skill}/{target}", rule, reason))
                raise HostCallError("limit-exceeded", reason, rule=rule)
            try:
                parsed = json.loads(args)
            except ValueError as exc:  # a guest past the SDK can send anything
                raise HostCallError("invalid-argument", f"{name}() args are not JSON") from exc
            ctx.record(Decision(True, "invoke", "call", f"{skill}/{target}", rule, name))
            entry = TraceEntry(len(run.trace) + 1, name, parsed)
            run.trace.append(entry)
            t0 = time.perf_counter()
            try:
                out = upstream(skill, target, args, depth)
            except HostCallError as exc:
                entry.error = f"[{exc.code}] {exc.message}"
                raise
            finally:
                entry.duration_ms = round((time.perf_counter() - t0) * 1000, 3)
            entry.success = True
            size = len(out.encode())
            if size > TRACE_INLINE_BYTES:
                entry.result_sha256 = hashlib.sha256(out.encode()).hexdigest()
                entry.result_bytes = size
            else:
                entry.result = json.loads(out)
            return out

        ctx.invoker = gate
        with telemetry.span("skilld.delegate.program", {"skilld.kit": self.kit.name}):
            return self.component.call(method, args_json, ctx)

    def read_resource(self, uri: str, ctx: CallContext) -> list[CallOutput]:
        """A runner serves no resources.

        Raises:
            GuestError: always, ``not-found``.
        """
        raise GuestError("not-found", f"the runner of kit '{self.kit.name}' has no resources")

    def get_prompt(self, name: str, args_json: str, ctx: CallContext) -> list[dict[str, Any]]:
        """A runner serves no prompts.

        Raises:
            GuestError: always, ``not-found``.
        """
        raise GuestError("not-found", f"the runner of kit '{self.kit.name}' has no prompts")


class DelegateService:
    """delegate's operations over a registry whose kits are registered (:func:`register`)."""

    def __init__(self, registry: Registry, kits: Mapping[str, Kit], config: InferenceConfig):
        self.registry = registry
        self.kits = dict(kits)
        self.config = config

    def kit(self, name: str) -> Kit:
        """The kit ``name``.

        Raises:
            DelegateError: no such kit.
        """
        found = self.kits.get(name)
        if found is None:
            raise DelegateError(
                f"no kit named '{name}'",
                location="kit",
                hint=f"kits: {', '.join(sorted(self.kits)) or 'none'}",
            )
        return found

    def kit_list(self) -> list[dict[str, Any]]:
        """Every kit: name, description, grade and tool names."""
        return [
            {
                "kit": k.name,
                "description": k.description,
                "grade": k.grade.as_dict(),
                "tools": sorted(k.tools),
            }
            for k in self.kits.values()
        ]

    def kit_info(self, name: str) -> dict[str, Any]:
        """One kit in full (see :meth:`Kit.info`).

        Raises:
            DelegateError: no such kit.
        """
        return self.kit(name).info()

    def validate_program(self, program: str, kit: str) -> dict[str, Any]:
        """Validate ``program`` over ``kit``: ``valid`` and every problem.

        Raises:
            DelegateError: no such kit.
        """
        found = self.kit(kit)
        problems = validate(program, found.tools)
        return {
            "valid": not problems,
            "kit": found.name,
            "grade": found.grade.as_dict(),
            "problems": [
                {"line": p.line, "column": p.column, "rule": p.rule, "message": p.message}
                for p in problems
            ],
        }

    def run_program(
        self,
        program: str,
        kit: str,
        params: Mapping[str, Any] | None = None,
        *,
        channel: ClientChannel | None = None,
        depth: int = 0,
        caller: Caller = _LOCAL,
    ) -> dict[str, Any]:
        """Validate and run ``program`` over ``kit`` for ``caller``; the result format of
        docs/delegate.md.

        Raises:
            DelegateError: no such kit; UsageError: ``params`` not JSON data.
        """
        t0 = time.perf_counter()
        found = self.kit(kit)
        return self._execute(
            found, program, dict(params or {}), None, 0, 0.0, t0, channel, depth, caller
        )

    def delegate(
        self,
        intent: str,
        kit: str,
        params: Mapping[str, Any] | None = None,
        *,
        channel: ClientChannel | None = None,
        depth: int = 0,
        deadline: float | None = None,
        caller: Caller = _LOCAL,
    ) -> dict[str, Any]:
        """Turn ``intent`` into a program over ``kit`` (the tiers in order) and run it.

        Raises:
            DelegateError: no such kit, or no tier produced a valid program.
        """
        t0 = time.perf_counter()
        found = self.kit(kit)
        bound = dict(params or {})
        cancelled = channel.cancelled if channel is not None else lambda: False
        generated = infer(intent, found, bound, self.config, monotonic_budget(deadline), cancelled)
        gen_ms = (time.perf_counter() - t0) * 1000
        if generated.program is None:
            raise no_program(intent, found, generated)
        result = self._execute(
            found,
            generated.program,
            generated.params,
            generated.tier,
            generated.correction_attempts,
            gen_ms,
            t0,
            channel,
            depth,
            caller,
        )
        result["tiers_tried"] = generated.tiers_tried
        return result

    def _execute(
        self,
        kit: Kit,
        program: str,
        params: dict[str, Any],
        tier: str | None,
        corrections: int,
        gen_ms: float,
        t0: float,
        channel: ClientChannel | None,
        depth: int,
        caller: Caller,
    ) -> dict[str, Any]:
        result: dict[str, Any] = {
            "success": False,
            "output": None,
            "error": None,
            "program": program,
            "params": params,
            "kit": kit.name,
            "grade": kit.grade.as_dict(),
            "generation_tier": tier,
            "correction_attempts": corrections,
            "generation_time_ms": round(gen_ms, 3),
            "execution_time_ms": 0.0,
            "total_time_ms": 0.0,
            "trace": [],
        }
        try:
            json.dumps(params, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"params must be JSON data: {exc}") from exc
        try:
            check_program(program, kit.tools, params)
        except ProgramRejected as exc:
            result["error"] = {
                "code": "invalid-program",
                "message": str(exc),
                "problems": [
                    {"line": ln, "column": col, "rule": rule, "message": msg}
                    for ln, col, rule, msg in exc.problems
                ],
            }
            return _timed(result, t0, None)
        run = _Run()
        token = _CURRENT.set(run)
        t1 = time.perf_counter()
        try:
            out = self.registry.call_method(
                Call(
                    kit.runner,
                    RUNNER_METHOD,
                    {
                        "program": program,
                        "tools": {
                            t.name: {"skill": t.skill, "method": t.method, "params": list(t.params)}
                            for t in kit.tools.values()
                        },
                        "params": params,
                        "max_calls": kit.max_calls,
                        "max_output": kit.max_output,
                    },
                    channel,
                    caller=caller.as_skill(SKILL_ID),
                    depth=depth + _NESTED,
                    chain=(SKILL_ID,),
                )
            )
            value = out.value
            result["success"] = bool(value.get("success"))
            result["output"] = value.get("output")
            result["error"] = value.get("error")
        except GuestFault as exc:
            # Deadline, memory, stack, cancellation: the program cost its own call only.
            result["error"] = {"code": exc.outcome, "message": str(exc)}
        except GuestError as exc:
            result["error"] = {"code": exc.code, "message": exc.message, "rule": exc.rule}
        finally:
            _CURRENT.reset(token)
        result["trace"] = [e.as_dict() for e in run.trace]
        return _timed(result, t0, t1)


def _timed(result: dict[str, Any], t0: float, t1: float | None) -> dict[str, Any]:
    now = time.perf_counter()
    result["execution_time_ms"] = round((now - t1) * 1000, 3) if t1 is not None else 0.0
    result["total_time_ms"] = round((now - t0) * 1000, 3)
    return result


_STR = {"type": "string"}
_PARAMS = {"type": "object", "description": "values bound as names before the program runs"}
_KIT = {"type": "string", "description": "the kit's name (kit_list)"}


def _schema(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required}


METHODS = (
    MethodSpec(
        "delegate",
        "Turn an intent into a short program over a kit of tools, check it, run it in the "
        "sandbox and return its output with a trace of every tool call.",
        _schema({"intent": _STR, "kit": _KIT, "params": _PARAMS}, ["intent", "kit"]),
    ),
    MethodSpec(
        "run_program",
        "Check a program in delegate's language against a kit and run it in the sandbox.",
        _schema({"program": _STR, "kit": _KIT, "params": _PARAMS}, ["program", "kit"]),
    ),
    MethodSpec(
        "validate_program",
        "Check a program against a kit without running it: every problem with line and column.",
        _schema({"program": _STR, "kit": _KIT}, ["program", "kit"]),
    ),
    MethodSpec("kit_list", "The kits programs may use, with their grades.", _schema({}, [])),
    MethodSpec(
        "kit_info",
        "One kit: its tools, limits, templates and grade.",
        _schema({"kit": _KIT}, ["kit"]),
    ),
)
# The runner component's own method (hidden from MCP: reached only through the service).
RUNNER_SPEC = MethodSpec(
    RUNNER_METHOD,
    "Run a validated program; its kit tools call invoke (sandbox/pyrunner).",
    {"type": "object"},
)


class DelegateBackend:
    """delegate's MCP tools as a host-implemented skill (:class:`SkillBackend`)."""

    # Some of its methods (kit_list) answer on the event loop: the registry tries them inline.
    answers_inline = True

    def __init__(self, service: DelegateService):
        self.service = service

    def call(self, method: str, args_json: str, ctx: CallContext) -> CallOutput:
        """Run one of :data:`METHODS`.

        Raises:
            RunOnThread: an inline attempt at ``delegate`` or ``run_program``.
            GuestError: unknown method or kit, bad arguments, no program for an intent.
        """
        try:
            args = json.loads(args_json) if args_json.strip() else {}
        except ValueError as exc:
            raise GuestError("invalid-argument", f"arguments are not JSON: {exc}") from exc
        if not isinstance(args, dict):
            raise GuestError("invalid-argument", "arguments must be a JSON object")
        if method in ("delegate", "run_program"):
            ctx.thread_only()
        if ctx.deadline is None:
            # The registry leaves the clock to the backend (the sandbox arms its own for a
            # guest); model tiers are bounded by what is left of this one.
            ctx.deadline = time.monotonic() + ctx.limits.timeout_ms / 1000
        svc = self.service
        try:
            if method == "delegate":
                value: Any = svc.delegate(
                    _text(args, "intent"),
                    _text(args, "kit"),
                    _params(args),
                    channel=ctx.channel,
                    depth=ctx.depth,
                    deadline=ctx.deadline,
                    caller=ctx.caller,
                )
            elif method == "run_program":
                value = svc.run_program(
                    _text(args, "program"),
                    _text(args, "kit"),
                    _params(args),
                    channel=ctx.channel,
                    depth=ctx.depth,
                    caller=ctx.caller,
                )
            elif method == "validate_program":
                value = svc.validate_program(_text(args, "program"), _text(args, "kit"))
            elif method == "kit_list":
                value = svc.kit_list()
            elif method == "kit_info":
                value = svc.kit_info(_text(args, "kit"))
            else:
                raise GuestError("not-found", f"delegate has no method '{method}'")
        except (DelegateError, UsageError) as exc:
            raise GuestError("invalid-argument", str(exc)) from exc
        return CallOutput(value=value)

    def read_resource(self, uri: str, ctx: CallContext) -> list[CallOutput]:
        """delegate serves no resources.

        Raises:
            GuestError: always, ``not-found``.
        """
        raise GuestError("not-found", "delegate serves no resources")

    def get_prompt(self, name: str, args_json: str, ctx: CallContext) -> list[dict[str, Any]]:
        """delegate serves no prompts.

        Raises:
            GuestError: always, ``not-found``.
        """
        raise GuestError("not-found", "delegate serves no prompts")


def _text(args: Mapping[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str):
        raise UsageError(f"'{key}' must be a string")
    return value


def _params(args: Mapping[str, Any]) -> dict[str, Any]:
    value = args.get("params") or {}
    if not isinstance(value, dict):
        raise UsageError("'params' must be an object")
    return value


def register(
    registry: Registry,
    tables: Tables,
    runner: SkillBackend,
    checker_for: Callable[[str], PermissionChecker],
    config: InferenceConfig | None = None,
) -> DelegateService | None:
    """Register each kit's runner entry and the ``delegate`` skill; None without kits.

    ``runner`` is the loaded ``pyrunner`` component; ``checker_for`` gives a skill's
    permission checker from the tables (the caller owns ``skilld.permissions``).
    Call it after every other skill is registered (kits name their methods).

    Raises:
        DelegateError: a kit's method is unknown, or one of its templates or rules
            holds a program the validator refuses (located at its file and line).
    """
    if not tables.kits:
        return None
    kits = load_kits(tables, {e.spec.id: e.spec.methods for e in registry.skills()})
    for kit in kits.values():
        for entry in (*kit.templates, *kit.rules):
            try:
                check_program(entry.program, kit.tools, entry.params)
            except ProgramRejected as exc:
                raise DelegateError(
                    f"kit '{kit.name}' entry '{entry.id}': {exc.message}",
                    location=entry.source,
                    hint="fix the program in the kit file and rebuild",
                ) from exc
        registry.add(
            SkillEntry(
                spec=SkillSpec(kit.runner, "1", f"the runner of kit {kit.name}", (RUNNER_SPEC,)),
                component=KitRunner(runner, kit),
                limits=tables.limits(kit.runner),
                checker=checker_for(kit.runner),
                exposure=tables.exposure(kit.runner),
            )
        )
    service = DelegateService(registry, kits, config or InferenceConfig())
    worst_w = max(k.grade.w for k in kits.values())
    worst_d = max(k.grade.d for k in kits.values())
    longest = max(k.timeout_ms for k in kits.values())
    registry.add(
        SkillEntry(
            spec=SkillSpec(SKILL_ID, "1", "delegate: intents to programs over kits", METHODS),
            component=DelegateBackend(service),
            # A model tier may take its own timeout before the program runs.
            limits=Limits(timeout_ms=longest + int(service.config.timeout_s * 1000)),
            exposure=Exposure(names={m.name: m.name for m in METHODS}),
            annotations=ToolAnnotations(
                read_only=worst_w <= 1,
                destructive=worst_w >= 2,
                idempotent=False,
                open_world=worst_d >= 3,
            ),
        )
    )
    return service
