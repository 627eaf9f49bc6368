"""Input-required rounds (MCP 2026-07-28): a guest's questions to the client, statelessly.

In the 2026-07-28 revision a server no longer sends its own requests to the client
mid-call. A guest's ``elicit`` or ``sample`` instead ends the client's request with
``resultType: "input_required"``, the question under a key, and a ``requestState``;
the client answers by retrying the same request with ``inputResponses`` and that
state, and the call goes on.

The call is **kept, not replayed**. Its guest stays parked on its worker thread,
blocked in the host function that asked, until the retry brings the answer (or the
call's deadline passes, when the host call fails with ``timeout`` and the call ends
and is audited as any other). Replaying the guest from the start with its earlier
answers would run every host call before the question again (an HTTP POST, a
``kv`` write, a native script) — and a host call's side effects must never run twice.

``requestState`` only names the parked call: ``{"c": call id, "n": node, "d": skill
digest, "r": round}``. The SDK's :class:`~mcp.server.request_state.RequestStateBoundary`
seals it (AES-256-GCM under a key only this node, or the cluster's nodes, hold) in an envelope
bound to the method, the tool and a digest of its arguments, with an expiry; a
tampered, expired or foreign state is refused with ``-32602`` before any handler
runs. Here the call id must be one this node holds and the tool and skill digest
must be the ones it was started with.

A retry that reaches another entry node of a cluster finds ``n`` naming the node
that holds the call: :class:`ParkedCalls` hands it to ``forward`` (set from a
:class:`RoundPeers`, the cluster's signed and sealed relay between entry nodes), which
takes it to that node and brings back its answer; without one it is refused, naming
the node. A forwarded retry is never forwarded again.

``r`` numbers the round a state was minted for: a retry brings answers to that round
only. A copy of a retry that was answered already (a client's resend, a retry
forwarded twice) answers nothing; it waits for what the call does next, as the first
did. The guest ran once and asked once, so no host call runs twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import queue
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import anyio.from_thread
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ValidationError

from skilld import telemetry
from skilld.errors import GuestError
from skilld.mcp._channel import KEY_META, SessionChannel, min_level_of, without_key
from skilld.types import Caller

T = TypeVar("T")
Ctx = ServerRequestContext[Any, Any]
# The requests whose guest may ask the client things in rounds.
Rounds = (
    types.CallToolRequestParams | types.GetPromptRequestParams | types.ReadResourceRequestParams
)


MISSING_REQUIRED_CLIENT_CAPABILITY = -32021

_ELICIT = "elicitation/create"
_SAMPLE = "sampling/createMessage"
_ROOTS = "roots/list"
_CAPABILITIES = {_ELICIT: "elicitation", _SAMPLE: "sampling", _ROOTS: "roots"}
_ANSWER_MODELS: dict[str, type[BaseModel]] = {
    _ELICIT: types.ElicitResult,
    _SAMPLE: types.CreateMessageResult,
    _ROOTS: types.ListRootsResult,
}


@dataclass(frozen=True)
class Question:
    """One question a parked guest waits on: its key and the request the client fulfils."""

    key: str
    method: str
    params: Mapping[str, Any]

    def request(self) -> dict[str, Any]:
        """The ``inputRequests`` entry."""
        return {"method": self.method, "params": dict(self.params)}


class _Abandoned:
    def __init__(self, code: str, message: str) -> None:
        self.code, self.message = code, message


class RoundChannel(SessionChannel):
    """A channel whose questions to the client become input-required rounds.

    Progress and logs ride the stream of the round the client is in now, and the
    capabilities asked for are the ones that round's request declared (:meth:`rebind`
    follows each retry). ``sample``, ``elicit``, ``roots`` and ``ask`` post their
    :class:`Question` s to the event loop and block the guest until :meth:`answer` has
    brought every response, or the call is cancelled or runs out of time. Answers the
    client sent before being asked (``prefilled``) are used at once.
    """

    def __init__(
        self,
        *args: Any,
        prefilled: Mapping[str, Any],
        capabilities: Callable[[types.ClientCapabilities], bool],
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._prefilled = dict(prefilled)
        self._can = capabilities
        self._replies: queue.SimpleQueue[dict[str, Any] | _Abandoned] = queue.SimpleQueue()
        self._numbers: dict[str, int] = {}
        # Touched on the event loop only: the questions of the round, the answers so far.
        self.pending: dict[str, Question] = {}
        self._got: dict[str, Any] = {}
        self.asked: Callable[[], None] = lambda: None
        self.missing: dict[str, Any] = {}
        self.round = 0  # how many rounds the guest asked so far (event loop only)

    # -- the event loop side ---------------------------------------------------

    def rebind(self, session: Any, request_id: types.RequestId | None, min_level: Any) -> None:
        """Follow the round now being answered: its stream, log level and capabilities."""
        self._session, self._request_id, self._min_level = session, request_id, min_level
        self._can = session.check_client_capability

    def answer(self, responses: Mapping[str, Any]) -> None:
        """Take the answers to the round's questions; the guest goes on once all are in.

        Keys the round did not ask are ignored; questions still unanswered stay pending
        (the next round asks them again).
        """
        for key in list(self.pending):
            if key in responses:
                self._got[key] = responses[key]
                del self.pending[key]
        if self._got and not self.pending:
            got, self._got = self._got, {}
            self._replies.put(got)

    def cancel(self, reason: str = "client") -> None:
        """Cancel the call; ``reason``: ``client``, ``shutdown``, or the words saying why."""
        super().cancel(reason)
        why = {"shutdown": "the server shut down", "client": "the client cancelled this call"}
        self._replies.put(_Abandoned("cancelled", why.get(reason, reason)))

    # -- the guest's side --------------------------------------------------------

    def abandon_requests(self) -> None:
        self._replies.put(_Abandoned("timeout", "the client did not answer in time"))

    def sample(self, params: Mapping[str, Any]) -> Mapping[str, Any]:
        """Ask for ``sampling/createMessage`` in a round.

        Raises:
            GuestError: ``unavailable`` when the client did not declare sampling;
                ``invalid-argument``, ``timeout``, ``cancelled``.
        """
        return self._one(_SAMPLE, params)

    def elicit(self, params: Mapping[str, Any]) -> Mapping[str, Any]:
        """Ask for ``elicitation/create`` in a round.

        Raises:
            GuestError: as for :meth:`sample`.
        """
        return self._one(_ELICIT, params)

    def roots(self) -> Mapping[str, Any]:
        """Ask for ``roots/list`` in a round.

        Raises:
            GuestError: as for :meth:`sample`.
        """
        return self._one(_ROOTS, {})

    def ask(self, requests: Mapping[str, tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
        """Ask several questions in one round (keys are the guest's).

        Raises:
            GuestError: as for :meth:`sample`, when any one cannot be asked.
        """
        return self._ask([self._question(m, p, key) for key, (m, p) in requests.items()])

    def _one(self, method: str, params: Mapping[str, Any]) -> Mapping[str, Any]:
        question = self._question(method, params, None)
        answer: Mapping[str, Any] = self._ask([question])[question.key]
        return answer

    def _question(self, method: str, params: Mapping[str, Any], key: str | None) -> Question:
        if self.cancelled():
            raise GuestError("cancelled", "the client cancelled this call")
        capability = _CAPABILITIES[method]
        if not self._can(types.ClientCapabilities.model_validate({capability: {}})):
            self.missing[capability] = {}
            raise GuestError("unavailable", f"the MCP client did not declare {capability}")
        meta = params.get("_meta")
        named = meta.get(KEY_META) if isinstance(meta, Mapping) else None
        key = key or (named if isinstance(named, str) and named else None)
        if key is None:  # the host numbers unnamed questions
            number = self._numbers[method] = self._numbers.get(method, 0) + 1
            key = f"{method.split('/')[0]}-{number}"
        body = without_key(params)
        self._check(method, body)
        return Question(key, method, body)

    def _ask(self, questions: list[Question]) -> dict[str, Any]:
        replies = {q.key: self._prefilled.pop(q.key) for q in questions if q.key in self._prefilled}
        left = [q for q in questions if q.key not in replies]
        if left:
            anyio.from_thread.run_sync(self._post, left, token=self._loop)
            got = self._replies.get()
            if isinstance(got, _Abandoned):
                raise GuestError(got.code, got.message)
            replies.update(got)
        answers: dict[str, Any] = {}
        for question in questions:
            try:
                model = _ANSWER_MODELS[question.method].model_validate(replies[question.key])
            except ValidationError as exc:
                raise GuestError("internal", f"the client's answer is malformed: {exc}") from exc
            answers[question.key] = model.model_dump(by_alias=True, mode="json", exclude_none=True)
        return answers

    def _check(self, method: str, body: Mapping[str, Any]) -> None:
        try:
            if method == _SAMPLE:
                types.CreateMessageRequestParams.model_validate(body)
            elif method == _ELICIT and body.get("mode") == "url":
                types.ElicitRequestURLParams.model_validate(body)
            elif method == _ELICIT:
                types.ElicitRequestFormParams.model_validate(body)
        except ValidationError as exc:
            raise GuestError("invalid-argument", f"bad {method} request: {exc}") from exc

    def _post(self, questions: list[Question]) -> None:
        self.round += 1
        self.pending = {q.key: q for q in questions}
        self._got = {}
        self.asked()


def round_channel(
    ctx: Ctx, skill: str, request_timeout_s: float, prefilled: Mapping[str, Any]
) -> RoundChannel:
    """The channel of a call the request ``ctx`` starts, whose questions go in rounds;
    ``prefilled``: the answers the request brought along."""
    return RoundChannel(
        ctx.session,
        ctx.request_id,
        skill=skill,
        min_level=min_level_of(ctx),
        request_timeout_s=request_timeout_s,
        prefilled=prefilled,
        capabilities=ctx.session.check_client_capability,
    )


def raise_missing(rounds: list[RoundChannel]) -> None:
    """Refuse a failed call that needed a client capability its request did not declare.

    Raises:
        MCPError: ``-32021`` naming the capability (``missing_capability``).
    """
    if rounds and rounds[0].missing:
        raise missing_capability(rounds[0].missing)


@dataclass
class ParkedCall(Generic[T]):
    """One call that asked the client something and waits for the retry."""

    id: str
    target: str
    digest: str
    channel: RoundChannel
    task: asyncio.Task[T]
    expires: float
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    # The span of the request that started it (telemetry.here): each retry's span links
    # to it.
    trace: Any = field(default_factory=telemetry.here)
    caller: str = ""  # its caller's Caller.key: only its retries continue the call
    capped: bool = True  # counted against the caller's rounds (a task's call is not)
    parked_at: float = 0.0  # when it last asked the client (monotonic); 0: never


def skill_digest(tool: str, skill: str, definition: Mapping[str, Any]) -> str:
    """What a round binds the skill to: its bundle digest, or its definition's."""
    text = json.dumps([tool, skill, definition], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


# (node, method, params, protocol version, the retry's verified caller) -> the answer there
Forward = Callable[[str, str, Mapping[str, Any], str, Caller], Awaitable[Any]]
"""The cluster's hook: ``forward(node, method, params, version, caller)`` sends a retry whose call
is parked on ``node`` there (params as received, ``requestState`` already verified and
opened, ``caller`` the entry node's verified caller, which the holding node checks against
the call's) and returns that node's result."""

Relayed = Callable[[Mapping[str, Any]], Coroutine[Any, Any, dict[str, Any]]]
"""What an entry node runs for a retry another one forwarded to it: ``{"method", "params",
"version"}`` in, ``{"result": ...}`` or ``{"error": {"code", "message", "data"}}`` out."""


class RoundPeers(Protocol):
    """The other entry nodes of a cluster, as the MCP layer sees them (``skilld.cluster``
    provides one; the two packages meet only in this shape)."""

    async def forward(self, node: str, request: Mapping[str, Any]) -> Mapping[str, Any]:
        """Send ``request`` (as :data:`Relayed` takes it) to ``node``; its answer.

        Raises:
            SkilldError: the node is not a member, or did not answer in time.
        """
        ...

    def serve(self, handler: Relayed, loop: asyncio.AbstractEventLoop) -> None:
        """Run ``handler`` on ``loop`` for each retry another entry node forwards here."""
        ...


class ParkedCalls:
    """The calls of this node that wait for an input-required retry."""

    def __init__(
        self, node: str, ttl_s: float, forward: Forward | None = None, max_per_caller: int = 4
    ) -> None:
        self.node = node
        self.ttl_s = ttl_s
        self.forward = forward
        # A parked call keeps its skill slot while the client thinks: one caller's
        # unanswered rounds must not take all of a skill's slots (issue #28). Clients may
        # abandon a round without a word, so past the cap the caller's oldest waiting
        # round ends (never a new call refused: that would lock out a client whose
        # abandoned rounds have not expired yet).
        self.max_per_caller = max_per_caller
        self._calls: dict[str, ParkedCall[Any]] = {}

    def __len__(self) -> int:
        return len(self._calls)

    def start(
        self,
        target: str,
        digest: str,
        channel: RoundChannel,
        run: Callable[[], Coroutine[Any, Any, T]],
        caller: str = "",
        capped: bool = True,
    ) -> ParkedCall[T]:
        """Run a call of ``caller`` (its ``Caller.key``) in the background, ready to park
        when its guest asks. ``capped``: counted against ``max_per_caller`` when it waits
        for the client (a task's call is not: the task caps bound it)."""
        call_id = secrets.token_urlsafe(18)
        task: asyncio.Task[T] = asyncio.get_running_loop().create_task(run())
        call: ParkedCall[T] = ParkedCall(
            call_id,
            target,
            digest,
            channel,
            task,
            time.monotonic() + self.ttl_s,
            caller=caller,
            capped=capped,
        )
        self._calls[call_id] = call
        channel.asked = call.changed.set

        def ended(task: asyncio.Task[T]) -> None:
            # A call whose client walked away ends unobserved (its failure is audited
            # below the seam): mark its outcome seen, so asyncio does not report it.
            if not task.cancelled():
                task.exception()
            call.changed.set()
            self._calls.pop(call_id, None)

        task.add_done_callback(ended)
        return call

    def elsewhere(self, state: str) -> str | None:
        """The node a (verified) ``requestState`` names when that is not this one and a
        ``forward`` hook can take the retry there; else None."""
        if self.forward is None:
            return None
        try:
            node = str(json.loads(state)["n"])
        except (ValueError, KeyError, TypeError):
            return None
        return node if node != self.node else None

    def resume(self, state: str, target: str, digest: str, caller: str = "") -> ParkedCall[Any]:
        """The parked call of ``caller`` a (verified) ``requestState`` names.

        Raises:
            MCPError: ``-32602`` when it names another node's call (and there is no
                forwarding), a call that is over, or another tool or skill build; another
                caller's call answers as one that is over (its state is no proof of whose).
        """
        try:
            claims = json.loads(state)
            call_id, node, bound = str(claims["c"]), str(claims["n"]), str(claims["d"])
        except (ValueError, KeyError, TypeError):
            raise _invalid("the requestState does not name a call") from None
        if node != self.node:
            raise _invalid(
                f"this round's call runs on node {node}; send the retry to the node that "
                "answered the previous round"
            )
        call = self._calls.get(call_id)
        if call is None or call.task.done() or call.caller != caller:
            raise _invalid("the call this requestState names is over (answered, expired or ended)")
        if call.target != target or call.digest != bound or bound != digest:
            raise _invalid("the requestState belongs to another tool or another build of it")
        if time.monotonic() > call.expires:
            call.channel.cancel()
            raise _invalid("the input round expired")
        telemetry.link(call.trace, "input-required round")
        return call

    @staticmethod
    def answer(call: ParkedCall[Any], state: str, responses: Mapping[str, Any]) -> None:
        """Answer ``call``'s questions with a retry's ``responses`` when its (verified)
        ``state`` was minted for the round the call is in: a copy of a retry answered
        already (a resend, a retry forwarded twice) answers nothing, not even a later
        question under the same key."""
        try:
            round_ = json.loads(state).get("r")
        except (ValueError, AttributeError):
            return
        if round_ == call.channel.round:
            call.channel.answer(responses)

    def state(self, call: ParkedCall[Any]) -> str:
        """The plaintext ``requestState`` for ``call`` (the SDK's boundary seals it)."""
        claims = {"c": call.id, "n": self.node, "d": call.digest, "r": call.channel.round}
        return json.dumps(claims, separators=(",", ":"))

    async def step(self, call: ParkedCall[T]) -> T | types.InputRequiredResult:
        """Wait until ``call`` finishes or asks the client; the result or the round.

        When the request is cancelled while the guest runs (not while it waits for an
        answer), the call is cancelled and waited for, as any call is.
        """
        while True:
            call.changed.clear()
            if call.task.done():
                return call.task.result()
            questions = call.channel.pending
            if questions:
                self._park(call)
                requests = {key: q.request() for key, q in questions.items()}
                return types.InputRequiredResult(
                    input_requests=requests,  # type: ignore[arg-type]
                    request_state=self.state(call),
                )
            try:
                await call.changed.wait()
            except asyncio.CancelledError:
                if not call.channel.pending and not call.task.done():
                    call.channel.cancel()
                    with contextlib.suppress(BaseException):
                        await asyncio.shield(call.task)
                raise

    def _park(self, call: ParkedCall[Any]) -> None:
        """``call`` now waits for its client: past ``max_per_caller`` waiting rounds of
        its caller, end the oldest others (each audited as cancelled; its retry then
        finds a call that is over)."""
        call.parked_at = time.monotonic()
        if not call.capped:
            return
        waiting = sorted(
            (
                c
                for c in self._calls.values()
                if c is not call
                and c.capped
                and c.caller == call.caller
                and c.channel.pending
                and not c.task.done()
            ),
            key=lambda c: c.parked_at,
        )
        for old in waiting[: max(0, len(waiting) + 1 - self.max_per_caller)]:
            old.channel.cancel(
                f"the round was abandoned: its client opened more than {self.max_per_caller} "
                "(max_rounds_per_caller), and the oldest ends"
            )

    def cancel_all(self, reason: str = "shutdown") -> None:
        """Cancel every call still running here (shutdown, after the grace)."""
        for call in list(self._calls.values()):
            call.channel.cancel(reason)

    def cancel_waiting(self) -> int:
        """Cancel the calls waiting on a client's answer (shutdown: no retry will come in
        time); each ends as cancelled and is audited. Returns how many."""
        waiting = [c for c in self._calls.values() if c.channel.pending and not c.task.done()]
        for call in waiting:
            call.channel.cancel()
        return len(waiting)


def _invalid(message: str) -> MCPError:
    return MCPError(types.INVALID_PARAMS, message, data={"reason": "invalid_request_state"})


def missing_capability(missing: Mapping[str, Any]) -> MCPError:
    """``-32021``: the call needs client capabilities the request did not declare."""
    names = ", ".join(sorted(missing))
    return MCPError(
        MISSING_REQUIRED_CLIENT_CAPABILITY,
        f"this call needs the client capabilities it did not declare: {names}",
        data={"requiredCapabilities": dict(missing)},
    )


def plain(responses: Mapping[str, Any] | None) -> dict[str, Any]:
    """``inputResponses`` as JSON values (the SDK parsed them into its result models)."""
    return {
        key: value.model_dump(by_alias=True, mode="json", exclude_none=True)
        if isinstance(value, BaseModel)
        else value
        for key, value in (responses or {}).items()
    }


async def forward_elsewhere(
    parked: ParkedCalls, ctx: Ctx, state: str, caller: Caller, forwarded: bool
) -> Any | None:
    """The answer of the entry node holding the call ``state`` names, when another node
    holds it and this request was not forwarded here already; None when this node holds it
    (or should: :meth:`ParkedCalls.resume` then says what is wrong)."""
    node = parked.elsewhere(state)
    if node is None or parked.forward is None or forwarded:
        return None
    # Another entry node holds the call: the cluster routes the retry there.
    return await parked.forward(
        node, ctx.method, dict(ctx.params or {}), ctx.protocol_version, caller
    )


def resume(
    parked: ParkedCalls,
    ctx: Ctx,
    params: Rounds,
    target: str,
    digest: str,
    caller: Caller,
    min_level: Callable[[], types.LoggingLevel | None],
) -> ParkedCall[Any]:
    """The parked call a retry names, rebound to this request and given its answers.

    Raises:
        MCPError: ``-32602`` for a ``requestState`` naming no call of ``target`` here.
    """
    assert params.request_state is not None
    call = parked.resume(params.request_state, target, digest, caller.key)
    call.channel.rebind(ctx.session, ctx.request_id, min_level)
    parked.answer(call, params.request_state, plain(params.input_responses))
    return call


async def in_rounds(
    parked: ParkedCalls,
    ctx: Ctx,
    params: Rounds,
    target: str,
    digest: str,
    *,
    caller: Caller,
    forwarded: bool,
    min_level: Callable[[], types.LoggingLevel | None],
    new_channel: Callable[[Mapping[str, Any]], RoundChannel],
    start: Callable[[RoundChannel], Coroutine[Any, Any, T]],
    rounds: list[RoundChannel],
) -> T | types.InputRequiredResult:
    """Run (or resume) a 2026-07-28 request whose guest may ask the client things.

    A first request starts the call in the background (``start`` on a channel from
    ``new_channel``, given the request's answers); a retry (its ``requestState`` already
    verified by the SDK's boundary) answers the question its call waits on. Either way
    the request ends with the call's result or with the next ``input_required`` round.
    The round's channel is appended to ``rounds``.

    Raises:
        MCPError: ``-32602`` for a ``requestState`` naming no call of this tool here.
        SkilldError: as ``start``.
    """
    if params.request_state is not None:
        answer = await forward_elsewhere(parked, ctx, params.request_state, caller, forwarded)
        if answer is not None:
            forwarded_answer: T | types.InputRequiredResult = answer
            return forwarded_answer
        call = resume(parked, ctx, params, target, digest, caller, min_level)
        rounds.append(call.channel)
    else:
        channel = new_channel(plain(params.input_responses))
        rounds.append(channel)
        call = parked.start(target, digest, channel, lambda: start(channel), caller.key)
    return await parked.step(call)
