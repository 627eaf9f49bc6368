"""Retries of input-required rounds between a cluster's entry nodes.

A 2026-07-28 client whose requests a balancer spreads over entry nodes may retry a
round at another node than the one whose guest asked (``skilld.mcp`` keeps the call
parked there; its ``requestState`` names the node). :class:`RoundRelay` is what the MCP
layer sees as ``RoundPeers``: :meth:`~RoundRelay.forward` sends the retry to the
node holding the call, on that node's own subject ``skilld.call.NODE._round`` (only
that node may subscribe to it on the bus ``skilld cluster nats-config`` writes), in the
signed envelope (``_envelope``) with its payload sealed to that node; the answer comes
back sealed to the sender, signed by the node it went to, for this exchange. The
holder takes a retry only from a member of the cluster, each message once (the
envelope's stamp), and runs it on its MCP loop (:meth:`~RoundRelay.serve`).

A retry sent twice reaches one parked call: the guest is kept, never replayed, so no
host call of it runs again; the MCP layer's round number makes the copy answer nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from nats.aio.msg import Msg

from skilld import telemetry
from skilld.cluster._envelope import Opened, Opener, Sealer, claimed
from skilld.cluster._link import NatsLink
from skilld.cluster._wire import CALL_PREFIX, dumps, split
from skilld.errors import ClusterError

log = logging.getLogger("skilld.cluster")

# Not a skill token (those never start with "_"): a subject of its own under the node's.
_SUBJECT_TAIL = "_round"
# How often a waiting sender looks whether the holder is still a member.
_POLL_S = 0.25
_INTERNAL = -32603

Relayed = Callable[[Mapping[str, Any]], Coroutine[Any, Any, dict[str, Any]]]


def round_subject(node: str) -> str:
    """Where ``node`` takes forwarded retries."""
    return f"{CALL_PREFIX}.{node}.{_SUBJECT_TAIL}"


class RoundRelay:
    """Forwarded input-required retries, both ways; see the module docstring.

    Args:
        link: the node's NATS connection.
        sealer: signs (and seals) what this node sends.
        opener: verifies what it receives.
        entry: whether a node is an entry node of the cluster now (a member announcing
            the ``entry`` role).
        box: a member's payload key (what is sent to it is sealed to it).
        refused: told ``(claimed node, reason)`` of each message dropped (audit).
        timeout_s: the longest a forwarded retry waits for its answer (the round's
            ``requestState`` lifetime; the call's own deadline usually ends it first).
    """

    def __init__(
        self,
        link: NatsLink,
        sealer: Sealer,
        opener: Opener,
        entry: Callable[[str], bool],
        box: Callable[[str], bytes | None],
        refused: Callable[[str, str], None] = lambda node, reason: None,
        timeout_s: float = 600.0,
    ) -> None:
        self._link = link
        self._sealer = sealer
        self._opener = opener
        self._entry = entry
        self._box = box
        self._refused = refused
        self.timeout_s = timeout_s
        self._handler: Relayed | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running: set[asyncio.Task[None]] = set()
        self.served = 0

    @property
    def node(self) -> str:
        """This node's name."""
        return self._sealer.node

    async def start(self) -> None:
        """Take forwarded retries (an entry node)."""
        await self._link.nc.subscribe(round_subject(self.node), cb=self._on_retry)

    def serve(self, handler: Relayed, loop: asyncio.AbstractEventLoop) -> None:
        """Run ``handler`` on ``loop`` (the MCP server's) for each forwarded retry."""
        self._handler, self._loop = handler, loop

    # -- the entry node that got the retry ------------------------------------------

    async def forward(self, node: str, request: Mapping[str, Any]) -> Mapping[str, Any]:
        """Send ``request`` to ``node`` and wait for its answer (from any event loop).

        Raises:
            ClusterError: ``node`` is not a member, takes no retries, left before it
                answered, or gave no answer within ``timeout_s``.
        """
        future = asyncio.run_coroutine_threadsafe(self._forward(node, request), self._link.loop)
        return await asyncio.wrap_future(future)

    async def _forward(self, node: str, request: Mapping[str, Any]) -> Mapping[str, Any]:
        if not self._entry(node):
            raise ClusterError(
                f"node {node}, which holds this round's call, is not an entry node of the "
                "cluster now",
                hint="start the call again",
            )
        nc = self._link.nc
        exchange = secrets.token_hex(12)
        answers: asyncio.Queue[Msg] = asyncio.Queue()
        parts: list[bytes] = []  # the answer, in parts when larger than one message
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox, cb=answers.put)
        # One pending get across polls: a wait that times out must not lose a message.
        getter: asyncio.Future[Msg] | None = None
        try:
            meta = {"ev": "round", "call": exchange, "to": node}
            headers, body = self._sealer.seal_to(self._box(node), meta, dumps(dict(request)))
            await nc.publish(round_subject(node), body, reply=inbox, headers=headers)
            end = time.monotonic() + self.timeout_s
            while True:
                left = end - time.monotonic()
                if left <= 0:
                    raise ClusterError(f"node {node} did not answer the forwarded retry in time")
                getter = getter or asyncio.ensure_future(answers.get())
                done, _ = await asyncio.wait({getter}, timeout=min(_POLL_S, left))
                if not done:
                    if not self._entry(node):
                        raise ClusterError(
                            f"node {node}, which held this round's call, left the cluster "
                            "before it answered",
                            hint="start the call again",
                        )
                    continue
                msg, getter = getter.result(), None
                if (msg.headers or {}).get("Status") == "503":
                    raise ClusterError(
                        f"node {node} takes no forwarded retries (not an entry node)"
                    )
                try:
                    opened = self._opener.open(msg.headers, msg.data, node, call=exchange)
                except ClusterError as exc:
                    self._refused(claimed(msg.headers), f"forwarded retry's answer dropped: {exc}")
                    continue
                event = opened.meta.get("ev")
                if event not in ("round-part", "round-answer") or opened.meta.get("n") != len(
                    parts
                ):
                    continue  # signed by the node, for this exchange, but out of order
                parts.append(opened.data)
                if event == "round-part":
                    continue
                try:
                    doc = json.loads(b"".join(parts))
                except ValueError:
                    doc = None
                if not isinstance(doc, dict):
                    raise ClusterError(f"node {node} answered the forwarded retry with no object")
                return doc
        finally:
            if getter is not None:
                getter.cancel()
            with contextlib.suppress(Exception):  # the connection may be closing
                await sub.unsubscribe()

    # -- the entry node that holds the call ------------------------------------------

    async def _on_retry(self, msg: Msg) -> None:
        if not msg.reply:
            return
        try:
            opened = self._opener.open(msg.headers, msg.data, ev="round")
        except ClusterError as exc:
            self._refused(claimed(msg.headers), f"forwarded retry refused: {exc.message}")
            return
        if not self._entry(opened.sender):
            self._refused(opened.sender, "forwarded retry refused: its sender is not an entry node")
            return
        # Each in a task of its own: a retry waits for its guest, the next need not.
        task = asyncio.get_running_loop().create_task(self._answer(msg.reply, opened))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _answer(self, reply: str, opened: Opened) -> None:
        self.served += 1
        log.info("cluster: forwarded retry from %s", opened.sender)
        handler, loop = self._handler, self._loop
        try:
            request = json.loads(opened.data)
        except ValueError as exc:
            request = f"not JSON: {exc}"
        if not isinstance(request, dict):
            doc: dict[str, Any] = _error("an unreadable forwarded retry")
        else:
            if handler is None or loop is None or loop.is_closed():
                doc = _error(f"node {self.node} serves no MCP clients now")
            else:
                try:
                    # The retry's trace (from the entry node that got it) goes on here.
                    with telemetry.joined(opened.meta, "skilld.round.relayed"):
                        doc = await asyncio.wrap_future(
                            asyncio.run_coroutine_threadsafe(handler(request), loop)
                        )
                except Exception as exc:  # a bug costs this retry, and its sender is told
                    log.exception("cluster: a forwarded retry failed on %s", self.node)
                    doc = _error(f"the forwarded retry failed on node {self.node}: {exc!r}")
        nc = self._link.nc
        parts = split(dumps(doc), nc.max_payload)
        try:
            for n, part in enumerate(parts):
                event = "round-answer" if n == len(parts) - 1 else "round-part"
                back = {"ev": event, "call": opened.meta.get("call"), "to": opened.sender, "n": n}
                headers, out = self._sealer.seal_to(opened.box, back, part)
                await nc.publish(reply, out, headers=headers)
        except Exception as exc:  # noqa: BLE001 - the sender ends at its own wait's bound
            log.warning(
                "cluster: the answer to a retry from %s was not sent: %r", opened.sender, exc
            )


def _error(message: str) -> dict[str, Any]:
    return {"error": {"code": _INTERNAL, "message": message}}
