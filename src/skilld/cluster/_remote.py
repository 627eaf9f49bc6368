"""The entry side: a skill held by other nodes, as a registry backend.

:class:`RemoteSkill` is a :class:`~skilld.registry.SkillBackend`: the entry node's
registry takes a slot, builds the context and audits the call as for any skill;
the backend sends the call to the skill's subject (a queue group of the replicas)
and waits on this worker thread for the stream the holder sends back, relaying
progress, logs, sampling and elicitation to the client and cancellation to the
holder. A holder that dies mid-call costs a clear ``[unavailable]`` error when it
leaves the membership or, at the latest, a moment after the call's deadline.
"""

from __future__ import annotations

import json
import queue
import secrets
import time
from collections.abc import Callable
from typing import Any

from nats.aio.msg import Msg

from skilld.cluster._link import NatsLink
from skilld.cluster._wire import (
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
    cancel_subject,
    dumps,
    error_from_json,
    output_from_json,
)
from skilld.errors import GuestError, SkilldError
from skilld.registry import CallContext
from skilld.types import CallOutput

# How long past the deadline the entry waits for the holder's own deadline error.
_GRACE_S = 0.5
# How often a waiting call looks at the client's cancellation and the holder's liveness.
_POLL_S = 0.05


class _Waiting:
    """One call in flight: the holder that took it, and what it sent back."""

    __slots__ = ("holder", "replies")

    def __init__(self) -> None:
        self.holder: str | None = None
        self.replies: queue.SimpleQueue[Msg] = queue.SimpleQueue()


class Router:
    """Sends routed calls and sorts the replies that come back to this node."""

    def __init__(self, link: NatsLink, node: str, alive: Callable[[str], bool]):
        self._link = link
        self._node = node
        self._alive = alive
        self._calls: dict[str, _Waiting] = {}
        self._prefix = f"_INBOX.skilld.{node}.{secrets.token_hex(6)}"

    async def start(self) -> None:
        """Subscribe to this node's reply subjects."""
        await self._link.nc.subscribe(f"{self._prefix}.*", cb=self._on_reply)

    async def _on_reply(self, msg: Msg) -> None:
        waiting = self._calls.get(msg.subject.rsplit(".", 1)[-1])
        if waiting is None:
            return
        headers = msg.headers or {}
        if headers.get(H_EVENT) == "started":
            # Noted here: waking the waiting thread for it would cost a thread switch.
            waiting.holder = headers.get(H_NODE)
        else:
            waiting.replies.put(msg)

    def call(
        self, skill_id: str, subject: str, kind: str, name: str, body: bytes, ctx: CallContext
    ) -> Any:
        """Route one request and wait for its outcome; returns the holder's ``ok`` value.

        Raises:
            RunOnThread: an inline attempt (remote calls always run on a thread).
            GuestError: ``unavailable`` when no node holds the skill, its holder left,
                or no answer came by the deadline; the holder's typed error otherwise.
            GuestFault: the holder's deadline, cancellation, trap or memory fault.
        """
        ctx.thread_only()
        if ctx.deadline is None:
            ctx.deadline = time.monotonic() + ctx.limits.timeout_ms / 1000
        deadline = ctx.deadline
        call_id = secrets.token_hex(12)
        inbox = f"{self._prefix}.{call_id}"
        waiting = _Waiting()
        replies = waiting.replies
        self._calls[call_id] = waiting
        headers = {
            H_CALL: call_id,
            H_KIND: kind,
            H_NAME: name,
            H_TIMEOUT: str(max(1, int(ctx.remaining() * 1000))),
            H_CALLER: ctx.chain[-1] if ctx.chain else "mcp",
            H_ENTRY: self._node,
            H_DEPTH: str(ctx.depth),
            H_CHAIN: ",".join(ctx.chain),
        }
        parts: list[bytes] = []
        cancel_sent = False
        try:
            self._link.publish(subject, body, headers, reply=inbox)
            while True:
                now = time.monotonic()
                if now >= deadline + _GRACE_S:
                    raise GuestError(
                        "unavailable",
                        f"node {waiting.holder or '(none yet)'} gave no answer for skill "
                        f"'{skill_id}' "
                        f"within the call's deadline",
                        location=skill_id,
                    )
                if not cancel_sent and ctx.channel.cancelled():
                    self._link.publish(cancel_subject(call_id), b"")
                    cancel_sent = True
                holder = waiting.holder
                if holder is not None and not self._alive(holder):
                    raise GuestError(
                        "unavailable",
                        f"node {holder}, which ran this call of skill '{skill_id}', left the "
                        "cluster before it answered",
                        location=skill_id,
                    )
                try:
                    msg = replies.get(timeout=min(_POLL_S, deadline + _GRACE_S - now))
                except queue.Empty:
                    continue
                h = msg.headers or {}
                event = h.get(H_EVENT)
                if h.get("Status") == "503":
                    raise GuestError(
                        "unavailable",
                        f"no node of the cluster serves skill '{skill_id}' right now",
                        location=skill_id,
                    )
                if event == "progress":
                    doc = json.loads(msg.data)
                    ctx.channel.progress(doc["progress"], doc.get("total"), doc.get("message"))
                elif event == "log":
                    doc = json.loads(msg.data)
                    ctx.channel.log(str(doc["level"]), doc.get("data"))
                elif event in ("sample", "elicit") and msg.reply:
                    self._link.publish(msg.reply, self._answer(event, msg.data, ctx))
                elif event == "part":
                    parts.append(msg.data)
                elif event == "done":
                    parts.append(msg.data)
                    doc = json.loads(b"".join(parts))
                    if "error" in doc:
                        raise error_from_json(doc["error"])
                    return doc["ok"]
        finally:
            del self._calls[call_id]

    @staticmethod
    def _answer(kind: str, data: bytes, ctx: CallContext) -> bytes:
        try:
            params = json.loads(data)
            ask = ctx.channel.sample if kind == "sample" else ctx.channel.elicit
            return dumps({"ok": dict(ask(params))})
        except GuestError as exc:
            return dumps({"error": {"code": exc.code, "message": exc.message}})
        except (SkilldError, ValueError) as exc:
            return dumps({"error": {"code": "internal", "message": str(exc)}})


class RemoteSkill:
    """A skill held by other nodes (``holders``), as a registry backend."""

    def __init__(self, router: Router, skill_id: str, subject: str, digest: str):
        self._router = router
        self.skill_id = skill_id
        self.subject = subject
        self.digest = digest
        self.holders: set[str] = set()

    def call(self, method: str, args_json: str, ctx: CallContext) -> CallOutput:
        """Run ``method`` on a holder.

        Raises:
            RunOnThread, GuestError, GuestFault: as for :meth:`Router.call`.
        """
        doc = self._router.call(
            self.skill_id, self.subject, "call", method, args_json.encode(), ctx
        )
        return output_from_json(doc)

    def read_resource(self, uri: str, ctx: CallContext) -> list[CallOutput]:
        """Read ``uri`` on a holder.

        Raises:
            RunOnThread, GuestError, GuestFault: as for :meth:`Router.call`.
        """
        docs = self._router.call(self.skill_id, self.subject, "resource", uri, b"", ctx)
        return [output_from_json(d) for d in docs]

    def get_prompt(self, name: str, args_json: str, ctx: CallContext) -> list[dict[str, Any]]:
        """Render the prompt ``name`` on a holder.

        Raises:
            RunOnThread, GuestError, GuestFault: as for :meth:`Router.call`.
        """
        docs = self._router.call(
            self.skill_id, self.subject, "prompt", name, args_json.encode(), ctx
        )
        return [dict(d) for d in docs]
