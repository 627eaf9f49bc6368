"""The MCP surface of a :class:`~skilld.registry.Dispatcher`, on the SDK's low-level ``Server``.

Nothing here knows what a skill does: tools, resources and prompts come from the
dispatcher, and every behaviour lives behind it. This module owns the protocol
mapping (skill values and content blocks to MCP content, skilld errors to tool
errors or JSON-RPC errors), argument validation before a guest runs, waiting for a
slot of each skill's gate (``dispatcher.gate``) on the event loop, the worker threads
that run blocking guest calls, cancellation, per-session state (log level,
subscriptions), metrics and the call log.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any, Protocol, TypeVar, cast, runtime_checkable

import anyio
import structlog
from mcp import types
from mcp.server.connection import allowed_log_levels
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
from mcp.shared.uri_template import InvalidUriTemplate, UriTemplate
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError
from starlette.requests import HTTPConnection

from skilld import telemetry
from skilld.errors import (
    ErrorCode,
    GuestError,
    RegistryError,
    RunOnThread,
    SkillBusy,
    SkilldError,
    UsageError,
)
from skilld.mcp import _skills_ext as skills_extension
from skilld.mcp._caller import caller_of, refused_error
from skilld.mcp._channel import LOG_LEVELS, SessionChannel
from skilld.mcp._config import ServeConfig
from skilld.mcp._connections import CallerShares
from skilld.mcp._metrics import Metrics
from skilld.mcp._relay import forwarder, is_forwarded, run_relayed
from skilld.mcp._rounds import (
    ParkedCalls,
    RoundChannel,
    Rounds,
    in_rounds,
    missing_capability,
    plain,
    skill_digest,
)
from skilld.mcp._schema import ArgumentValidator
from skilld.mcp._tasks import (
    TASKS,
    TaskListen,
    as_task,
    client_capabilities,
    declares_tasks,
    tasks_of,
    tasks_required,
)
from skilld.mcp._wiring import Wiring
from skilld.mcp._workers import WorkerPool
from skilld.registry import CallerView, Dispatcher, Slot, TargetKind, Tool
from skilld.types import Caller, CallOutput, ContentBlock, PromptSpec, ResourceSpec

T = TypeVar("T")
P = TypeVar("P")
R = TypeVar("R")
Ctx = ServerRequestContext[Any, Any]
Logger = structlog.typing.FilteringBoundLogger

RESOURCE_NOT_FOUND = -32002  # the MCP spec's code for an unknown resource URI
_LEVEL_KEY = "skilld.log_level"
_SUBS_KEY = "skilld.subscriptions"
# A session's subscriptions live in memory as long as it does: bounded, so that one
# caller's sessions (max_sessions_per_caller of them) hold at most a few MiB of URIs.
MAX_SUBSCRIPTIONS = 128
MAX_SUBSCRIBED_URI = 4096
# Past the drain's grace, the calls still running get this long to end and be answered
# "the server shut down" before the connections close (a guest stops at its next epoch
# check, a confined process tree is killed at once).
_CUT_S = 1.0
_DEFAULT_LEVEL: types.LoggingLevel = "info"


def _session_state(ctx: Ctx) -> dict[str, Any]:
    """Per-session scratch state, kept on the SDK's connection object.

    ``ServerRequestContext`` does not expose the connection yet (the SDK's own
    ``Context`` does, and replaces it in a later 2.x); this is the one place that
    reaches for it.
    """
    state: dict[str, Any] = ctx.session._connection.state
    return state


def _modern(ctx: Ctx) -> bool:
    """True for a 2026-07-28 request (stateless; questions to the client go in rounds)."""
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


HEADER_MISMATCH = -32020  # SEP-2243: a routing header disagrees with the body
# How long tasks/cancel waits for another entry node to apply it (the ack goes out anyway).
_CANCEL_WAIT_S = 3.0


class _TaskParams(types.RequestParams):
    """``tasks/get``, ``tasks/update`` and ``tasks/cancel`` params."""

    task_id: str
    input_responses: dict[str, Any] | None = None


def _task_outcome(
    exc: BaseException | None, value: Any
) -> tuple[str, Mapping[str, Any] | None, Any]:
    """A finished task call: (status, error, result) as ``tasks/get`` reports them.

    A guest that reported an error ran: ``completed`` with ``isError``; a guest that
    crashed, or a failure below the seam, is ``failed`` with a JSON-RPC error.
    """
    dump: Callable[[types.CallToolResult], Any] = lambda r: r.model_dump(  # noqa: E731
        by_alias=True, mode="json", exclude_none=True
    )
    if exc is None:
        return "completed", None, dump(value)
    if isinstance(exc, SkilldError):
        code, _rule, text = error_text(exc)
        if code == "cancelled":
            return "cancelled", None, None
        if code not in ("internal", "fault"):
            return "completed", None, dump(_error_result(text))
        return "failed", {"code": types.INTERNAL_ERROR, "message": text}, None
    return "failed", {"code": types.INTERNAL_ERROR, "message": "the call failed unexpectedly"}, None


def error_text(exc: SkilldError) -> tuple[str, str | None, str]:
    """The WIT error code, the rule id (if any) and the message a tool error shows."""
    # Each error class carries its code (skilld.errors' table).
    code, rule = exc.code, exc.rule
    head = f"[{code}, rule {rule}]" if rule else f"[{code}]"
    return code, rule, f"{head} {SkilldError.__str__(exc)}"


def _error_result(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


def _b64(data: bytes | None) -> str:
    return base64.b64encode(data or b"").decode("ascii")


def content_block(block: ContentBlock) -> types.ContentBlock:
    """One skill content block as MCP content.

    Raises:
        GuestError: the block's kind is unknown (code ``internal``).
    """
    if block.kind == "text":
        return types.TextContent(type="text", text=block.text or "")
    if block.kind == "image":
        return types.ImageContent(
            type="image", data=_b64(block.data), mime_type=block.mime_type or "image/png"
        )
    if block.kind == "audio":
        return types.AudioContent(
            type="audio", data=_b64(block.data), mime_type=block.mime_type or "audio/wav"
        )
    if block.kind == "embedded":
        return types.EmbeddedResource(type="resource", resource=_resource_contents(block, ""))
    raise GuestError("internal", f"the skill returned content of unknown kind '{block.kind}'")


def _resource_contents(
    block: ContentBlock, uri: str, default_mime: str | None = None
) -> types.TextResourceContents | types.BlobResourceContents:
    where = block.uri or uri
    mime = block.mime_type or default_mime
    if block.text is not None and block.data is None:
        return types.TextResourceContents(
            uri=where, mime_type=mime or "text/plain", text=block.text
        )
    return types.BlobResourceContents(
        uri=where, mime_type=mime or "application/octet-stream", blob=_b64(block.data)
    )


def resource_contents(
    uri: str, outputs: Sequence[CallOutput], mime: str | None
) -> list[types.TextResourceContents | types.BlobResourceContents]:
    """What ``resources/read`` returns for the outputs a skill produced.

    Content blocks become contents (text or base64 blob; an embedded block keeps
    its own URI); an output without blocks contributes its value: a string as
    text, anything else as JSON.
    """
    contents: list[types.TextResourceContents | types.BlobResourceContents] = []
    for output in outputs:
        if output.content:
            contents += [_resource_contents(b, uri, mime) for b in output.content]
        elif isinstance(output.value, str):
            contents.append(
                types.TextResourceContents(
                    uri=uri, mime_type=mime or "text/plain", text=output.value
                )
            )
        else:
            contents.append(
                types.TextResourceContents(
                    uri=uri,
                    mime_type=mime or "application/json",
                    text=json.dumps(output.value, separators=(",", ":")),
                )
            )
    return contents


def _object_schema(schema: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """An output schema MCP accepts (an object) and whether values are wrapped as ``result``."""
    if schema.get("type") == "object":
        return dict(schema), False
    return {"type": "object", "properties": {"result": dict(schema)}, "required": ["result"]}, True


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
        self._log = log
        self._workers = WorkerPool(config.worker_threads, idle_s=config.worker_idle_s)
        # An HTTP client's calls, reads and prompts until answered (see _counted).
        self._requests = CallerShares("requests in progress", config.max_requests_per_caller)
        self._tools: dict[str, Tool] = {}
        self._validators: dict[str, ArgumentValidator] = {}
        self._in_flight = 0
        # The channels of the calls in flight: what a drain past its grace ends.
        self._running: set[SessionChannel] = set()
        self._idle: anyio.Event | None = None
        self.draining = False
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
        changing = isinstance(dispatcher, Watched)
        self.server = self._build(changing=changing)
        if isinstance(dispatcher, Watched):
            dispatcher.watch(self._dispatcher_changed)

    # -- lifecycle ------------------------------------------------------------

    async def drain(self, timeout: float) -> bool:
        """Refuse new calls and wait up to ``timeout`` seconds for calls in flight.

        Past the grace the calls still running are ended as ``shutdown`` (not as a client's
        cancel): their clients are answered ``[unavailable] the server shut down ...``
        while the connections are still open, within ``_CUT_S`` more.

        Returns True when every call finished in time.
        """
        self.draining = True
        # A call parked on a question would hold the drain until its deadline.
        self.parked.cancel_waiting()
        if self._in_flight == 0:
            return True
        self._idle = anyio.Event()
        self._log.info("draining", in_flight=self._in_flight, grace_s=timeout)
        with anyio.move_on_after(timeout):
            await self._idle.wait()
        if self._in_flight == 0:
            return True
        self._log.warning("drain_cut", in_flight=self._in_flight, grace_s=timeout)
        # Calls running in the background (2026-07-28 requests, tasks) have no request
        # for the transport to cancel at shutdown: tell each to stop, as a cancelled
        # request's call is told (the guest stops at its next epoch check).
        self.parked.cancel_all("shutdown")
        for channel in list(self._running):
            channel.cancel("shutdown")
        with anyio.move_on_after(_CUT_S):
            await self._idle.wait()
        return False

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
            if not self._requests.take(key):
                cap = self._requests.cap
                raise MCPError(
                    types.INTERNAL_ERROR,
                    f"too many requests in progress for this caller (at most {cap}); "
                    "wait for one to be answered",
                    data={"limit": cap, "scope": "caller"},
                )
            try:
                return await handler(ctx, params)
            finally:
                self._requests.give(key)

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
            on_list_resources=self._list_resources,
            on_list_resource_templates=self._list_templates,
            on_read_resource=self._counted(self._read_resource),
            on_subscribe_resource=self._subscribe,
            on_unsubscribe_resource=self._unsubscribe,
            on_list_prompts=self._list_prompts,
            on_get_prompt=self._counted(self._get_prompt),
            on_completion=self._complete,
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
        server.add_request_handler("tasks/get", _TaskParams, self._task_get)
        server.add_request_handler("tasks/update", _TaskParams, self._task_update)
        server.add_request_handler("tasks/cancel", _TaskParams, self._task_cancel)
        return server

    async def _relayed(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """A retry another entry node forwarded here: run as a client's retry is (_relay)."""
        handlers: dict[str, Callable[[Any, Any], Any]] = {
            "tools/call": self._call_tool,
            "prompts/get": self._get_prompt,
            "resources/read": self._read_resource,
        }
        return await run_relayed(request, handlers)

    # -- tasks ----------------------------------------------------------------------

    def _gate_tasks(self, ctx: Ctx, params: _TaskParams) -> None:
        """Refuse a tasks/* request of a client without the extension, or misrouted.

        Raises:
            MCPError: -32021 without the extension; -32020 (HTTP 400) when the
                ``Mcp-Name`` header names another task than the body (SEP-2663 routes
                tasks/* by it, so a mismatch could reach the wrong node).
        """
        if not declares_tasks(ctx.params, client_capabilities(ctx)):
            raise tasks_required()
        headers = getattr(ctx.request, "headers", None)
        named = headers.get("mcp-name") if headers is not None else None
        if named is not None and named.strip() != params.task_id:
            raise MCPError(
                HEADER_MISMATCH,
                "the Mcp-Name header does not match params.taskId",
                data={"header": "Mcp-Name"},
            )

    async def _task_get(self, ctx: Ctx, params: _TaskParams) -> dict[str, Any]:
        self._gate_tasks(ctx, params)
        return self.tasks.get(params.task_id, client=caller_of(ctx).key)

    async def _task_update(self, ctx: Ctx, params: _TaskParams) -> dict[str, Any]:
        self._gate_tasks(ctx, params)
        responses = plain(params.input_responses)
        return self.tasks.update(params.task_id, responses, client=caller_of(ctx).key)

    async def _task_cancel(self, ctx: Ctx, params: _TaskParams) -> dict[str, Any]:
        self._gate_tasks(ctx, params)
        ack = self.tasks.cancel(params.task_id, client=caller_of(ctx).key)
        # Another entry node runs it: let its owner end it before the client's next
        # tasks/get (which then reads cancelled), within a bound.
        with anyio.move_on_after(_CANCEL_WAIT_S):
            while self.tasks.pending_elsewhere(params.task_id):
                await anyio.sleep(0.05)
        return ack

    async def _as_task(
        self,
        ctx: Ctx,
        params: types.CallToolRequestParams,
        name: str,
        digest: str,
        skill: str,
        run: Callable[[SessionChannel], types.CallToolResult],
        arguments: Mapping[str, Any],
        required: bool,
    ) -> types.CallToolResult | types.InputRequiredResult | dict[str, Any]:
        """The call as a task (``_tasks.as_task``), its guest run by :meth:`_guest_call`."""

        async def start(channel: RoundChannel) -> types.CallToolResult:
            return await self._guest_call(
                ctx, skill, name, run, arguments=arguments, channel=channel
            )

        return await as_task(
            self.parked,
            self.tasks,
            ctx,
            params,
            name,
            digest,
            caller=caller_of(ctx),
            forwarded=is_forwarded(ctx),
            min_level=self._min_level(ctx),
            new_channel=partial(self._round_channel, ctx, skill),
            start=start,
            outcome=_task_outcome,
            required=required,
        )

    # -- who may list and call what ------------------------------------------------

    def _view(self, ctx: Ctx) -> CallerView:
        """What the request's caller may list and call (the bundle's caller rules)."""
        return self.dispatcher.view(caller_of(ctx))

    def _not_permitted(
        self,
        ctx: Ctx,
        kind: TargetKind,
        name: str,
        skill: str,
        label: str,
        arguments: Mapping[str, Any],
    ) -> GuestError | None:
        """The refusal (counted and audited under ``label``) when the caller may not call the
        ``kind`` (tool, resource, prompt) named ``name``; else None.

        A retry another entry node forwarded was checked there, against its own caller.
        """
        if is_forwarded(ctx):
            return None
        try:
            self._view(ctx).permit(kind, name, skill)
        except GuestError as exc:
            code, rule, text = error_text(exc)
            self.metrics.denied(skill, rule or "default-deny")
            self._refused(skill, label, code, text, arguments, caller_of(ctx))
            return exc
        return None

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
        for tool in sorted(self._view(ctx).tools(), key=lambda t: t.name):
            output = None if tool.output_schema is None else _object_schema(tool.output_schema)[0]
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
        refusal = self._not_permitted(ctx, "tool", name, tool.skill_id, name, arguments)
        if refusal is not None:
            return _error_result(error_text(refusal)[2])
        try:
            self._validator(tool).check(arguments)
        except UsageError as exc:
            text = error_text(exc)[2]
            self._refused(tool.skill_id, name, "invalid-argument", text, arguments, caller_of(ctx))
            return _error_result(text)
        budget_s = self.config.inline_ms / 1000

        caller = caller_of(ctx)

        def run(channel: SessionChannel) -> types.CallToolResult:
            output = self.dispatcher.call(name, arguments, channel, caller=caller)
            return self._result(tool, output)

        def run_inline(channel: SessionChannel) -> types.CallToolResult:
            output = self.dispatcher.call_inline(name, arguments, channel, budget_s, caller=caller)
            return self._result(tool, output)

        inline = run_inline if budget_s > 0 else None
        rounds: list[RoundChannel] = []
        task_mode = self._task_mode(tool)
        tasked = (
            task_mode is not None
            and _modern(ctx)
            and declares_tasks(ctx.params, client_capabilities(ctx))
        )
        if task_mode == "required" and not tasked:
            raise tasks_required()
        try:
            if not _modern(ctx):
                return await self._guest_call(
                    ctx, tool.skill_id, name, run, inline=inline, arguments=arguments
                )
            definition = {"in": tool.input_schema, "out": tool.output_schema}
            if tasked:
                digest = self._digest(tool.skill_id, name, definition)
                return await self._as_task(
                    ctx,
                    params,
                    name,
                    digest,
                    tool.skill_id,
                    run,
                    arguments,
                    required=task_mode == "required",
                )
            result = await self._in_rounds(
                ctx,
                params,
                name,
                self._digest(tool.skill_id, name, definition),
                tool.skill_id,
                name,
                run,
                inline,
                arguments,
                rounds,
            )
        except RegistryError as exc:
            raise MCPError(types.INVALID_PARAMS, str(exc)) from exc
        except SkilldError as exc:
            self._missing(rounds)
            return _error_result(error_text(exc)[2])
        except MCPError:
            raise
        # A bug below the seam costs this one call, never the session (_guest_call logged it).
        except Exception as exc:  # noqa: BLE001
            return _error_result(f"[internal] the call failed unexpectedly: {type(exc).__name__}")
        if isinstance(result, types.CallToolResult) and result.is_error:
            self._missing(rounds)
        return result

    def _digest(self, skill: str, target: str, definition: Mapping[str, Any]) -> str:
        """What a round's ``requestState`` binds: the tool and its schemas."""
        return skill_digest(target, skill, dict(definition))

    @staticmethod
    def _missing(rounds: list[RoundChannel]) -> None:
        """A failed call that needed a client capability the request did not declare."""
        if rounds and rounds[0].missing:
            raise missing_capability(rounds[0].missing)

    async def _in_rounds(
        self,
        ctx: Ctx,
        params: Rounds,
        target: str,
        digest: str,
        skill: str,
        label: str,
        run: Callable[[SessionChannel], T],
        inline: Callable[[SessionChannel], T] | None,
        arguments: Mapping[str, Any],
        rounds: list[RoundChannel],
    ) -> T | types.InputRequiredResult:
        """The request in input-required rounds (``_rounds.in_rounds``), its guest run by
        :meth:`_guest_call`.

        Raises:
            MCPError: ``-32602`` for a ``requestState`` naming no call of this tool here.
            SkilldError: as :meth:`_guest_call`.
        """

        async def start(channel: RoundChannel) -> T:
            return await self._guest_call(
                ctx, skill, label, run, inline=inline, arguments=arguments, channel=channel
            )

        return await in_rounds(
            self.parked,
            ctx,
            params,
            target,
            digest,
            caller=caller_of(ctx),
            forwarded=is_forwarded(ctx),
            min_level=self._min_level(ctx),
            new_channel=partial(self._round_channel, ctx, skill),
            start=start,
            rounds=rounds,
        )

    def _result(self, tool: Tool, output: CallOutput) -> types.CallToolResult:
        value = output.value
        content: list[types.ContentBlock] = []
        if not (value is None and output.content):
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            content.append(types.TextContent(type="text", text=text))
        content += [content_block(b) for b in output.content]
        structured: dict[str, Any] | None = None
        if tool.output_schema is not None:
            _schema, wrapped = _object_schema(tool.output_schema)
            if wrapped:
                structured = {"result": value}
            elif isinstance(value, dict):
                structured = value
        return types.CallToolResult(content=content, structured_content=structured)

    # -- running blocking dispatcher calls -----------------------------------

    async def _guest_call(
        self,
        ctx: Ctx,
        skill: str,
        label: str,
        run: Callable[[SessionChannel], T],
        inline: Callable[[SessionChannel], T] | None = None,
        arguments: Mapping[str, Any] | None = None,
        channel: SessionChannel | None = None,
    ) -> T:
        """Run guest code for one request: the one path tools, resources and prompts take.

        Refuses while draining, waits up to ``queue_timeout_s`` for one of the skill's
        slots (its one gate, ``dispatcher.gate``; lent to the call, which takes no
        other), counts the call in flight (what :meth:`drain` waits for), runs ``run``
        on a worker thread with a channel to the client, and records metrics and one
        ``tool_call`` log line (``label`` names the tool, resource or prompt).
        ``inline``, when given, is tried first on the event loop itself; when it
        raises :class:`RunOnThread` (the call could block, or needs longer than an
        inline attempt may take), ``run`` goes to the thread as above.

        Raises:
            GuestError: ``unavailable`` while draining; the guest has not run.
            SkillBusy: the skill stayed busy; the guest has not run.
            RegistryError: no such skill.
            SkilldError: whatever ``run`` raised (``RegistryError`` for unknown names).
            Exception: a bug below the seam, logged here with its traceback.
        """
        caller = caller_of(ctx)
        self._refuse_if_draining(skill, label, arguments, caller)
        # "May this caller call this tool?" is asked here, once per call from any MCP entry
        # (tools, resources, prompts, tasks, rounds), before the call waits for anything;
        # a refusal goes through ``_refused`` so it is counted and audited with the caller.
        gate = self.dispatcher.gate(skill)
        # One wait bound for the slot and the thread together.
        waited_until = time.monotonic() + self.config.queue_timeout_s
        try:
            with telemetry.stage("skilld.gate.wait", {"skilld.skill": skill}):
                slot = await gate.take_async(self.config.queue_timeout_s, caller.key)
        except SkillBusy as busy:
            self._log.warning("busy", tool=label, skill=skill, limit=gate.limit)
            self._refused(skill, label, busy.outcome, error_text(busy)[2], arguments, caller)
            raise
        try:
            # Again: drain() may have seen nothing in flight and returned while this
            # call waited for its slot. No await between here and _enter().
            self._refuse_if_draining(skill, label, arguments, caller)
            channel = channel or self._channel(ctx, skill)
            outcome = "cancelled"
            rule: str | None = None
            started = time.perf_counter()
            self._enter()
            self._running.add(channel)
            try:
                result = await self._inline_or_blocking(
                    run, inline, channel, slot, skill, caller.key, waited_until
                )
            except SkilldError as exc:
                # The error class's own word: what the audit record says, /metrics and
                # this log line say too (skilld.errors' table).
                outcome, rule = exc.outcome, exc.rule
                if isinstance(exc, SkillBusy):
                    # No worker thread took the call in time: refused like a busy gate.
                    self._log.warning("busy", tool=label, skill=skill, threads=self._workers.size)
                if exc.code == ErrorCode.NOT_PERMITTED:
                    self.metrics.denied(skill, rule or "default-deny")
                raise
            except Exception:
                outcome = SkilldError.outcome  # a bug below the seam: a fault
                self._log.exception("tool_crashed", tool=label, skill=skill)
                raise
            else:
                outcome = "ok"
                return result
            finally:
                seconds = time.perf_counter() - started
                self._running.discard(channel)
                self._leave()
                self.metrics.finished(skill, label, outcome, seconds)
                self._log.info(
                    "tool_call",
                    tool=label,
                    skill=skill,
                    caller=caller.label(),
                    outcome=outcome,
                    rule=rule,
                    ms=round(seconds * 1000, 3),
                    request_id=ctx.request_id,
                )
        finally:
            slot.release()

    def _refuse_if_draining(
        self, skill: str, label: str, arguments: Mapping[str, Any] | None, caller: Caller
    ) -> None:
        if self.draining:
            refusal = GuestError("unavailable", "the server is shutting down; retry elsewhere")
            self._refused(skill, label, "draining", error_text(refusal)[2], arguments, caller)
            raise refusal

    def _refused(
        self,
        skill: str,
        label: str,
        outcome: str,
        text: str,
        arguments: Mapping[str, Any] | None,
        caller: Caller,
    ) -> None:
        """Count and audit a request ``caller`` made, refused before its guest ran.

        An audit failure is logged, not raised: the request is refused either way,
        and the client should see why it was refused, not the audit's trouble.
        """
        self.metrics.refused(skill, label, outcome)
        try:
            self.dispatcher.refused(skill, label, arguments or {}, outcome, text, caller=caller)
        except SkilldError as exc:
            self._log.error("audit_failed", tool=label, skill=skill, error=str(exc))

    def _enter(self) -> None:
        self._in_flight += 1
        self.metrics.started()

    def _leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0 and self._idle is not None:
            self._idle.set()

    def _min_level(self, ctx: Ctx) -> Callable[[], types.LoggingLevel | None]:
        """The lowest level of guest logs this request's client hears (None: no logs).

        Handshake-era sessions set it with ``logging/setLevel``; a 2026-07-28 request
        asks for logs in its own ``_meta``, and hears none without asking.
        """
        if _modern(ctx):
            allowed = allowed_log_levels(ctx.protocol_version, ctx.meta)
            floor = next((lvl for lvl in LOG_LEVELS if lvl in allowed), None)
            return lambda: floor
        state = _session_state(ctx)
        return lambda: state.get(_LEVEL_KEY, _DEFAULT_LEVEL)

    def _channel(self, ctx: Ctx, skill: str) -> SessionChannel:
        return SessionChannel(
            ctx.session,
            ctx.request_id,
            skill=skill,
            min_level=self._min_level(ctx),
            request_timeout_s=self.config.client_request_timeout_s,
        )

    def _round_channel(self, ctx: Ctx, skill: str, prefilled: Mapping[str, Any]) -> RoundChannel:
        return RoundChannel(
            ctx.session,
            ctx.request_id,
            skill=skill,
            min_level=self._min_level(ctx),
            request_timeout_s=self.config.client_request_timeout_s,
            prefilled=prefilled,
            capabilities=ctx.session.check_client_capability,
        )

    async def _inline_or_blocking(
        self,
        run: Callable[[SessionChannel], T],
        inline: Callable[[SessionChannel], T] | None,
        channel: SessionChannel,
        slot: Slot,
        skill: str,
        key: str,
        waited_until: float,
    ) -> T:
        # The call runs in the slot taken for it (lent: the dispatcher takes no second one).
        if inline is not None:
            try:
                return slot.lend(inline, channel)
            except RunOnThread:
                pass
        # The guest cannot be interrupted from outside its thread, so a cancellation
        # (the client's ``notifications/cancelled``, or shutdown) marks the channel: the
        # sandbox stops the guest at its next epoch check once the channel says so (and
        # the guest may poll ``cancelled()`` itself); the call still ends before we return.
        return await self._workers.run(
            partial(slot.lend, run, channel),
            channel.cancel,
            key=key,
            skill=skill,
            wait_s=max(0.0, waited_until - time.monotonic()),
        )

    # -- resources ----------------------------------------------------------------

    def _resource_spec(self, uri: str) -> ResourceSpec | None:
        specs = self.dispatcher.resources()
        for spec in specs:
            if not spec.template and spec.uri == uri:
                return spec
        for spec in specs:
            if spec.template:
                try:
                    if UriTemplate.parse(spec.uri).match(uri) is not None:
                        return spec
                except InvalidUriTemplate:
                    continue
        return None

    async def _list_resources(
        self, ctx: Ctx, params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        return types.ListResourcesResult(
            resources=[
                types.Resource(
                    name=r.name, uri=r.uri, description=r.description, mime_type=r.mime_type
                )
                for r in self._view(ctx).resources()
                if not r.template
            ]
        )

    async def _list_templates(
        self, ctx: Ctx, params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(
            resource_templates=[
                types.ResourceTemplate(
                    name=r.name,
                    uri_template=r.uri,
                    description=r.description,
                    mime_type=r.mime_type,
                )
                for r in self._view(ctx).resources()
                if r.template
            ]
        )

    async def _read_resource(
        self, ctx: Ctx, params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult | types.InputRequiredResult:
        uri = str(params.uri)
        spec = self._resource_spec(uri)
        if spec is None:
            raise MCPError(RESOURCE_NOT_FOUND, f"Resource not found: {uri}", data={"uri": uri})

        caller = caller_of(ctx)

        def read(
            channel: SessionChannel,
        ) -> list[types.TextResourceContents | types.BlobResourceContents]:
            return resource_contents(
                uri,
                self.dispatcher.read_resource(uri, channel, caller=caller),
                spec.mime_type,
            )

        rounds: list[RoundChannel] = []
        try:
            skill = self.dispatcher.resource_skill(uri)
            label = f"resource:{spec.uri}"
            refusal = self._not_permitted(ctx, "resource", uri, skill, label, {"uri": uri})
            if refusal is not None:
                raise refused_error(refusal)
            if not _modern(ctx):
                contents = await self._guest_call(ctx, skill, label, read, arguments={"uri": uri})
            else:
                digest = self._digest(skill, uri, {"template": spec.uri})
                answer = await self._in_rounds(
                    ctx, params, uri, digest, skill, label, read, None, {"uri": uri}, rounds
                )
                if isinstance(answer, types.InputRequiredResult):
                    return answer
                contents = answer
        except RegistryError as exc:
            raise MCPError(RESOURCE_NOT_FOUND, str(exc), data={"uri": uri}) from exc
        except SkilldError as exc:
            self._missing(rounds)
            raise MCPError(types.INTERNAL_ERROR, error_text(exc)[2]) from exc
        return types.ReadResourceResult(contents=contents)

    async def _subscribe(self, ctx: Ctx, params: types.SubscribeRequestParams) -> types.EmptyResult:
        uri = str(params.uri)
        subscribed: set[str] = _session_state(ctx).setdefault(_SUBS_KEY, set())
        if len(uri) > MAX_SUBSCRIBED_URI:
            raise MCPError(
                types.INVALID_PARAMS,
                f"a URI longer than {MAX_SUBSCRIBED_URI} characters cannot be subscribed to",
                data={"limit": MAX_SUBSCRIBED_URI},
            )
        if uri not in subscribed and len(subscribed) >= MAX_SUBSCRIPTIONS:
            raise MCPError(
                types.INVALID_PARAMS,
                f"this session has {len(subscribed)} subscriptions, at most "
                f"{MAX_SUBSCRIPTIONS}: unsubscribe one first",
                data={"limit": MAX_SUBSCRIPTIONS, "scope": "session"},
            )
        spec = self._resource_spec(uri)
        if spec is None:
            raise MCPError(RESOURCE_NOT_FOUND, f"Resource not found: {uri}", data={"uri": uri})
        # Hearing of a resource's changes is reading it: the same rules decide.
        skill = self.dispatcher.resource_skill(uri)
        refusal = self._not_permitted(ctx, "resource", uri, skill, f"resource:{spec.uri}", {})
        if refusal is not None:
            raise refused_error(refusal)
        subscribed.add(uri)
        return types.EmptyResult()

    async def _unsubscribe(
        self, ctx: Ctx, params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        _session_state(ctx).setdefault(_SUBS_KEY, set()).discard(str(params.uri))
        return types.EmptyResult()

    # -- prompts --------------------------------------------------------------

    def _prompt_spec(self, name: str) -> PromptSpec | None:
        return next((p for p in self.dispatcher.prompts() if p.name == name), None)

    async def _list_prompts(
        self, ctx: Ctx, params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        prompts = []
        for spec in self._view(ctx).prompts():
            props: Mapping[str, Any] = spec.arguments_schema.get("properties", {})
            required = set(spec.arguments_schema.get("required", ()))
            prompts.append(
                types.Prompt(
                    name=spec.name,
                    description=spec.description,
                    arguments=[
                        types.PromptArgument(
                            name=arg,
                            description=schema.get("description"),
                            required=arg in required,
                        )
                        for arg, schema in props.items()
                    ],
                )
            )
        return types.ListPromptsResult(prompts=prompts)

    async def _get_prompt(
        self, ctx: Ctx, params: types.GetPromptRequestParams
    ) -> types.GetPromptResult | types.InputRequiredResult:
        spec = self._prompt_spec(params.name)
        if spec is None:
            raise MCPError(types.INVALID_PARAMS, f"Unknown prompt: {params.name}")
        arguments = dict(params.arguments or {})
        try:
            ArgumentValidator(spec.arguments_schema, where=f"prompt {spec.name}").check(arguments)
        except UsageError as exc:
            raise MCPError(types.INVALID_PARAMS, str(exc)) from exc

        def render(channel: SessionChannel) -> types.GetPromptResult:
            messages = self.dispatcher.get_prompt(
                spec.name, arguments, channel, caller=caller_of(ctx)
            )
            try:
                return types.GetPromptResult(
                    description=spec.description,
                    messages=[types.PromptMessage.model_validate(m) for m in messages],
                )
            except ValidationError as exc:
                raise GuestError(
                    "internal", f"prompt {spec.name} rendered malformed messages"
                ) from exc

        rounds: list[RoundChannel] = []
        try:
            skill = self.dispatcher.prompt_skill(spec.name)
            label = f"prompt:{spec.name}"
            refusal = self._not_permitted(ctx, "prompt", spec.name, skill, label, arguments)
            if refusal is not None:
                raise refused_error(refusal)
            if not _modern(ctx):
                return await self._guest_call(ctx, skill, label, render, arguments=arguments)
            digest = self._digest(skill, spec.name, {"args": spec.arguments_schema})
            return await self._in_rounds(
                ctx, params, spec.name, digest, skill, label, render, None, arguments, rounds
            )
        except RegistryError as exc:
            raise MCPError(types.INVALID_PARAMS, str(exc)) from exc
        except SkilldError as exc:
            self._missing(rounds)
            raise MCPError(types.INTERNAL_ERROR, error_text(exc)[2]) from exc

    async def _complete(
        self, ctx: Ctx, params: types.CompleteRequestParams
    ) -> types.CompleteResult:
        # Completion is answered from the schema alone: the choices an argument's
        # ``enum`` (or ``examples``) lists, filtered by the typed prefix.
        choices: list[str] = []
        if isinstance(params.ref, types.PromptReference):
            spec = self._prompt_spec(params.ref.name)
            # A prompt the caller may not list has no choices to show it.
            if spec is not None and spec in self._view(ctx).prompts():
                schema = spec.arguments_schema.get("properties", {}).get(params.argument.name, {})
                choices = [str(v) for v in schema.get("enum", schema.get("examples", []))]
        matches = [c for c in choices if c.startswith(params.argument.value)]
        return types.CompleteResult(
            completion=types.Completion(
                values=matches[:100], total=len(matches), has_more=len(matches) > 100
            )
        )

    # -- logging ----------------------------------------------------------------

    async def _set_level(self, ctx: Ctx, params: types.SetLevelRequestParams) -> types.EmptyResult:
        _session_state(ctx)[_LEVEL_KEY] = params.level
        return types.EmptyResult()
