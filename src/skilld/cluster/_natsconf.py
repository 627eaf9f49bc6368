"""The least-privilege NATS bus skilld documents: ``skilld cluster nats-config``.

It writes, into one directory the operator keeps out of version control:

- ``nats.conf``: one account (``SKILLD``, JetStream enabled) whose only users are the
  nodes, each known by an NKey (no password travels, no anonymous user: a connection
  without a node's seed is refused), each allowed to subscribe only to what it must
  hear (announcements, leaves, cancellations, its *own* call and transfer subjects, its
  own inbox ``_INBOX.NODE.>`` and the ``$SRV`` discovery subjects) and to publish on
  skilld's subjects, inboxes and the JetStream KV API; an optional ``observer`` user
  (``skilld cluster status``) that hears announcements only; TLS with a certificate of
  a CA made for this bus.
- ``NODE.nk``: each node's NKey seed (mode 0600; ``skilld serve --nats-nkey``).
- ``ca.pem``, ``server.pem``, ``server-key.pem`` (``--nats-tls-ca ca.pem`` on nodes).
- ``request-state.key``: 32 random bytes (hex, mode 0600) the entry nodes share to seal
  the ``requestState`` of MCP input-required rounds (``skilld serve
  --request-state-key``), so that a retry any entry node receives opens there.

A node then reads nothing of another node's calls even if it is compromised: call
payloads go to the subject of the node that runs them and answers to the inbox of the
node that asked. The bus's permissions are the second wall; the first is the signed
envelope every message between nodes carries (``_envelope``).
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from skilld.cluster._config import NODE_RE
from skilld.errors import UsageError
from skilld.package import nkeys, write_server_tls

OBSERVER = "observer"


@dataclass(frozen=True, slots=True)
class NatsSetup:
    """What :func:`write_nats_config` wrote."""

    config: Path
    seeds: dict[str, Path]  # node (and "observer") -> its NKey seed file
    ca: Path
    url: str
    request_state_key: Path | None = None  # the entry nodes' shared round-sealing secret


def _secret(path: Path) -> None:
    """32 fresh random bytes, hex, written to ``path`` (0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as out:
        out.write(secrets.token_hex(32) + "\n")


def _seed(path: Path) -> str:
    """A fresh user NKey seed written to ``path`` (0600); returns its public key."""
    seed = nkeys.encode_seed(os.urandom(32))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(seed + b"\n")
    return nkeys.from_seed(seed).public_key.decode()


def node_permissions(node: str) -> dict[str, dict[str, list[str]]]:
    """What node ``node`` may publish and subscribe to."""
    return {
        "publish": {"allow": ["skilld.>", "_INBOX.>", "$JS.API.>", "$JS.ACK.>", "$KV.>", "$SRV.>"]},
        "subscribe": {
            "allow": [
                "skilld.announce",
                "skilld.leave",
                "skilld.cancel.*",
                f"skilld.call.{node}.>",
                f"skilld.transfer.{node}",
                f"_INBOX.{node}.>",
                "$SRV.>",
            ]
        },
    }


OBSERVER_PERMISSIONS = {
    "publish": {"deny": [">"]},
    "subscribe": {"allow": ["skilld.announce", "skilld.leave"]},
}


def write_nats_config(
    out: Path, nodes: list[str], host: str = "127.0.0.1", port: int = 4222, observer: bool = True
) -> NatsSetup:
    """Write the bus configuration for ``nodes`` into ``out`` (created, or empty).

    Raises:
        UsageError: an invalid or repeated node name, no node, or ``out`` not empty.
    """
    if not nodes:
        raise UsageError("name at least one node", location="--node")
    for node in nodes:
        if not NODE_RE.fullmatch(node) or node == OBSERVER:
            raise UsageError(f"node name {node!r} is not valid", location="--node")
    if len(set(nodes)) != len(nodes):
        raise UsageError("a node is named twice", location="--node")
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise UsageError(f"{out} is not empty", location="--out", hint="give a new directory")
    out.chmod(0o700)
    hosts = list(dict.fromkeys([host, "127.0.0.1", "localhost"]))
    tls = write_server_tls(out, hosts)
    seeds: dict[str, Path] = {}
    users = []
    for name in [*nodes, *([OBSERVER] if observer else [])]:
        seeds[name] = out / f"{name}.nk"
        public = _seed(seeds[name])
        perms = OBSERVER_PERMISSIONS if name == OBSERVER else node_permissions(name)
        user = f"{{ nkey: {json.dumps(public)}, permissions: {json.dumps(perms)} }}"
        users.append(f"      # {name}\n      {user}")
    (out / "jetstream").mkdir()
    text = "\n".join(
        [
            "# Written by `skilld cluster nats-config` (docs/cluster.md). Keep this directory",
            "# out of version control: it holds the nodes' NKey seeds and the TLS key.",
            f"listen: {json.dumps(f'{host}:{port}')}",
            # Each acknowledged kv write is on disk before its ack: it survives kill -9.
            f"jetstream {{ store_dir: {json.dumps(str(out / 'jetstream'))}, "
            "sync_interval: always }",
            "tls {",
            f"  cert_file: {json.dumps(str(tls.cert))}",
            f"  key_file: {json.dumps(str(tls.key))}",
            "  timeout: 2",
            "}",
            "# No no_auth_user: a connection without a node's NKey is refused.",
            "accounts {",
            "  SKILLD {",
            "    jetstream: enabled",
            "    users: [",
            *users,
            "    ]",
            "  }",
            "}",
            "",
        ]
    )
    config = out / "nats.conf"
    config.write_text(text, encoding="utf-8")
    _secret(out / "request-state.key")
    return NatsSetup(config, seeds, tls.ca, f"tls://{host}:{port}", out / "request-state.key")
