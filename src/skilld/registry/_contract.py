"""The contract between the MCP layer and the skills behind it.

The MCP layer (``skilld.mcp``) only ever sees a :class:`Dispatcher`: the tools,
resources and prompts it exposes, and a blocking ``call`` that runs one guest
call to the end. Guest calls block (the wasm engine runs on the caller's
thread), so the MCP layer runs them in worker threads and hands each one a
:class:`ClientChannel`: the guest's way back to the MCP client of that call
(progress, logs, sampling, elicitation, cancellation).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from skilld.call import CallContext, CallGate
from skilld.types import Caller, CallOutput, ClientChannel, PromptSpec, ResourceSpec


@runtime_checkable
class AnswersInline(Protocol):
    """A backend that may answer on the caller's thread (an event loop) without blocking:
    an inline attempt is made of it (delegate's ``kit_list``); ``answers_inline`` is True."""

    answers_inline: bool


# Who a call made without saying is for: the local user (tests, benches, the CLI's own use).
LOCAL = Caller.local()

if TYPE_CHECKING:
    from skilld.registry._access import CallerView


@dataclass(frozen=True, slots=True)
class ToolAnnotations:
    """MCP tool hints, derived from a skill's effective grants (never its claims)."""

    read_only: bool
    destructive: bool
    idempotent: bool
    open_world: bool


@dataclass(frozen=True, slots=True)
class Tool:
    """One MCP tool: a skill method (or a whole skill) under an exposed name."""

    name: str
    description: str
    input_schema: Mapping[str, Any]
    output_schema: Mapping[str, Any] | None
    annotations: ToolAnnotations
    skill_id: str
    method: str | None  # None for a per-skill tool whose arguments name the method
    title: str | None = None
    # "optional" | "required": may run as an MCP task (the policy's ``mcp.tasks``)
    task_support: str | None = None
    # Whether an inline attempt (``Dispatcher.call_inline``) can answer a call of it. False
    # when its skill's backend never answers on the event loop (a wasm guest, a script, a
    # remote node): the MCP layer then goes to a worker thread at once, without an attempt
    # that would only give up (about 25 µs of the event loop's time a call).
    inline: bool = True


class SkillBackend(Protocol):
    """What runs one skill's methods, resource reads and prompts behind the registry.

    The sandbox's :class:`~skilld.sandbox.Component` is one (a wasm guest per call);
    skills implemented by the host (Agent Skills' tiers, delegate's tools) and skills
    held by another node of a cluster are others. The registry takes the slot, builds
    the :class:`~skilld.call.CallContext` and writes the audit record; a backend
    runs the call in that context and:

    - ends by ``ctx.deadline`` (``ctx.remaining()``) and stops early once
      ``ctx.channel.cancelled()``;
    - records every permission decision it takes with ``ctx.record``;
    - calls ``ctx.thread_only()`` first when it cannot finish without blocking
      (anything but a quick pure answer): an inline attempt gives up there. Only a
      backend that is :class:`AnswersInline` is tried inline at all (delegate's,
      for ``kit_list``); for any other the registry gives an attempt up before the call
      is set up;
    - raises only :class:`~skilld.errors.SkilldError` subclasses (``GuestError`` for a
      typed refusal, a ``GuestFault`` for deadline, cancellation or a crash).
    """

    def call(self, method: str, args_json: str, ctx: CallContext) -> CallOutput:
        """Run ``method`` with JSON arguments."""
        ...

    def read_resource(self, uri: str, ctx: CallContext) -> list[CallOutput]:
        """Read the resource ``uri``."""
        ...

    def get_prompt(self, name: str, args_json: str, ctx: CallContext) -> list[dict[str, Any]]:
        """Render the prompt ``name`` with JSON arguments into messages."""
        ...


class Dispatcher(Protocol):
    """What the MCP layer serves. Implemented by ``skilld.registry.Registry``.

    ``call``, ``read_resource`` and ``get_prompt`` block, and each runs guest code
    the same way (the skill's slots, one audit record); they raise ``RegistryError``
    for unknown names (``resource_skill`` and ``prompt_skill`` too), ``GuestError``
    for typed guest errors, ``GuestFault`` subclasses for traps, deadlines, memory
    exhaustion and cancellation, and ``UsageError`` for malformed arguments. The
    caller checks arguments against the input schema before it calls.
    """

    def tools(self) -> Sequence[Tool]:
        """Every exposed tool, in a stable order."""
        ...

    def call(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        channel: ClientChannel,
        *,
        caller: Caller = LOCAL,
    ) -> CallOutput:
        """Run one tool call to the end, on behalf of ``caller``."""
        ...

    def call_inline(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        channel: ClientChannel,
        budget_s: float,
        *,
        caller: Caller = LOCAL,
    ) -> CallOutput:
        """Try ``call`` on the caller's thread (an event loop) for about ``budget_s`` at most.

        Raises ``skilld.errors.RunOnThread``, having done nothing anyone can see, when
        the call needs longer or could block; a dispatcher that cannot tell raises it
        always. The caller then runs ``call`` on a worker thread.
        """
        ...

    def refused(
        self,
        skill: str,
        label: str,
        arguments: Mapping[str, Any],
        outcome: str,
        error: str,
        *,
        caller: Caller = LOCAL,
    ) -> None:
        """Audit a request refused before its guest ran (``invalid-argument``, ``busy``,
        ``draining``); ``label`` is the tool's name, ``resource:URI`` or ``prompt:NAME``.
        """
        ...

    def resources(self) -> Sequence[ResourceSpec]:
        """Every resource and resource template the skills serve."""
        ...

    def resource_skill(self, uri: str) -> str:
        """The id of the skill serving ``uri`` (its concurrency slots apply to the read)."""
        ...

    def gate(self, skill_id: str) -> CallGate:
        """The skill's one concurrency gate (``skilld.call.CallGate``; ``RegistryError``
        for an unknown skill). The caller takes a slot there and lends it to the call
        it runs (``Slot.lend``), which then takes no second one.
        """
        ...

    def read_resource(
        self, uri: str, channel: ClientChannel, *, caller: Caller = LOCAL
    ) -> Sequence[CallOutput]:
        """Read one resource (each output holds its contents)."""
        ...

    def prompts(self) -> Sequence[PromptSpec]:
        """Every prompt the skills serve."""
        ...

    def prompt_skill(self, name: str) -> str:
        """The id of the skill serving the prompt ``name``."""
        ...

    def get_prompt(
        self,
        name: str,
        arguments: Mapping[str, Any],
        channel: ClientChannel,
        *,
        caller: Caller = LOCAL,
    ) -> Sequence[Mapping[str, Any]]:
        """Render a prompt to MCP prompt messages."""
        ...

    def ready(self) -> bool:
        """True when every skill is loaded."""
        ...

    def view(self, caller: Caller) -> CallerView:
        """What ``caller`` may list, and the decision for each call it makes
        (``skilld.registry.CallerView``): every list is filtered through it, and every
        call asks its :meth:`~CallerView.permit` first."""
        ...
