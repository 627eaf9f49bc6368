"""The entry side: a skill held by other nodes, as a registry backend.

:class:`RemoteSkill` is a :class:`~skilld.registry.SkillBackend`: the entry node's
registry takes a slot, builds the context and audits the call as for any skill;
the backend picks a holder (round robin), sends it the call in a sealed envelope
(``skilld.cluster._envelope``) on that node's subject for the skill, and waits on
this worker thread for the stream the holder sends back, relaying progress, logs,
sampling and elicitation to the client and cancellation to the holder.

Only events sealed by the node the call went to, for this call, are used: anything
else (a queue-group impostor's answer) is dropped and audited, and the call is sent
again (the holder refuses a copy it saw already, by its stamp). A holder that dies
mid-call costs a clear ``[unavailable]`` error when it leaves the membership or, at
the latest, a moment after the call's deadline.
"""

from __future__ import annotations

import itertools
import json
import queue
import secrets
import time
from collections.abc import Callable
from typing import Any

from nats.aio.msg import Msg

from skilld import telemetry
from skilld.cluster._envelope import Opened, Opener, Sealer, claimed, digest
from skilld.cluster._link import NatsLink
from skilld.cluster._wire import (
    call_subject,
    cancel_subject,
    dumps,
    error_from_json,
    output_from_json,
)
from skilld.errors import ClusterError, GuestError, SkilldError
from skilld.registry import CallContext
from skilld.types import CallOutput

# How long past the deadline the entry waits for the holder's own deadline error.
_GRACE_S = 0.5
# How often a waiting call looks at the client's cancellation and the holder's liveness.
_POLL_S = 0.05
# A call is sent again at most this often: after a sealed "restarted" (the holder never
# ran it) or an answer that does not verify (an impostor in the holder's queue group may
# have taken the request, half the time; the holder drops a copy it already saw, by its
# stamp). Ten tries leave an impostor one call in 2048 to swallow, and bound what its
# forged answers can make the entry send.
_RESENDS = 10


# What a holder's guest may ask the entry node's client, relayed on the call's reply subject.
_QUESTIONS = ("sample", "elicit", "roots", "ask")

class Router:
    """Sends routed calls to the replica it picks and verifies what comes back.

    Args:
        link: the node's NATS connection.
        sealer: signs this node's calls, cancellations and answers.
        opener: verifies the holder's events; only those sealed by the node the call
            was sent to, for this call, are used.
        alive: whether a node is a member now.
        boot: a member's boot as its announcements show it (calls name it).
        refused: told ``(claimed node, reason)`` of each message dropped (audit).
        box: a member's payload key as its announcement shows it (calls are sealed to it).
    """

    def __init__(
        self,
        link: NatsLink,
        sealer: Sealer,
        opener: Opener,
        alive: Callable[[str], bool],
        boot: Callable[[str], int | None],
        refused: Callable[[str, str], None] = lambda node, reason: None,
        box: Callable[[str], bytes | None] = lambda node: None,
    ):
        self._link = link
        self._box = box
        self._node = sealer.node
        self._sealer = sealer
        self._opener = opener
        self._alive = alive
        self._boot = boot
        self._refused = refused
        self._calls: dict[str, queue.SimpleQueue[Msg]] = {}
        # Under the link's inbox prefix (_INBOX.NODE), the one this node may read.
        self._prefix = f"_INBOX.{self._node}.skilld{secrets.token_hex(6)}"

    async def start(self) -> None:
        """Subscribe to this node's reply subjects."""
        await self._link.nc.subscribe(f"{self._prefix}.*", cb=self._on_reply)

    async def _on_reply(self, msg: Msg) -> None:
        replies = self._calls.get(msg.subject.rsplit(".", 1)[-1])
        if replies is not None:
            replies.put(msg)  # verified on the call's own thread, off the loop

    def call(
        self,
        skill: RemoteSkill,
        kind: str,
        name: str,
        body: bytes,
        ctx: CallContext,
    ) -> Any:
        """Route one request to a holder and wait for its outcome (its ``ok`` value).

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
        sid = skill.skill_id
        target = skill.pick(self._alive)
        if target is None:
            raise GuestError(
                "unavailable",
                f"no node of the cluster serves skill '{sid}' right now",
                location=sid,
            )
        telemetry.annotate({"skilld.node.target": target})
        call_id = secrets.token_hex(12)
        inbox = f"{self._prefix}.{call_id}"
        subject = call_subject(target, sid, skill.digest)
        replies: queue.SimpleQueue[Msg] = queue.SimpleQueue()
        self._calls[call_id] = replies
        meta = {
            "ev": "call",
            "call": call_id,
            "to": target,
            "boot": self._boot(target) or 0,
            "skill": sid,
            "kind": kind,
            "name": name,
            "timeout_ms": max(1, int(ctx.remaining() * 1000)),
            "depth": ctx.depth,
            "chain": list(ctx.chain),
            # Sealed with the rest: the worker names the entry node's verified caller.
            "caller": ctx.caller.as_dict(),
        }
        headers, sent = self._sealer.seal_to(self._box(target), meta, body)
        parts: list[bytes] = []
        cancel_sent = False
        resends = 0
        copies = False  # the same request was sent more than once (after a forged answer)
        try:
            self._link.publish(subject, sent, headers, reply=inbox)
            while True:
                now = time.monotonic()
                if now >= deadline + _GRACE_S:
                    raise GuestError(
                        "unavailable",
                        f"node {target} gave no answer for skill '{sid}' within the call's "
                        "deadline",
                        location=sid,
                    )
                if not cancel_sent and ctx.channel.cancelled():
                    cancel = {"ev": "cancel", "call": call_id, "to": target}
                    cancel_headers, sealed = self._sealer.seal_to(self._box(target), cancel, b"")
                    self._link.publish(cancel_subject(call_id), sealed, cancel_headers)
                    cancel_sent = True
                if not self._alive(target):
                    raise GuestError(
                        "unavailable",
                        f"node {target}, which ran this call of skill '{sid}', left the "
                        "cluster before it answered",
                        location=sid,
                    )
                try:
                    msg = replies.get(timeout=min(_POLL_S, deadline + _GRACE_S - now))
                except queue.Empty:
                    continue
                if (msg.headers or {}).get("Status") == "503":
                    raise GuestError(
                        "unavailable",
                        f"node {target} does not serve skill '{sid}' right now",
                        location=sid,
                    )
                opened = self._open(msg, call_id, target)
                if opened is None:
                    if resends < _RESENDS and not parts:
                        resends += 1
                        copies = True
                        self._link.publish(subject, sent, headers, reply=inbox)
                    continue
                event = opened.meta.get("ev")
                if event == "restarted" and opened.meta.get("of") != digest(headers, sent):
                    # Not about this call as this node sent it (a copy changed on the bus).
                    self._refused(
                        target,
                        f"a 'restarted' answer for call {call_id} ignored: "
                        "it names another message than the call sent",
                    )
                elif event == "restarted" and resends < _RESENDS and not parts and not copies:
                    # Signed by the target: its new life never ran this copy, and there
                    # was only this copy (a queue group delivers it once): the old life
                    # never ran it either. After a resend of the same bytes that is no
                    # longer certain, so the call then ends [unavailable] instead.
                    resends += 1
                    # Its new life has a new payload key too: the one this reply names.
                    meta = {**meta, "boot": opened.boot}
                    headers, sent = self._sealer.seal_to(opened.box, meta, body)
                    self._link.publish(subject, sent, headers, reply=inbox)
                elif event == "restarted":
                    raise GuestError(
                        "unavailable",
                        f"node {target} restarted while this call of skill '{sid}' was on its "
                        "way, and it was not sent again",
                        location=sid,
                    )
                elif event == "progress":
                    doc = json.loads(opened.data)
                    ctx.channel.progress(doc["progress"], doc.get("total"), doc.get("message"))
                elif event == "log":
                    doc = json.loads(opened.data)
                    ctx.channel.log(str(doc["level"]), doc.get("data"))
                elif event in _QUESTIONS and msg.reply:
                    answer = self._answer(event, opened.data, ctx)
                    back = {"ev": "answer", "call": call_id, "to": target}
                    out_headers, out = self._sealer.seal_to(opened.box, back, answer)
                    self._link.publish(msg.reply, out, out_headers)
                elif event == "part" and opened.meta.get("n") == len(parts):
                    parts.append(opened.data)
                elif event == "done" and opened.meta.get("n") == len(parts):
                    parts.append(opened.data)
                    doc = json.loads(b"".join(parts))
                    ctx.audit["holder"] = target  # verified: sealed by the node routed to
                    if "error" in doc:
                        raise error_from_json(doc["error"])
                    return doc["ok"]
        finally:
            del self._calls[call_id]

    def _open(self, msg: Msg, call_id: str, target: str) -> Opened | None:
        """The verified event, or None (dropped and audited) unless ``target`` sent it."""
        try:
            opened = self._opener.open(msg.headers, msg.data, target, call=call_id)
        except ClusterError as exc:
            self._refused(claimed(msg.headers), f"answer to routed call dropped: {exc.message}")
            return None
        return opened

    @staticmethod
    def _answer(kind: str, data: bytes, ctx: CallContext) -> bytes:
        """The entry's client's answer to a question the holder's guest asked (its policy
        was checked on the holder), sealed back by the caller."""
        try:
            params = json.loads(data)
            if kind in ("sample", "elicit"):
                ask = ctx.channel.sample if kind == "sample" else ctx.channel.elicit
                return dumps({"ok": dict(ask(params))})
            fn = getattr(ctx.channel, kind, None)
            if fn is None:
                return dumps(
                    {
                        "error": {
                            "code": "unavailable",
                            "message": f"this call's client channel cannot {kind}",
                        }
                    }
                )
            if kind == "roots":
                return dumps({"ok": dict(fn())})
            requests = {
                str(key): (str(method), dict(args))
                for key, (method, args) in dict(params["requests"]).items()
            }
            return dumps({"ok": dict(fn(requests))})
        except GuestError as exc:
            return dumps({"error": {"code": exc.code, "message": exc.message}})
        except (SkilldError, ValueError, KeyError, TypeError) as exc:
            return dumps({"error": {"code": "internal", "message": str(exc)}})


class RemoteSkill:
    """A skill held by other nodes (``holders``), as a registry backend."""

    def __init__(self, router: Router, skill_id: str, digest: str):
        self._router = router
        self.skill_id = skill_id
        self.digest = digest
        self.holders: set[str] = set()
        self._turn = itertools.count()

    def pick(self, alive: Callable[[str], bool]) -> str | None:
        """The holder the next call goes to (round robin over the live ones)."""
        live = sorted(n for n in self.holders if alive(n))
        return live[next(self._turn) % len(live)] if live else None

    def call(self, method: str, args_json: str, ctx: CallContext) -> CallOutput:
        """Run ``method`` on a holder.

        Raises:
            RunOnThread, GuestError, GuestFault: as for :meth:`Router.call`.
        """
        with telemetry.span(f"skilld.route {self.skill_id}", kind="client"):
            doc = self._router.call(self, "call", method, args_json.encode(), ctx)
        return output_from_json(doc)

    def read_resource(self, uri: str, ctx: CallContext) -> list[CallOutput]:
        """Read ``uri`` on a holder.

        Raises:
            RunOnThread, GuestError, GuestFault: as for :meth:`Router.call`.
        """
        docs = self._router.call(self, "resource", uri, b"", ctx)
        return [output_from_json(d) for d in docs]

    def get_prompt(self, name: str, args_json: str, ctx: CallContext) -> list[dict[str, Any]]:
        """Render the prompt ``name`` on a holder.

        Raises:
            RunOnThread, GuestError, GuestFault: as for :meth:`Router.call`.
        """
        docs = self._router.call(self, "prompt", name, args_json.encode(), ctx)
        return [dict(d) for d in docs]
