"""Resources and prompts: the MCP requests besides tools that reach a guest.

``resources/list``, ``resources/templates/list``, ``resources/read``,
``resources/subscribe`` and ``unsubscribe``, ``prompts/list``, ``prompts/get`` and
``completion/complete``. Each list is the caller's view (the bundle's caller rules);
a read or a render is refused early by the same rules, then answered as a tool call is
(``_requests``: at once, or in input-required rounds), its guest run by the ring.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import anyio
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.uri_template import InvalidUriTemplate, UriTemplate

from skilld.errors import RegistryError, SkilldError, UsageError
from skilld.mcp._after import after_response
from skilld.mcp._caller import caller_of, not_permitted, refused_error
from skilld.mcp._channel import session_state
from skilld.mcp._content import error_text, read_resource, render_prompt
from skilld.mcp._requests import Requests
from skilld.mcp._ring import Ring
from skilld.mcp._rounds import RoundChannel, raise_missing
from skilld.mcp._schema import ArgumentValidator
from skilld.registry import Dispatcher
from skilld.types import PromptSpec, ResourceSpec

T = TypeVar("T")
Ctx = ServerRequestContext[Any, Any]

RESOURCE_NOT_FOUND = -32002  # the MCP spec's code for an unknown resource URI
SUBS_KEY = "skilld.subscriptions"
# A session's subscriptions live in memory as long as it does: bounded, so that one
# caller's sessions (max_sessions_per_caller of them) hold at most a few MiB of URIs.
MAX_SUBSCRIPTIONS = 128
MAX_SUBSCRIBED_URI = 4096


@dataclass(eq=False)
class _Turns:
    semaphore: anyio.Semaphore
    users: int = 0


class CallerReads:
    """At most ``size`` of one caller's resource reads at once, each from its start until
    its HTTP response is written; the rest wait.

    A read's answer exists whole in memory, several times over while it is encoded and
    serialized. A kept output of 64 MiB took the server about 185 MiB a read, and the
    loop serializes slower than threads read: one caller's 40 reads at once grew the
    server by 7 GiB. So reads take turns per caller (``Caller.key``) before any of them
    reads a byte, and a turn is held until the answer has left (``_after``), not merely
    until it exists. A waiting read holds no thread and no slot, and never makes another
    caller's read wait.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._turns: dict[str, _Turns] = {}

    @contextlib.asynccontextmanager
    async def turn(self, key: str) -> AsyncIterator[None]:
        """Wait for one of ``key``'s turns; it ends with the request's response (or with
        the block where no HTTP response follows it)."""
        turns = self._turns.get(key)
        if turns is None:
            turns = self._turns[key] = _Turns(anyio.Semaphore(self.size))
        turns.users += 1

        def leave() -> None:
            turns.users -= 1
            if not turns.users:
                del self._turns[key]  # a caller with no read keeps nothing here

        def release() -> None:
            turns.semaphore.release()
            leave()

        try:
            await turns.semaphore.acquire()
        except BaseException:
            leave()  # cancelled while waiting: no turn taken
            raise
        try:
            yield
        finally:
            if not after_response(release):
                release()


class Surfaces:
    """The resource and prompt handlers of one server.

    Args:
        dispatcher: whose resources and prompts are served.
        ring: what counts and audits a refusal.
        requests: runs a read or a render (at once, or in rounds).
        reads_per_caller: how many of one caller's reads run at once (:class:`CallerReads`).
    """

    def __init__(
        self, dispatcher: Dispatcher, ring: Ring, requests: Requests, reads_per_caller: int = 2
    ) -> None:
        self.dispatcher = dispatcher
        self._ring = ring
        self._requests = requests
        self._reads = CallerReads(reads_per_caller)

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

    async def list_resources(
        self, ctx: Ctx, params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        """``resources/list``: the fixed resources the caller may read."""
        return types.ListResourcesResult(
            resources=[
                types.Resource(
                    name=r.name, uri=r.uri, description=r.description, mime_type=r.mime_type
                )
                for r in self.dispatcher.view(caller_of(ctx)).resources()
                if not r.template
            ]
        )

    async def list_templates(
        self, ctx: Ctx, params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        """``resources/templates/list``: the resource templates the caller may read."""
        return types.ListResourceTemplatesResult(
            resource_templates=[
                types.ResourceTemplate(
                    name=r.name,
                    uri_template=r.uri,
                    description=r.description,
                    mime_type=r.mime_type,
                )
                for r in self.dispatcher.view(caller_of(ctx)).resources()
                if r.template
            ]
        )

    async def read_resource(
        self, ctx: Ctx, params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult | types.InputRequiredResult:
        """``resources/read``: the resource's contents, read by its skill's guest.

        Raises:
            MCPError: ``-32002`` for an unknown URI; invalid params when the caller
                rules refuse it; an internal error when the read failed.
        """
        uri = str(params.uri)
        spec = self._resource_spec(uri)
        if spec is None:
            raise MCPError(RESOURCE_NOT_FOUND, f"Resource not found: {uri}", data={"uri": uri})
        caller = caller_of(ctx)
        rounds: list[RoundChannel] = []
        try:
            skill = self.dispatcher.resource_skill(uri)
            label = f"resource:{spec.uri}"
            arguments = {"uri": uri}
            refusal = not_permitted(
                self._ring, ctx, caller, "resource", uri, skill, label, arguments
            )
            if refusal is not None:
                raise refused_error(refusal)
            read = partial(read_resource, self.dispatcher, uri, spec.mime_type, caller)
            async with self._reads.turn(caller.key):
                answer = await self._requests.answer(
                    ctx,
                    params,
                    uri,
                    {"template": spec.uri},
                    caller=caller,
                    skill=skill,
                    label=label,
                    run=read,
                    arguments=arguments,
                    rounds=rounds,
                )
        except RegistryError as exc:
            raise MCPError(RESOURCE_NOT_FOUND, str(exc), data={"uri": uri}) from exc
        except SkilldError as exc:
            raise_missing(rounds)
            raise MCPError(types.INTERNAL_ERROR, error_text(exc)[2]) from exc
        if isinstance(answer, types.InputRequiredResult):
            return answer
        return types.ReadResourceResult(contents=answer)

    async def subscribe(self, ctx: Ctx, params: types.SubscribeRequestParams) -> types.EmptyResult:
        """``resources/subscribe``: hear of the resource's changes on this session.

        Raises:
            MCPError: ``-32002`` for an unknown URI; invalid params when the caller
                rules refuse reading it, the URI is too long or the session holds its
                most subscriptions already.
        """
        uri = str(params.uri)
        subscribed: set[str] = session_state(ctx).setdefault(SUBS_KEY, set())
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
        label = f"resource:{spec.uri}"
        refusal = not_permitted(self._ring, ctx, caller_of(ctx), "resource", uri, skill, label, {})
        if refusal is not None:
            raise refused_error(refusal)
        subscribed.add(uri)
        return types.EmptyResult()

    async def unsubscribe(
        self, ctx: Ctx, params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        """``resources/unsubscribe``."""
        session_state(ctx).setdefault(SUBS_KEY, set()).discard(str(params.uri))
        return types.EmptyResult()

    # -- prompts --------------------------------------------------------------

    def _prompt_spec(self, name: str) -> PromptSpec | None:
        return next((p for p in self.dispatcher.prompts() if p.name == name), None)

    async def list_prompts(
        self, ctx: Ctx, params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        """``prompts/list``: the prompts the caller may get, their arguments from the schema."""
        prompts = []
        for spec in self.dispatcher.view(caller_of(ctx)).prompts():
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

    async def get_prompt(
        self, ctx: Ctx, params: types.GetPromptRequestParams
    ) -> types.GetPromptResult | types.InputRequiredResult:
        """``prompts/get``: the prompt rendered by its skill's guest.

        Raises:
            MCPError: invalid params for an unknown prompt, arguments its schema
                refuses, or a refusal of the caller rules; an internal error when the
                render failed.
        """
        spec = self._prompt_spec(params.name)
        if spec is None:
            raise MCPError(types.INVALID_PARAMS, f"Unknown prompt: {params.name}")
        arguments = dict(params.arguments or {})
        try:
            ArgumentValidator(spec.arguments_schema, where=f"prompt {spec.name}").check(arguments)
        except UsageError as exc:
            raise MCPError(types.INVALID_PARAMS, str(exc)) from exc
        caller = caller_of(ctx)
        rounds: list[RoundChannel] = []
        try:
            skill = self.dispatcher.prompt_skill(spec.name)
            label = f"prompt:{spec.name}"
            refusal = not_permitted(
                self._ring, ctx, caller, "prompt", spec.name, skill, label, arguments
            )
            if refusal is not None:
                raise refused_error(refusal)
            render = partial(render_prompt, self.dispatcher, spec, arguments, caller)
            return await self._requests.answer(
                ctx,
                params,
                spec.name,
                {"args": spec.arguments_schema},
                caller=caller,
                skill=skill,
                label=label,
                run=render,
                arguments=arguments,
                rounds=rounds,
            )
        except RegistryError as exc:
            raise MCPError(types.INVALID_PARAMS, str(exc)) from exc
        except SkilldError as exc:
            raise_missing(rounds)
            raise MCPError(types.INTERNAL_ERROR, error_text(exc)[2]) from exc

    async def complete(self, ctx: Ctx, params: types.CompleteRequestParams) -> types.CompleteResult:
        """``completion/complete``: a prompt argument's choices for the typed prefix."""
        # Completion is answered from the schema alone: the choices an argument's
        # ``enum`` (or ``examples``) lists, filtered by the typed prefix.
        choices: list[str] = []
        if isinstance(params.ref, types.PromptReference):
            spec = self._prompt_spec(params.ref.name)
            # A prompt the caller may not list has no choices to show it.
            if spec is not None and spec in self.dispatcher.view(caller_of(ctx)).prompts():
                schema = spec.arguments_schema.get("properties", {}).get(params.argument.name, {})
                choices = [str(v) for v in schema.get("enum", schema.get("examples", []))]
        matches = [c for c in choices if c.startswith(params.argument.value)]
        return types.CompleteResult(
            completion=types.Completion(
                values=matches[:100], total=len(matches), has_more=len(matches) > 100
            )
        )
