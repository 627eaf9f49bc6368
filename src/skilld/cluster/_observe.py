"""``skilld cluster status``: listen to the cluster's announcements for a while."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from nats.aio.msg import Msg

from skilld.cluster import _announce
from skilld.cluster._config import ClusterConfig
from skilld.cluster._link import NatsLink
from skilld.cluster._wire import ANNOUNCE, H_KEY
from skilld.errors import ClusterError
from skilld.package import TrustStore


def observe(
    config: ClusterConfig, trust: TrustStore | None, seconds: float
) -> list[dict[str, Any]]:
    """The nodes heard announcing within ``seconds``, newest announcement each.

    With ``trust`` each announcement is verified as an entry node would (``verified``
    says whether it passed, ``refused`` why not); without, it is only read.

    Raises:
        UsageError, ClusterError: as for joining (credentials, NATS unreachable).
    """
    link = NatsLink(config)
    link.start()
    seen: dict[str, dict[str, Any]] = {}

    async def listen() -> None:
        async def on_msg(msg: Msg) -> None:
            now = time.time()
            try:
                doc = json.loads(msg.data)
            except ValueError:
                return
            node = str(doc.get("node", "?"))
            row: dict[str, Any] = {
                "node": node,
                "roles": doc.get("roles", []),
                "bundle": doc.get("bundle"),
                "skills": [
                    {"id": s["spec"]["id"], "version": s["spec"]["version"], "digest": s["digest"]}
                    for s in doc.get("skills", [])
                    if isinstance(s, dict) and "spec" in s
                ],
                "last_heartbeat_at": now,
                "heartbeats": seen.get(node, {}).get("heartbeats", 0) + 1,
                "key_id": (msg.headers or {}).get(H_KEY),
            }
            if trust is not None:
                try:
                    _announce.verify(msg.data, msg.headers, trust)
                    row["verified"] = True
                except ClusterError as exc:
                    row["verified"], row["refused"] = False, str(exc)
            seen[node] = row

        sub = await link.nc.subscribe(ANNOUNCE, cb=on_msg)
        await asyncio.sleep(seconds)
        await sub.unsubscribe()

    try:
        link.run(listen(), timeout=seconds + 5)
    finally:
        link.close()
    now = time.time()
    for row in seen.values():
        row["last_heartbeat_s"] = round(now - row["last_heartbeat_at"], 3)
    return sorted(seen.values(), key=lambda r: str(r["node"]))
