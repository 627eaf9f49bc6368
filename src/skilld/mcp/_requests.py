"""How a request's guest call runs: at once, in input-required rounds, or as a task.

The handlers (``_server`` for tools, ``_surfaces`` for resources and prompts) hand a
request here with what its guest runs on the call's thread (``run``, from ``_content``).
The request's protocol era (and, for a tool, its task mode) decides the way; whichever it
is, the call is started by the ring's :meth:`~skilld.mcp._ring.Ring.call`, bound here and
handed down to ``_rounds`` or ``_tasks``, which call it and nothing above them.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from functools import partial
from typing import Any, TypeVar

from mcp import types
from mcp.server.context import ServerRequestContext

from skilld.mcp._channel import SessionChannel, min_level_of, modern, request_channel
from skilld.mcp._relay import is_forwarded
from skilld.mcp._ring import Ring
from skilld.mcp._rounds import (
    ParkedCalls,
    RoundChannel,
    Rounds,
    in_rounds,
    round_channel,
    skill_digest,
)
from skilld.mcp._tasks import Tasks, as_task
from skilld.types import Caller

T = TypeVar("T")
Ctx = ServerRequestContext[Any, Any]


class Requests:
    """Runs the guest calls of one server's requests through ``ring``.

    Args:
        ring: what runs each call.
        parked: the calls kept across input-required rounds (and tasks).
        tasks: this server's tasks.
        request_timeout_s: how long a guest's question to the client may wait.
    """

    def __init__(
        self, ring: Ring, parked: ParkedCalls, tasks: Tasks, request_timeout_s: float
    ) -> None:
        self._ring = ring
        self._parked = parked
        self._tasks = tasks
        self._timeout = request_timeout_s

    async def answer(
        self,
        ctx: Ctx,
        params: Rounds,
        target: str,
        definition: Mapping[str, Any],
        *,
        caller: Caller,
        skill: str,
        label: str,
        run: Callable[[SessionChannel], T],
        inline: Callable[[SessionChannel], T] | None = None,
        arguments: Mapping[str, Any],
        rounds: list[RoundChannel],
    ) -> T | types.InputRequiredResult:
        """Run the request's guest call (``run``; ``inline`` tried first if given): at once
        in the handshake era; in input-required rounds (``_rounds.in_rounds``) in
        2026-07-28, ``definition`` (the target's schemas) bound into the round's
        ``requestState``. A round's channel is appended to ``rounds``.

        Raises:
            MCPError: ``-32602`` for a ``requestState`` naming no call of ``target`` here.
            SkilldError: as :meth:`Ring.call`.
        """
        start = self._start(ctx, caller, skill, label, run, inline, arguments)
        if not modern(ctx):
            return await start(request_channel(ctx, skill, self._timeout))
        return await in_rounds(
            self._parked,
            ctx,
            params,
            target,
            skill_digest(target, skill, dict(definition)),
            caller=caller,
            forwarded=is_forwarded(ctx),
            min_level=min_level_of(ctx),
            new_channel=partial(round_channel, ctx, skill, self._timeout),
            start=start,
            rounds=rounds,
        )

    async def as_task(
        self,
        ctx: Ctx,
        params: types.CallToolRequestParams,
        definition: Mapping[str, Any],
        *,
        caller: Caller,
        skill: str,
        run: Callable[[SessionChannel], types.CallToolResult],
        arguments: Mapping[str, Any],
        required: bool,
    ) -> types.CallToolResult | types.InputRequiredResult | dict[str, Any]:
        """Run the tool call as a task (``_tasks.as_task``): ``CreateTaskResult``, or the
        rounds a ``required`` tool's guest asks before it becomes one.

        Raises:
            MCPError: the caller's task caps refuse it (nothing ran); ``-32602`` for a
                ``requestState`` naming no call of this tool here.
        """
        name = params.name
        return await as_task(
            self._parked,
            self._tasks,
            ctx,
            params,
            name,
            skill_digest(name, skill, dict(definition)),
            caller=caller,
            forwarded=is_forwarded(ctx),
            min_level=min_level_of(ctx),
            new_channel=partial(round_channel, ctx, skill, self._timeout),
            start=self._start(ctx, caller, skill, name, run, None, arguments),
            required=required,
        )

    def _start(
        self,
        ctx: Ctx,
        caller: Caller,
        skill: str,
        label: str,
        run: Callable[[SessionChannel], T],
        inline: Callable[[SessionChannel], T] | None,
        arguments: Mapping[str, Any],
    ) -> Callable[[SessionChannel], Coroutine[Any, Any, T]]:
        """What starts the request's guest call on a channel: :meth:`Ring.call`, bound."""
        return partial(
            self._ring.call,
            skill=skill,
            label=label,
            run=run,
            inline=inline,
            arguments=arguments,
            caller=caller,
            request_id=ctx.request_id,
        )
