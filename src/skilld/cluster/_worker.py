"""The worker side: this node's skills served to the cluster as a ``nats.micro`` service.

One endpoint per local skill, on this node's subject for its package
(``skilld.call.NODE.SKILL.DIGEST``, the skill id mapped by :func:`skill_token`), so
``nats micro ls/info/stats`` show skilld's services; the entry node picks the replica.
Nothing of a request is used before its envelope verifies (``_envelope``): sealed by a
key trusted for the sending node, addressed to this node and to this boot of it, for
this endpoint's skill, its stamp never seen before. Methods the policy hides are never
run for another node. The audit record names the verified sender. A call
runs through this node's registry (its policy, its slots, its audit record) on a
worker thread, taken only once the call holds its slot: a call waiting for its
caller's share of a skill's slots holds no thread, and the pool has a thread for
every local slot, so no caller's waiting calls keep another caller's call from a
thread. What the guest sends back to its client (progress, logs, sampling,
elicitation) is relayed to the entry node on the request's reply subject, and a
cancellation from the entry node stops the guest.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from nats.aio.msg import Msg
from nats.micro import add_service
from nats.micro.request import Request
from nats.micro.service import Service

from skilld import __version__, telemetry
from skilld.call import WAIT_SLICE_S, Slot
from skilld.cluster._announce import LocalSkill
from skilld.cluster._envelope import Opened, Opener, Sealer, claimed
from skilld.cluster._link import NatsLink
from skilld.cluster._wire import (
    CANCEL_PREFIX,
    call_subject,
    dumps,
    error_to_json,
    output_to_json,
    skill_token,
    split,
)
from skilld.errors import (
    CallCancelled,
    ClusterError,
    DeadlineExceeded,
    GuestError,
    RegistryError,
    RunOnThread,
    SkilldError,
    UsageError,
)
from skilld.registry import Call, Registry, RemoteInvoker, SkillEntry
from skilld.types import Caller

log = logging.getLogger("skilld.cluster")

# A relayed sampling or elicitation request may wait for a person; the guest's deadline
# (checked as well) is what bounds it.
_ASK_TIMEOUT_S = 300.0
_DEADLINE_GRACE_S = 0.1
# How long a routed call may first run on the link's loop (as the MCP layer's --inline-ms).
_INLINE_S = 0.001


class RelayChannel:
    """The entry node's client, as a guest on this node sees it (a ``ClientChannel``).

    Everything it sends is sealed for the entry node and this call; the answers to
    sampling and elicitation must be sealed by the entry node for this call.
    """

    def __init__(
        self,
        link: NatsLink,
        sealer: Sealer,
        opener: Opener,
        call: tuple[str, str, str, bytes | None],
        cancelled: threading.Event,
        deadline: float,
        entry_gone: Callable[[], bool] = lambda: False,
        refused: Callable[[str, str], None] = lambda node, reason: None,
    ):
        self._link = link
        self._sealer = sealer
        self._opener = opener
        # call id, entry node, reply subject, the entry's payload key
        self._call_id, self._entry, self._reply, self._box = call
        self._cancelled = cancelled
        self._deadline = deadline
        self._entry_gone = entry_gone
        self._refused = refused

    def _send(self, event: str, body: bytes) -> None:
        meta = {"ev": event, "call": self._call_id, "to": self._entry}
        headers, out = self._sealer.seal_to(self._box, meta, body)
        self._link.publish(self._reply, out, headers)

    def progress(self, progress: float, total: float | None, message: str | None) -> None:
        """Relay a progress notification."""
        self._send("progress", dumps({"progress": progress, "total": total, "message": message}))

    def log(self, level: str, data: Any) -> None:
        """Relay a log message."""
        self._send("log", dumps({"level": level, "data": data}))

    def sample(self, params: Mapping[str, Any]) -> Mapping[str, Any]:
        """Ask the entry node's client for a sampling result.

        Raises:
            GuestError: the client refused or could not answer (its code), or no
                answer came before the call's deadline (``unavailable``).
        """
        return self._ask("sample", params)

    def elicit(self, params: Mapping[str, Any]) -> Mapping[str, Any]:
        """Ask the entry node's client to elicit input.

        Raises:
            GuestError: as for :meth:`sample`.
        """
        return self._ask("elicit", params)

    def roots(self) -> Mapping[str, Any]:
        """Ask the entry node's client for its roots (``roots/list``).

        Raises:
            GuestError: as for :meth:`sample`.
        """
        return self._ask("roots", {})

    def ask(self, requests: Mapping[str, tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
        """Ask the entry node's client several questions at once (one input-required round
        for a 2026-07-28 client there; the policy checked each here, before).

        Raises:
            GuestError: as for :meth:`sample`.
        """
        wanted = {key: [method, dict(params)] for key, (method, params) in requests.items()}
        return dict(self._ask("ask", {"requests": wanted}))

    def cancelled(self) -> bool:
        """The entry node cancelled the call, left the cluster, or its deadline passed."""
        return self._cancelled.is_set() or time.monotonic() >= self._deadline or self._entry_gone()

    def _ask(self, kind: str, params: Mapping[str, Any]) -> Mapping[str, Any]:
        wait = min(_ASK_TIMEOUT_S, max(0.0, self._deadline - time.monotonic()))
        meta = {"ev": kind, "call": self._call_id, "to": self._entry}
        headers, body = self._sealer.seal_to(self._box, meta, dumps(dict(params)))
        try:
            msg = self._link.run(
                self._link.nc.request(self._reply, body, timeout=wait, headers=headers),
                timeout=wait + 1,
            )
        except Exception as exc:  # ClusterError, nats-py timeouts, no responders
            raise GuestError(
                "unavailable", f"the entry node did not answer the {kind} request: {exc!r}"
            ) from exc
        try:
            opened = self._opener.open(msg.headers, msg.data, self._entry, call=self._call_id)
            doc = json.loads(opened.data)
        except (ClusterError, ValueError) as exc:
            self._refused(claimed(msg.headers), f"{kind} answer dropped: {exc}")
            raise GuestError(
                "unavailable", f"the answer to the {kind} request did not verify: {exc}"
            ) from exc
        if "error" in doc:
            err = doc["error"]
            raise GuestError(str(err.get("code", "internal")), str(err.get("message", "")))
        result: Mapping[str, Any] = doc["ok"]
        return result


@dataclass(frozen=True, slots=True)
class _Call:
    """One routed call this node is running."""

    call_id: str
    reply: str
    entry: str  # the verified sender
    skill_id: str
    meta: dict[str, Any]
    data: bytes  # the arguments, decrypted
    box: bytes | None  # the entry's payload key: what goes back is sealed to it
    timeout_s: float
    cancelled: threading.Event
    channel: RelayChannel


class SkillServer:
    """Serves this node's skills to the cluster; see the module docstring.

    ``refused(claimed node, reason)`` is told of every message dropped (audit).
    """

    def __init__(
        self,
        link: NatsLink,
        registry: Registry,
        sealer: Sealer,
        opener: Opener,
        skills: list[LocalSkill],
        threads: int,
        alive: Callable[[str], bool] = lambda node: True,
        refused: Callable[[str, str], None] = lambda node, reason: None,
    ):
        self._alive = alive
        self._link = link
        self._registry = registry
        self._sealer = sealer
        self._opener = opener
        self._node = sealer.node
        self._skills = skills
        self._entries = {s.entry.spec.id: s.entry for s in skills}
        self.clustered_kv = False  # set by the cluster: skills' state is in JetStream KV
        self._refused = refused
        # A thread for every slot of the local skills (a call takes one only once it
        # holds its slot, _threaded): a call never waits for a thread behind others.
        slots = sum(s.entry.limits.max_concurrency for s in skills)
        self._pool = ThreadPoolExecutor(
            max(threads, slots), thread_name_prefix=f"skilld-remote-{self._node}"
        )
        self._service: Service | None = None
        self._running: set[asyncio.Task[None]] = set()
        # call id -> (the node that started it, its cancel flag)
        self._cancels: dict[str, tuple[str, threading.Event]] = {}
        self.served = 0

    async def start(self) -> None:
        """Add the micro service and one endpoint per local skill (none without skills)."""
        if not self._skills:
            return  # an entry-only node: nothing to serve, nothing to list in `nats micro`
        # One subscription for every cancellation (they are rare), not one per call.
        await self._link.nc.subscribe(f"{CANCEL_PREFIX}.*", cb=self._on_cancel)
        self._service = await add_service(
            self._link.nc,
            name="skilld",
            version=__version__,
            description="skilld skills served to the cluster",
            metadata={"node": self._node},
        )
        for skill in self._skills:
            sid = skill.entry.spec.id
            subject = call_subject(self._node, sid, skill.digest)
            await self._service.add_endpoint(
                name=skill_token(sid),
                subject=subject,
                queue_group=subject,
                handler=self._handler(sid),
                metadata={
                    "skill": sid,
                    "version": skill.entry.spec.version,
                    "digest": skill.digest,
                    "node": self._node,
                    "kv": self._kv_mode(skill),
                },
            )

    def _kv_mode(self, skill: LocalSkill) -> str:
        """Where this replica keeps the skill's key-value state: none, local or cluster."""
        if skill.entry.kv is None:
            return "none"
        return "cluster" if self.clustered_kv else "local"

    async def serving(self, wait_s: float = 0.5) -> dict[str, list[tuple[str, str]]]:
        """Who serves what already: skill id -> [(node, kv mode)], from ``nats micro``
        discovery (``$SRV.INFO.skilld``), the answers that come within ``wait_s``."""
        nc = self._link.nc
        inbox = nc.new_inbox()
        found: dict[str, list[tuple[str, str]]] = {}

        async def answer(msg: Msg) -> None:
            try:
                info = json.loads(msg.data)
                for ep in info.get("endpoints") or ():
                    meta = ep.get("metadata") or {}
                    node = str(meta.get("node", ""))
                    if node and node != self._node:
                        found.setdefault(str(meta.get("skill")), []).append(
                            (node, str(meta.get("kv", "local")))
                        )
            except (ValueError, AttributeError, TypeError):
                log.info("cluster: an unreadable service description on %s", msg.subject)

        sub = await nc.subscribe(inbox, cb=answer)
        try:
            await nc.publish("$SRV.INFO.skilld", b"", reply=inbox)
            await asyncio.sleep(wait_s)  # discovery has no end marker: answers come by then
        finally:
            await sub.unsubscribe()
        return found

    def withdraw(self, skill_id: str) -> None:
        """Do not serve ``skill_id`` (before :meth:`start`)."""
        self._skills = [s for s in self._skills if s.entry.spec.id != skill_id]
        self._entries.pop(skill_id, None)

    async def stop(self) -> None:
        """Stop taking calls; calls running finish (bounded by their deadlines)."""
        if self._service is not None:
            await self._service.stop()
        if self._running:
            await asyncio.wait(set(self._running), timeout=30)
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _on_cancel(self, msg: Msg) -> None:
        call_id = msg.subject.rsplit(".", 1)[-1]
        running = self._cancels.get(call_id)
        if running is None:
            return  # not ours (every holder hears every cancellation)
        try:
            self._opener.open(msg.headers, msg.data, running[0], call=call_id, ev="cancel")
        except ClusterError as exc:
            self._refused(claimed(msg.headers), f"cancellation refused: {exc.message}")
            return
        running[1].set()

    def _handler(self, skill_id: str) -> Callable[[Request], Any]:
        async def handle(request: Request) -> None:
            await self._handle(request._msg, skill_id)

        return handle

    async def _handle(self, msg: Msg, skill_id: str) -> None:
        call = self._begin(msg, skill_id)
        if call is None:
            return
        try:
            # A backend that runs no guest code answers here, on the loop, sparing a task
            # and two thread hand-offs; guest code gives up before it runs (RunOnThread).
            payload = self._payload(call, lambda: self._run_local(call, _INLINE_S))
        except RunOnThread:
            # The micro endpoint awaits its handler before the next message: a call that
            # needs a thread runs in a task of its own, so one skill's calls run side by side.
            task = asyncio.get_running_loop().create_task(self._threaded(call))
            self._running.add(task)
            task.add_done_callback(self._running.discard)
            return
        await self._finish(call, payload)

    def _verify(self, msg: Msg, skill_id: str) -> Opened | None:
        """The verified call, or None (refused and audited; a stale boot is answered)."""
        try:
            opened = self._opener.open(
                msg.headers, msg.data, boot=self._sealer.boot, ev="call", skill=skill_id
            )
        except ClusterError as exc:
            self._refused(claimed(msg.headers), f"routed call refused: {exc.message}")
            return None
        meta = opened.meta
        if opened.stale:
            # Made for an earlier life of this node (or before the entry heard of this
            # one): never run. The entry sends it again for this boot; a replay goes
            # to an inbox that waits for nothing any more.
            self._refused(
                opened.sender,
                f"routed call {meta.get('call')} refused: made for boot {meta.get('boot')} of "
                f"node {self._node}, which is now at boot {self._sealer.boot}",
            )
            # It names the message it got: only its sender's own call is sent again.
            back = {
                "ev": "restarted",
                "call": meta.get("call"),
                "to": opened.sender,
                "of": opened.digest,
            }
            headers, out = self._sealer.seal_to(opened.box, back, b"")
            self._link.publish(msg.reply, out, headers)
            return None
        return opened

    def _begin(self, msg: Msg, skill_id: str) -> _Call | None:
        if not msg.reply:
            return None
        opened = self._verify(msg, skill_id)
        if opened is None:
            return None
        meta = opened.meta
        call_id = str(meta.get("call", ""))
        timeout_s = _int(meta.get("timeout_ms"), 10_000) / 1000
        # The guest's own (policy) deadline fires first when the two are the same.
        deadline = time.monotonic() + timeout_s + _DEADLINE_GRACE_S
        cancelled = threading.Event()
        entry = opened.sender
        self._cancels[call_id] = (entry, cancelled)
        # An entry node that dies mid-call has nobody left to answer: stop its guests
        # (only for members: anything else has no membership to lose).
        entry_gone = (lambda: not self._alive(entry)) if self._alive(entry) else (lambda: False)
        self.served += 1
        channel = RelayChannel(
            self._link,
            self._sealer,
            self._opener,
            (call_id, entry, msg.reply, opened.box),
            cancelled,
            deadline,
            entry_gone,
            self._refused,
        )
        return _Call(
            call_id,
            msg.reply,
            entry,
            skill_id,
            meta,
            opened.data,
            opened.box,
            timeout_s,
            cancelled,
            channel,
        )

    async def _threaded(self, call: _Call) -> None:
        slot = await self._slot(call)
        if isinstance(slot, bytes):  # refused while it waited: its error
            await self._finish(call, slot)
            return
        try:
            payload = await asyncio.get_running_loop().run_in_executor(
                self._pool,
                self._payload,
                call,
                lambda: self._run_local(call) if slot is None else slot.lend(self._run_local, call),
            )
        finally:
            if slot is not None:
                slot.release()
        await self._finish(call, payload)

    async def _slot(self, call: _Call) -> Slot | bytes | None:
        """A slot of the call's skill for its caller, waited for on the loop before the call
        takes a thread (as the MCP layer does): a call waiting for its caller's share holds
        no thread. The error reply (audited as a refusal) when none came in time or the
        call was cancelled meanwhile; None when the message names no caller or skill this
        node reads (``_run_local`` says what is wrong, on the thread).
        """
        meta = call.meta
        kind, name = str(meta.get("kind", "call")), str(meta.get("name", ""))
        try:
            chain = _chain(meta)
            caller = _routed_caller(meta.get("caller"), call.entry, chain)
            gate = self._registry.gate(call.skill_id)
        except (UsageError, RegistryError):
            return None
        if not chain and not self._may(call.skill_id, caller, kind, name):
            # Refused by this node's caller rules: no slot, no wait. ``_run_local`` asks
            # the same rules again and answers (and audits) not-permitted at once; waiting
            # first took a slot from callers the rules let in, and answered a refused
            # caller "busy" (telling it the skill's load) when the skill was full.
            return None
        # A routed invoke never waits (as a nested call does not: see Registry._run).
        nested = kind == "call" and _int(meta.get("depth"), 0) > 0
        wait = 0.0 if nested else min(call.timeout_s, _gate_wall_s(self._entries, call.skill_id))
        waiting = asyncio.ensure_future(gate.take_async(wait, caller.key))
        try:
            while not waiting.done():
                await asyncio.wait({waiting}, timeout=WAIT_SLICE_S)
                if not waiting.done() and call.channel.cancelled():
                    waiting.cancel()  # a slot handed over meanwhile goes back (take_async)
                    with contextlib.suppress(asyncio.CancelledError):
                        await waiting
        except BaseException:
            # This task itself was cancelled (shutdown): stop waiting, and give back a slot
            # that came just before (a pending wait gives its own back: take_async).
            waiting.cancel()
            if waiting.done() and not waiting.cancelled() and waiting.exception() is None:
                waiting.result().release()
            raise
        if not waiting.cancelled() and waiting.exception() is None:
            return waiting.result()
        error: SkilldError
        if waiting.cancelled():
            error = CallCancelled(
                f"{call.skill_id}: the call was cancelled while it waited for a slot"
            )
        else:
            exc = waiting.exception()
            if exc is not None and not isinstance(exc, SkilldError):
                raise exc  # a bug: not the gate's refusal
            assert isinstance(exc, SkilldError)
            error = exc
        label, arguments = _audited(kind, name, call.data)
        with contextlib.suppress(SkilldError):  # the refusal is answered even if unaudited
            self._registry.refused(
                call.skill_id, label, arguments, error.outcome, str(error), caller=caller
            )

        def refuse() -> Any:
            raise error

        return self._payload(call, refuse)

    def _may(self, skill: str, caller: Caller, kind: str, name: str) -> bool:
        """Whether this node's caller rules let ``caller`` have the tool (``kind``
        ``call``; a method no tool exposes passes, as in ``Registry.call_method``), the
        resource or the prompt ``name`` of ``skill``. Raises nothing: what is unknown
        passes here and is answered where the call runs."""
        view = self._registry.view(caller)
        try:
            if kind == "call":
                tool = self._registry.tool_of(skill, name)
                if tool is not None:
                    view.permit("tool", tool, skill)
            elif kind == "resource":
                view.permit("resource", name, skill)
            elif kind == "prompt":
                view.permit("prompt", name, skill)
        except GuestError:
            return False
        except (UsageError, RegistryError):
            return True
        return True

    def _payload(self, call: _Call, run: Callable[[], Any]) -> bytes:
        """The reply to a routed call: its value, or its error (RunOnThread passes through)."""
        try:
            with telemetry.joined(call.meta):  # the entry node's trace, from the envelope
                return dumps({"ok": run()})
        except CallCancelled as exc:
            # Stopped by the entry's deadline rather than by a cancellation: say so.
            err: SkilldError = exc
            if not call.cancelled.is_set():
                err = DeadlineExceeded(
                    f"skill ran past the deadline of the entry node {call.entry} "
                    f"({call.timeout_s:.3g}s)",
                    location=exc.location,
                )
            return dumps({"error": error_to_json(err, self._node)})
        except SkilldError as exc:
            return dumps({"error": error_to_json(exc, self._node)})
        except RunOnThread:
            raise
        except Exception as exc:  # a host bug costs this call, and the call is told
            log.exception("cluster: a routed call failed on %s", self._node)
            return dumps({"error": error_to_json(GuestError("internal", repr(exc)), self._node)})

    async def _finish(self, call: _Call, payload: bytes) -> None:
        self._cancels.pop(call.call_id, None)
        nc = self._link.nc
        parts = split(payload, nc.max_payload)
        for n, part in enumerate(parts):
            event = "done" if n == len(parts) - 1 else "part"
            meta = {"ev": event, "call": call.call_id, "to": call.entry, "n": n}
            headers, out = self._sealer.seal_to(call.box, meta, part)
            await nc.publish(call.reply, out, headers=headers)

    def _run_local(self, call: _Call, inline_s: float | None = None) -> Any:
        meta = call.meta
        kind, name = str(meta.get("kind", "call")), str(meta.get("name", ""))
        data = call.data
        try:
            args = json.loads(data) if data else {}
        except ValueError as exc:
            raise UsageError(f"the routed arguments are not JSON: {exc}") from exc
        if kind == "call":
            if not isinstance(args, dict):
                raise UsageError("the routed arguments must be a JSON object")
            chain = _chain(meta)
            self._exposed(call, name)
            # The audit names the verified sender and, sealed with it, the entry node's
            # caller (a skill of that node for a routed invoke).
            caller = _routed_caller(meta.get("caller"), call.entry, chain)
            # This node's own caller rules decide the call (Registry.call_method asks
            # them for every call a client or another node makes: issue 28 item 6).
            # A skill on another node invoked this one: that node checked its own grant
            # (remote_calls); consent is this node's, from its own tables, for the
            # verified sender.
            out = self._registry.call_method(
                Call(
                    call.skill_id,
                    name,
                    args,
                    call.channel,
                    caller=caller,
                    depth=_int(meta.get("depth"), 0),
                    chain=chain,
                    inline_s=inline_s,
                    remote=RemoteInvoker(call.entry, chain[-1]) if chain else None,
                )
            )
            return output_to_json(out)
        if inline_s is not None:
            raise RunOnThread  # resource reads and prompts always run on a thread
        # As the entry node's verified caller, like a call: a kept output is its owner's
        # alone, and the audit names who read it (read as the node's local user, alice
        # could not read her own output back, and a local user's was anyone's).
        caller = _routed_caller(meta.get("caller"), call.entry)
        if kind in ("resource", "prompt"):
            self._permit(call, caller, kind, name, args if isinstance(args, dict) else {})
        if kind == "resource":
            outputs = self._registry.read_resource(name, call.channel, caller=caller)
            return [output_to_json(o) for o in outputs]
        if kind == "prompt":
            return [
                dict(m) for m in self._registry.get_prompt(name, args, call.channel, caller=caller)
            ]
        raise UsageError(f"unknown routed request kind {kind!r}")

    def _permit(
        self, call: _Call, caller: Caller, kind: str, name: str, args: Mapping[str, Any]
    ) -> None:
        """Refuse a routed resource read or prompt this node's own caller rules do not let
        the entry node's caller have (issue 28 item 6; a routed call is asked in
        ``Registry.call_method``): the entry node asked its rules, but its bundle may let more
        callers through than this one does (an entry-only gateway open to every
        authenticated caller, say). Audited here, under the caller's name.

        Raises:
            GuestError: ``not-permitted``, naming this node's deciding rule.
        """
        sid = call.skill_id
        # A resource's URI may be a kept output's: never written to the audit as is.
        label = "read-resource" if kind == "resource" else "get-prompt"
        arguments: Mapping[str, Any] = {"uri": name} if kind == "resource" else args
        view = self._registry.view(caller)
        try:
            if kind == "resource":
                view.permit("resource", name, sid)
            else:
                view.permit("prompt", name, sid)
        except GuestError as exc:
            # Outcome and text as the MCP layer audits its own refusals (its code).
            self._registry.refused(sid, label, arguments, exc.code, str(exc), caller=caller)
            raise

    def _exposed(self, call: _Call, method: str) -> None:
        """Refuse a method this node's policy does not expose (``mcp.hidden``).

        Raises:
            GuestError: ``not-found``, as for a method the skill does not have.
        """
        entry = self._entries.get(call.skill_id)
        if entry is None or method in entry.exposure.hidden:
            self._refused(
                call.entry,
                f"routed call {call.call_id} refused: method {method!r} of skill "
                f"{call.skill_id!r} is hidden on node {self._node}",
            )
            raise GuestError("not-found", f"skill '{call.skill_id}' has no method '{method}'")


def _chain(meta: Mapping[str, Any]) -> tuple[str, ...]:
    """The chain of skills of a routed invoke (outermost first; empty for a client's call).

    Raises:
        UsageError: it is not a list.
    """
    raw = meta.get("chain") or []
    if not isinstance(raw, list):
        raise UsageError("the routed caller chain must be a list")
    return tuple(str(c) for c in raw)


def _gate_wall_s(entries: Mapping[str, SkillEntry], skill_id: str) -> float:
    """How long a routed call of ``skill_id`` may wait for a slot: its wall time (as
    ``Registry._run`` waits for a call made here)."""
    entry = entries.get(skill_id)
    return 0.0 if entry is None else entry.limits.timeout_ms / 1000


def _audited(kind: str, name: str, data: bytes) -> tuple[str, Mapping[str, Any]]:
    """What the audit names a refused routed request by, and its arguments (hashed there):
    a call's method and arguments; a resource read's URI (it may be a kept output's,
    never written as is); a prompt's name and arguments."""
    try:
        args = json.loads(data) if data else {}
    except ValueError:
        args = {}
    args = args if isinstance(args, dict) else {}
    if kind == "resource":
        return "read-resource", {"uri": name}
    if kind == "prompt":
        return "get-prompt", args
    return name, args


def _int(value: object, default: int) -> int:
    try:
        return max(0, int(str(value))) if value is not None else default
    except ValueError:
        return default


def _routed_caller(carried: Any, entry: str, chain: tuple[str, ...] = ()) -> Caller:
    """The caller of a routed call: the one sealed in its message, as arriving from ``entry``.

    A message without one (from an older node) is the calling skill's of that node, or the
    node's own.

    Raises:
        UsageError: the carried caller is malformed.
    """
    if carried is None:
        return Caller("skill", chain[-1]).routed_from(entry) if chain else Caller("node", entry)
    try:
        return Caller.from_dict(carried).routed_from(entry)
    except ValueError as exc:
        raise UsageError(f"the routed caller is malformed: {exc}") from exc
