"""The worker side: this node's skills served to the cluster as a ``nats.micro`` service.

One endpoint per local skill, on the subject of its package (``skilld.call.SKILL.DIGEST``)
in a queue group of the same name, so NATS spreads calls over the replicas holding
the same package, and ``nats micro ls/info/stats`` show skilld's services. A call
runs through this node's registry (its policy, its slots, its audit record) on a
worker thread; what the guest sends back to its client (progress, logs, sampling,
elicitation) is relayed to the entry node on the request's reply subject, and a
cancellation from the entry node stops the guest.
"""

from __future__ import annotations

import asyncio
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

from skilld import __version__
from skilld.cluster._announce import LocalSkill
from skilld.cluster._link import NatsLink
from skilld.cluster._wire import (
    CANCEL_PREFIX,
    H_CALL,
    H_CALLER,
    H_CHAIN,
    H_DEPTH,
    H_ENTRY,
    H_EVENT,
    H_KIND,
    H_NAME,
    H_NODE,
    H_TIMEOUT,
    call_subject,
    dumps,
    error_to_json,
    output_to_json,
    split,
)
from skilld.errors import (
    CallCancelled,
    DeadlineExceeded,
    GuestError,
    RunOnThread,
    SkilldError,
    UsageError,
)
from skilld.registry import Registry

log = logging.getLogger("skilld.cluster")

# A relayed sampling or elicitation request may wait for a person; the guest's deadline
# (checked as well) is what bounds it.
_ASK_TIMEOUT_S = 300.0
_DEADLINE_GRACE_S = 0.1
# How long a routed call may first run on the link's loop (as the MCP layer's --inline-ms).
_INLINE_S = 0.001


class RelayChannel:
    """The entry node's client, as a guest on this node sees it (a ``ClientChannel``)."""

    def __init__(
        self,
        link: NatsLink,
        reply: str,
        cancelled: threading.Event,
        deadline: float,
        entry_gone: Callable[[], bool] = lambda: False,
    ):
        self._link = link
        self._reply = reply
        self._cancelled = cancelled
        self._deadline = deadline
        self._entry_gone = entry_gone

    def progress(self, progress: float, total: float | None, message: str | None) -> None:
        """Relay a progress notification."""
        body = dumps({"progress": progress, "total": total, "message": message})
        self._link.publish(self._reply, body, {H_EVENT: "progress"})

    def log(self, level: str, data: Any) -> None:
        """Relay a log message."""
        self._link.publish(self._reply, dumps({"level": level, "data": data}), {H_EVENT: "log"})

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

    def cancelled(self) -> bool:
        """The entry node cancelled the call, left the cluster, or its deadline passed."""
        return self._cancelled.is_set() or time.monotonic() >= self._deadline or self._entry_gone()

    def _ask(self, kind: str, params: Mapping[str, Any]) -> Mapping[str, Any]:
        wait = min(_ASK_TIMEOUT_S, max(0.0, self._deadline - time.monotonic()))
        try:
            msg = self._link.run(
                self._link.nc.request(
                    self._reply, dumps(dict(params)), timeout=wait, headers={H_EVENT: kind}
                ),
                timeout=wait + 1,
            )
            doc = json.loads(msg.data)
        except Exception as exc:  # ClusterError, bad JSON, nats-py timeouts, no responders
            raise GuestError(
                "unavailable", f"the entry node did not answer the {kind} request: {exc!r}"
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
    entry: str
    timeout_s: float
    cancelled: threading.Event
    channel: RelayChannel


class SkillServer:
    """Serves this node's skills to the cluster; see the module docstring."""

    def __init__(
        self,
        link: NatsLink,
        registry: Registry,
        node: str,
        skills: list[LocalSkill],
        threads: int,
        alive: Callable[[str], bool] = lambda node: True,
    ):
        self._alive = alive
        self._link = link
        self._registry = registry
        self._node = node
        self._skills = skills
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix=f"skilld-remote-{node}")
        self._service: Service | None = None
        self._running: set[asyncio.Task[None]] = set()
        self._cancels: dict[str, threading.Event] = {}
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
            subject = call_subject(skill.entry.spec.id, skill.digest)
            await self._service.add_endpoint(
                name=skill.entry.spec.id,
                subject=subject,
                queue_group=subject,
                handler=self._handle,
                metadata={
                    "skill": skill.entry.spec.id,
                    "version": skill.entry.spec.version,
                    "digest": skill.digest,
                    "node": self._node,
                },
            )

    async def stop(self) -> None:
        """Stop taking calls; calls running finish (bounded by their deadlines)."""
        if self._service is not None:
            await self._service.stop()
        if self._running:
            await asyncio.wait(set(self._running), timeout=30)
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _on_cancel(self, msg: Msg) -> None:
        event = self._cancels.get(msg.subject.rsplit(".", 1)[-1])
        if event is not None:
            event.set()

    async def _handle(self, request: Request) -> None:
        msg: Msg = request._msg
        call = self._begin(msg)
        if call is None:
            return
        try:
            # A quick guest answers here, on the loop, sparing a task and two thread
            # hand-offs; one that needs longer or blocks gives up unseen (RunOnThread).
            payload = self._payload(call, lambda: self._run_local(msg, call.channel, _INLINE_S))
        except RunOnThread:
            # The micro endpoint awaits its handler before the next message: a call that
            # needs a thread runs in a task of its own, so one skill's calls run side by side.
            task = asyncio.get_running_loop().create_task(self._threaded(msg, call))
            self._running.add(task)
            task.add_done_callback(self._running.discard)
            return
        await self._finish(call, payload)

    def _begin(self, msg: Msg) -> _Call | None:
        headers = msg.headers or {}
        if not msg.reply:
            return None
        call_id = headers.get(H_CALL, "")
        timeout_s = _int(headers.get(H_TIMEOUT), 10_000) / 1000
        # The guest's own (policy) deadline fires first when the two are the same.
        deadline = time.monotonic() + timeout_s + _DEADLINE_GRACE_S
        cancelled = threading.Event()
        if call_id:
            self._cancels[call_id] = cancelled
        entry = headers.get(H_ENTRY, "")
        # An entry node that dies mid-call has nobody left to answer: stop its guests
        # (only for members: anything else has no membership to lose).
        entry_gone = (lambda: not self._alive(entry)) if self._alive(entry) else (lambda: False)
        self.served += 1
        return _Call(
            call_id,
            msg.reply,
            entry,
            timeout_s,
            cancelled,
            RelayChannel(self._link, msg.reply, cancelled, deadline, entry_gone),
        )

    async def _threaded(self, msg: Msg, call: _Call) -> None:
        # The entry node learns who runs a call that takes a while (to fail it at once
        # should this node leave); a quick one answers before that matters.
        await self._link.nc.publish(
            call.reply, b"", headers={H_EVENT: "started", H_NODE: self._node}
        )
        payload = await asyncio.get_running_loop().run_in_executor(
            self._pool, self._payload, call, lambda: self._run_local(msg, call.channel)
        )
        await self._finish(call, payload)

    def _payload(self, call: _Call, run: Callable[[], Any]) -> bytes:
        """The reply to a routed call: its value, or its error (RunOnThread passes through)."""
        try:
            return dumps({"ok": run()})
        except CallCancelled as exc:
            # Stopped by the entry's deadline rather than by a cancellation: say so.
            err: SkilldError = exc
            if not call.cancelled.is_set():
                err = DeadlineExceeded(
                    f"skill ran past the deadline of the entry node {call.entry or '?'} "
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
        for part in parts[:-1]:
            await nc.publish(call.reply, part, headers={H_EVENT: "part"})
        await nc.publish(call.reply, parts[-1], headers={H_EVENT: "done", H_NODE: self._node})

    def _run_local(self, msg: Msg, channel: RelayChannel, inline_s: float | None = None) -> Any:
        headers: Mapping[str, str] = msg.headers or {}
        data = msg.data
        skill_id = msg.subject.split(".")[2]
        kind, name = headers.get(H_KIND, "call"), headers.get(H_NAME, "")
        caller = f"node:{headers.get(H_ENTRY, '?')}/{headers.get(H_CALLER, '?')}"
        try:
            args = json.loads(data) if data else {}
        except ValueError as exc:
            raise UsageError(f"the routed arguments are not JSON: {exc}") from exc
        if kind == "call":
            if not isinstance(args, dict):
                raise UsageError("the routed arguments must be a JSON object")
            chain = tuple(c for c in headers.get(H_CHAIN, "").split(",") if c)
            # A skill on another node invoked this one: that node checked its own grant
            # (remote_calls); consent is this node's, from its own tables.
            remote_caller = (headers.get(H_ENTRY, "?"), chain[-1]) if chain else None
            out = self._registry.call_method(
                skill_id,
                name,
                args,
                channel,
                caller=caller,
                depth=_int(headers.get(H_DEPTH), 0),
                chain=chain,
                inline_s=inline_s,
                remote_caller=remote_caller,
            )
            return output_to_json(out)
        if inline_s is not None:
            raise RunOnThread  # resource reads and prompts always run on a thread
        if kind == "resource":
            return [output_to_json(o) for o in self._registry.read_resource(name, channel)]
        if kind == "prompt":
            return [dict(m) for m in self._registry.get_prompt(name, args, channel)]
        raise UsageError(f"unknown routed request kind {kind!r}")


def _int(text: str | None, default: int) -> int:
    try:
        return max(0, int(text)) if text is not None else default
    except ValueError:
        return default
