"""One node at a time checks who serves its stateful skills, then starts serving them.

The replica check (``Cluster._no_split_state``) reads ``nats micro`` discovery: two nodes
starting at the same moment would each find nobody and both serve a kv skill with state
of their own. A create-only key in JetStream KV (bucket ``skilld-start``, key
``replica-check``) makes them take turns: a node creates it before its check and deletes
it once its endpoints answer discovery, so the next node's check sees them. The bucket's
maximum age is :data:`HOLD_S`: a node killed while it holds the key loses it then, and
nobody waits for a dead node longer than that. Without JetStream on the server the
check falls back to discovery alone (and says so).
"""

from __future__ import annotations

import asyncio
import logging

from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from skilld.cluster._link import NatsLink
from skilld.errors import ClusterError

log = logging.getLogger("skilld.cluster")

BUCKET = "skilld-start"
KEY = "replica-check"
HOLD_S = 3.0  # a turn ends by then even when its node died holding it
_POLL_S = 0.05
_OP_TIMEOUT_S = 2.0


class StartTurn:
    """This node's turn at the replica check (an async context manager, on the loop)."""

    def __init__(self, link: NatsLink, node: str, wait_s: float = 2 * HOLD_S):
        self._link = link
        self._node = node
        self._wait_s = wait_s
        self._kv: KeyValue | None = None
        self._revision = 0

    async def __aenter__(self) -> StartTurn:
        """Wait for this node's turn (or for none, without JetStream).

        Raises:
            ClusterError: other nodes kept the turn for longer than ``wait_s``.
        """
        kv = await self._bucket()
        if kv is None:
            return self
        loop = asyncio.get_running_loop()
        end = loop.time() + self._wait_s
        while True:
            try:
                self._revision = await kv.create(KEY, self._node.encode())
            except (KeyWrongLastSequenceError, KeyNotFoundError):
                # Refused: another node is checking, its turn first. (nats-py's create()
                # looks the key up after a refused create; a hold that ran out or was
                # given back in between reads as "not found": try again all the same.)
                if loop.time() >= end:
                    raise ClusterError(
                        f"other nodes kept the replica check ({BUCKET}/{KEY} in JetStream "
                        f"KV) for over {self._wait_s:.3g}s",
                        hint="start the nodes holding stateful skills again",
                    ) from None
                await asyncio.sleep(_POLL_S)
                continue
            self._kv = kv
            return self

    async def __aexit__(self, *exc: object) -> None:
        """Give the turn back (only this node's: a turn that timed out is someone else's)."""
        if self._kv is None:
            return
        try:
            await self._kv.delete(KEY, last=self._revision)
        except Exception as exc:  # noqa: BLE001 - the bucket's maximum age ends it anyway
            log.info("cluster: the replica check's turn was not given back: %r", exc)

    async def _bucket(self) -> KeyValue | None:
        try:
            return await self._link.bucket(
                KeyValueConfig(
                    bucket=BUCKET,
                    description="skilld: nodes take turns at the replica check",
                    history=1,
                    ttl=HOLD_S,
                    storage=StorageType.MEMORY,
                ),
                timeout=_OP_TIMEOUT_S,
            )
        except Exception as exc:  # noqa: BLE001 - no JetStream: discovery alone
            log.warning(
                "cluster: no JetStream KV for the replica check (%r): two nodes starting "
                "at the same moment could both serve a skill with state of its own",
                exc,
            )
            return None
