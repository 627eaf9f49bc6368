"""How a node joins a cluster: one frozen value, passed down explicitly."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from skilld.errors import UsageError

# Node names are subject tokens and trust-scope targets: the characters of skill ids.
NODE_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Everything a node needs to join a cluster over NATS.

    Secrets are never values here, only files holding them, so that they never
    appear on a command line or in a process listing.

    Attributes:
        url: the NATS server(s), ``nats://HOST:PORT`` or ``tls://HOST:PORT``,
            comma-separated for several.
        node: this node's name (``[a-z0-9][a-z0-9-]*``), unique in the cluster.
        key_file: the Ed25519 private key (PEM, ``skilld keygen``) that signs this
            node's announcements; peers accept them only when their bundle's trust
            set holds its public half with ``cluster`` patterns matching ``node``.
        creds_file: a NATS credentials file (user JWT and nkey seed).
        nkey_seed_file: a NATS nkey seed file.
        user_password_file: one line ``USER:PASSWORD`` for NATS user authentication.
        tls_ca, tls_cert, tls_key: TLS trust anchors and this node's client certificate.
        heartbeat_s: the heartbeat interval H: the announcement is published this often.
        expiry_factor: a peer silent for ``expiry_factor * heartbeat_s`` is removed
            (between 2 and 3).
        entry: this node serves the cluster's tools to MCP clients (False: worker only,
            it serves its own skills to the cluster and nothing else).
        kv: skills' key-value state lives in JetStream KV (shared by replicas) instead
            of the node's SQLite file.
        reconnect_wait_s: the pause between reconnection attempts to NATS.
        connect_timeout_s: how long the first connection may take.
    """

    url: str
    node: str
    key_file: Path
    creds_file: Path | None = None
    nkey_seed_file: Path | None = None
    user_password_file: Path | None = None
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    heartbeat_s: float = 1.0
    expiry_factor: float = 2.5
    entry: bool = True
    kv: bool = False
    reconnect_wait_s: float = 0.25
    connect_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if not NODE_RE.fullmatch(self.node):
            raise UsageError(
                f"node name {self.node!r} is not valid",
                location="--node",
                hint="use lower-case letters, digits and '-', starting with a letter or digit",
            )
        for url in self.servers():
            if not re.fullmatch(r"(nats|tls)://[^\s/]+", url):
                raise UsageError(
                    f"{url!r} is not a NATS URL", location="--cluster", hint="nats://HOST:4222"
                )
        if not 0 < self.heartbeat_s <= 60:
            raise UsageError("the heartbeat interval must be in (0, 60] seconds")
        if not 2 <= self.expiry_factor <= 3:
            raise UsageError("the expiry factor must be between 2 and 3 heartbeats")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise UsageError("a TLS client certificate needs its key, and the key its certificate")
        if (
            sum(
                f is not None
                for f in (self.creds_file, self.nkey_seed_file, self.user_password_file)
            )
            > 1
        ):
            raise UsageError("give one of a creds file, an nkey seed file or a user:password file")

    @property
    def expiry_s(self) -> float:
        """How long a peer may stay silent before it is removed."""
        return self.heartbeat_s * self.expiry_factor

    def servers(self) -> list[str]:
        """The NATS server URLs."""
        return [u.strip() for u in self.url.split(",") if u.strip()]
