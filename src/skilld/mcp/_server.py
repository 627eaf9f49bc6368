"""The MCP adapter: a :class:`~skilld.registry.Dispatcher` on the SDK's low-level ``Server``.

Nothing here knows what a skill does: tools, resources and prompts come from the
dispatcher, and every behaviour lives behind it. This module maps requests to guest
calls and back: ``tools/list`` and ``tools/call`` (the request's caller, the caller
rules' early refusal, argument validation, then the call at once, in input-required
rounds or as a task), the server's handlers and notifications of changed lists. What
a call goes through below it is one module each, called downward and never calling
back in here:

- ``_surfaces``: resources and prompts (handlers beside these);
- ``_requests``: the call at once, in rounds or as a task, started by the ring;
- ``_rounds`` (input-required rounds) and ``_tasks`` (tasks, and ``tasks/*``);
- ``_ring``: drain, the skill's gate, the worker thread, metrics and the call log;
- ``_content``: a guest's output as MCP content, made on the call's thread.
"""

from __future__ import annotations

import asyncio
import secrets
import weakref
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any, Protocol, TypeVar, cast, runtime_checkable

from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.models import InitializationOptions
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ListenHandler,
    PromptsListChanged,
    ResourcesListChanged,
    ToolsListChanged,
)
from mcp.shared.exceptions import MCPError
from starlette.requests import HTTPConnection

from skilld import telemetry
from skilld.errors import RegistryError, SkilldError, UsageError
from skilld.mcp import _skills_ext as skills_extension
from skilld.mcp._caller import caller_of, not_permitted
from skilld.mcp._channel import (
    LEVEL_KEY,
    modern,
    session_state,
)
from skilld.mcp._config import ServeConfig
from skilld.mcp._connections import CallerShares
from skilld.mcp._content import (
    call_tool,
    call_tool_inline,
    error_result,
    error_text,
    object_schema,
)
from skilld.mcp._logging import Logger
from skilld.mcp._metrics import Metrics
from skilld.mcp._relay import forwarder, run_relayed
from skilld.mcp._requests import Requests
from skilld.mcp._ring import Ring
from skilld.mcp._rounds import (
    ParkedCalls,
    RoundChannel,
    raise_missing,
)
from skilld.mcp._schema import ArgumentValidator
from skilld.mcp._surfaces import Surfaces
from skilld.mcp._tasks import (
    TASKS,
    TaskListen,
    TaskRequests,
    client_capabilities,
    declares_tasks,
    tasks_of,
    tasks_required,
)
from skilld.mcp._wiring import Wiring
from skilld.registry import Dispatcher, Tool

P = TypeVar("P")
R = TypeVar("R")
Ctx = ServerRequestContext[Any, Any]


@runtime_checkable
class Watched(Protocol):
    """A dispatcher whose skills change while it serves (``Registry.watch``: a cluster)."""

    def watch(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from any thread) whenever skills come or go."""
        ...


class _ChangingServer(Server[Any]):
    """A server whose tools, resources and prompts change while it serves (a cluster).

    It says so in its capabilities (``listChanged``) on every transport, including the
    ones that build their initialization options themselves (Streamable HTTP).
    """

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options
            or NotificationOptions(
                prompts_changed=True, resources_changed=True, tools_changed=True
            ),
            experimental_capabilities,
            extensions,
        )


class McpService:
    """A dispatcher served over MCP; build once per server run, inside its event loop.

    Args:
        dispatcher: what is served.
        config: limits and timeouts.
        log: where the call log goes (one JSON line per call).
        metrics: the counters ``/metrics`` reports.
        wiring: the live objects the node wired serving to (``Node.serving``): a
            cluster's round peers and task board; None: a server on its own.
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        config: ServeConfig,
        log: Logger,
        metrics: Metrics,
        wiring: Wiring | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.config = config
        self.metrics = metrics
        self.log = log
        self.ring = Ring(dispatcher, config, log, metrics)
        # An HTTP client's calls, reads and prompts until answered (see _counted).
        self._in_progress = CallerShares("requests in progress", config.max_requests_per_caller)
        self._tools: dict[str, Tool] = {}
        self._validators: dict[str, ArgumentValidator] = {}
        # Connections that listed or called something: told when the dispatcher's skills
        # change. The connection, not ``ctx.session``: the SDK makes a session object per
        # request, so a weak set of those emptied as soon as each request ended, and only
        # clients with a call in flight heard of a change. A connection lives as long as
        # its client's session (weakly held here, so a closed one is dropped).
        self._sessions: weakref.WeakSet[Any] = weakref.WeakSet()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._notifying: set[asyncio.Task[None]] = set()
        self._bus = InMemorySubscriptionBus()
        self.parked = ParkedCalls(
            config.node_id or f"node-{secrets.token_hex(6)}",
            config.round_ttl_s,
            max_per_caller=config.max_rounds_per_caller,
        )
        peers = wiring.round_peers if wiring is not None else None
        if peers is not None:
            # A cluster's entry nodes: retries of rounds parked elsewhere go there (_relay).
            self.parked.forward = forwarder(peers)
            peers.serve(self._relayed, asyncio.get_running_loop())
        board = wiring.task_board if wiring is not None else None
        self.tasks = tasks_of(dispatcher, config, self.parked.node, board)
        self._task_tools = dict(config.task_tools)
        self.requests = Requests(
            self.ring, self.parked, self.tasks, config.client_request_timeout_s
        )
        self._surfaces = Surfaces(dispatcher, self.ring, self.requests, config.max_reads_per_caller)
        changing = isinstance(dispatcher, Watched)
        self.server = self._build(changing=changing)
        if isinstance(dispatcher, Watched):
            dispatcher.watch(self._dispatcher_changed)

    # -- lifecycle ------------------------------------------------------------

    @property
    def draining(self) -> bool:
        """True once :meth:`drain` began: new calls are refused."""
        return self.ring.draining

    async def drain(self, timeout: float) -> bool:
        """Refuse new calls and wait up to ``timeout`` seconds for calls in flight
        (:meth:`Ring.drain`; past the grace the calls still running end as ``shutdown``).

        Returns True when every call finished in time.
        """
        return await self.ring.drain(timeout, self.parked)

    def _dispatcher_changed(self) -> None:
        """Skills came or went (a cluster node joined or left): any thread may call this."""
        self._tools = {}
        self._validators = {}
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._notify_sessions)

    def _notify_sessions(self) -> None:
        task = asyncio.get_running_loop().create_task(self._send_list_changed())
        self._notifying.add(task)
        task.add_done_callback(self._notifying.discard)

    async def _send_list_changed(self) -> None:
        for event in (ToolsListChanged(), ResourcesListChanged(), PromptsListChanged()):
            await self._bus.publish(event)
        for session in list(self._sessions):
            try:
                await session.send_tool_list_changed()
                await session.send_resource_list_changed()
                await session.send_prompt_list_changed()
            except Exception:  # noqa: BLE001 - a connection that went away is just dropped
                self._sessions.discard(session)

    def _seen(self, ctx: Ctx) -> None:
        # mcp 2 offers no public way from a request to its connection; should the private
        # attribute go, the per-request session is the (weaker) fallback. Both have the
        # send_*_list_changed methods, sent on the connection's standalone stream.
        self._sessions.add(getattr(ctx.session, "_connection", ctx.session))
        if self._loop is None:
            self._loop = asyncio.get_running_loop()

    def _counted(
        self, handler: Callable[[Ctx, P], Awaitable[R]]
    ) -> Callable[[Ctx, P], Awaitable[R]]:
        """``handler``, counting an HTTP client's request against its caller's requests in
        progress (``max_requests_per_caller``) until it is answered. The transport counts
        the HTTP request, but over the legacy SSE transport a POST is answered 202 as soon
        as its message is handed over, while the call it carries goes on: without this,
        one caller's POSTs had any number of calls in flight.

        Raises:
            MCPError: ``-32603`` when the caller has its share in progress already.
        """

        async def counted(ctx: Ctx, params: P) -> R:
            if not isinstance(ctx.request, HTTPConnection):
                return await handler(ctx, params)
            key = caller_of(ctx).key
            if not self._in_progress.take(key):
                cap = self._in_progress.cap
                raise MCPError(
                    types.INTERNAL_ERROR,
                    f"too many requests in progress for this caller (at most {cap}); "
                    "wait for one to be answered",
                    data={"limit": cap, "scope": "caller"},
                )
            try:
                return await handler(ctx, params)
            finally:
                self._in_progress.give(key)

        return counted

    def _build(self, *, changing: bool) -> Server[Any]:
        server: Server[Any] = (_ChangingServer if changing else Server)(
            self.config.server_name,
            version=self.config.server_version,
            get_tool_input_schema=self._input_schema,
            on_list_tools=self._list_tools,
            # A task's CreateTaskResult is a plain dict (an extension's result type the
            # SDK passes through on 2026-07-28), outside the handler's declared union.
            on_call_tool=cast(Any, self._counted(self._call_tool)),
            on_list_resources=self._surfaces.list_resources,
            on_list_resource_templates=self._surfaces.list_templates,
            on_read_resource=self._counted(self._surfaces.read_resource),
            on_subscribe_resource=self._surfaces.subscribe,
            on_unsubscribe_resource=self._surfaces.unsubscribe,
            on_list_prompts=self._surfaces.list_prompts,
            on_get_prompt=self._counted(self._surfaces.get_prompt),
            on_completion=self._surfaces.complete,
            # 2026-07-28 clients hear of changes only on a subscriptions/listen stream
            # they open (handshake-era ones on their standalone stream, see _seen).
            on_subscriptions_listen=(
                TaskListen(ListenHandler(self._bus), self.tasks) if changing else None
            ),
        )
        # Registered by hand: the constructor argument warns that the 2026-07-28
        # revision drops logging, but the handshake revisions clients speak today have it.
        server.add_request_handler("logging/setLevel", types.SetLevelRequestParams, self._set_level)
        skills_extension.register(server, self.dispatcher)
        # Seals the requestState of input-required rounds and refuses a tampered,
        # expired or foreign one before any handler runs (see _rounds).
        keys = self.config.request_state_keys
        ttl = self.config.round_ttl_s
        security = (
            RequestStateSecurity(keys=list(keys), ttl=ttl)
            if keys
            else RequestStateSecurity.ephemeral(ttl=ttl)
        )
        server.middleware.append(
            RequestStateBoundary(security, default_audience=self.config.server_name)
        )
        telemetry.mcp_middleware(server.middleware)
        # Always offered: which tools may run as tasks comes from the policy
        # (``mcp.tasks``, also of skills a cluster node joins with later) or the config.
        server.extensions[TASKS] = {}
        TaskRequests(self.tasks).register(server)
        return server

    async def _relayed(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """A retry another entry node forwarded here: run as a client's retry is (_relay)."""
        handlers: dict[str, Callable[[Any, Any], Any]] = {
            "tools/call": self._call_tool,
            "prompts/get": self._surfaces.get_prompt,
            "resources/read": self._surfaces.read_resource,
        }
        return await run_relayed(request, handlers)

    # -- tools ------------------------------------------------------------------

    def _task_mode(self, tool: Tool) -> str | None:
        """``optional``/``required`` when ``tool`` may run as a task (config, else policy)."""
        return self._task_tools.get(tool.name) or tool.task_support

    def _tool(self, name: str) -> Tool | None:
        if name not in self._tools:
            # Tools are fixed at build time, but the dispatcher may finish loading after we start.
            self._tools = {t.name: t for t in self.dispatcher.tools()}
        return self._tools.get(name)

    def _input_schema(self, name: str) -> Mapping[str, Any] | None:
        tool = self._tool(name)
        return None if tool is None else tool.input_schema

    def _validator(self, tool: Tool) -> ArgumentValidator:
        if tool.name not in self._validators:
            self._validators[tool.name] = ArgumentValidator(
                tool.input_schema, where=f"tool {tool.name}"
            )
        return self._validators[tool.name]

    async def _list_tools(
        self, ctx: Ctx, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        self._seen(ctx)
        tools = []
        # By name: the same list whatever order skills loaded in (or cluster nodes joined),
        # so a client's cache and a round-robin over entry nodes see one list.
        for tool in sorted(self.dispatcher.view(caller_of(ctx)).tools(), key=lambda t: t.name):
            output = None if tool.output_schema is None else object_schema(tool.output_schema)[0]
            hints = tool.annotations
            tools.append(
                types.Tool(
                    name=tool.name,
                    title=tool.title,
                    description=tool.description,
                    input_schema=dict(tool.input_schema),
                    output_schema=output,
                    execution=(
                        types.ToolExecution(task_support=cast(Any, self._task_mode(tool)))
                        if self._task_mode(tool)
                        else None
                    ),
                    annotations=types.ToolAnnotations(
                        title=tool.title,
                        read_only_hint=hints.read_only,
                        destructive_hint=hints.destructive,
                        idempotent_hint=hints.idempotent,
                        open_world_hint=hints.open_world,
                    ),
                )
            )
        return types.ListToolsResult(tools=tools)

    async def _call_tool(
        self, ctx: Ctx, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult | dict[str, Any]:
        self._seen(ctx)
        name = params.name
        tool = self._tool(name)
        if tool is None:
            raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {name}")
        arguments = dict(params.arguments or {})
        caller = caller_of(ctx)
        refusal = not_permitted(
            self.ring, ctx, caller, "tool", name, tool.skill_id, name, arguments
        )
        if refusal is not None:
            return error_result(error_text(refusal)[2])
        try:
            self._validator(tool).check(arguments)
        except UsageError as exc:
            text = error_text(exc)[2]
            self.ring.refused(tool.skill_id, name, "invalid-argument", text, arguments, caller)
            return error_result(text)
        budget_s = self.config.inline_ms / 1000
        # Run on the call's thread (or inline on the loop): the guest's output comes back
        # as MCP content from _content, not through this module.
        run = partial(call_tool, self.dispatcher, tool, arguments, caller)
        inline = (
            partial(call_tool_inline, self.dispatcher, tool, arguments, caller, budget_s)
            if budget_s > 0 and tool.inline
            else None
        )
        rounds: list[RoundChannel] = []
        task_mode = self._task_mode(tool)
        tasked = (
            task_mode is not None
            and modern(ctx)
            and declares_tasks(ctx.params, client_capabilities(ctx))
        )
        if task_mode == "required" and not tasked:
            raise tasks_required()
        definition = {"in": tool.input_schema, "out": tool.output_schema}
        try:
            if tasked:
                return await self.requests.as_task(
                    ctx,
                    params,
                    definition,
                    caller=caller,
                    skill=tool.skill_id,
                    run=run,
                    arguments=arguments,
                    required=task_mode == "required",
                )
            result = await self.requests.answer(
                ctx,
                params,
                name,
                definition,
                caller=caller,
                skill=tool.skill_id,
                label=name,
                run=run,
                inline=inline,
                arguments=arguments,
                rounds=rounds,
            )
        except RegistryError as exc:
            raise MCPError(types.INVALID_PARAMS, str(exc)) from exc
        except SkilldError as exc:
            raise_missing(rounds)
            return error_result(error_text(exc)[2])
        except MCPError:
            raise
        # A bug below the seam costs this one call, never the session (the ring logged it).
        except Exception as exc:  # noqa: BLE001
            return error_result(f"[internal] the call failed unexpectedly: {type(exc).__name__}")
        if isinstance(result, types.CallToolResult) and result.is_error:
            raise_missing(rounds)
        return result

    # -- logging ----------------------------------------------------------------

    async def _set_level(self, ctx: Ctx, params: types.SetLevelRequestParams) -> types.EmptyResult:
        session_state(ctx)[LEVEL_KEY] = params.level
        return types.EmptyResult()
