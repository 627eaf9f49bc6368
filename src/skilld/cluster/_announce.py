"""Signed announcements: who a node is and which skills it serves.

A node publishes its announcement as its heartbeat. The payload is canonical JSON
(node, roles, bundle digest, skills with version, package digest, methods with
schemas, exposure, annotations and limits); the headers carry the signing key's id
and an Ed25519 signature over a context string and the payload. A receiver accepts
it only when its own bundle's trust set holds that key with ``cluster`` patterns
matching the node's name (``TrustedKey.may_announce``): a stray NATS client cannot
inject tools. A leave message is signed the same way.

Every signed message also carries a stamp (``Skilld-Stamp: BOOT.SEQ``), covered by the
signature: the sender's start time in nanoseconds and a counter. A receiver accepts each
stamp of a sender once (:class:`Freshness`), so a captured message replayed later, or
sent to another node, is refused: no clock has to agree with another node's.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import itertools
import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skilld.cluster._config import NODE_RE
from skilld.cluster._wire import H_KEY, H_SIG, H_STAMP
from skilld.errors import ClusterError, PackageFormatError
from skilld.package import (
    SigningKey,
    TrustedKey,
    TrustStore,
    canonical_json,
    verify_signature,
)
from skilld.registry import Exposure, SkillEntry, ToolAnnotations
from skilld.types import Limits, SkillSpec

CONTEXT = b"skilld-cluster-announcement-v1\0"
LEAVE_CONTEXT = b"skilld-cluster-leave-v1\0"
MAX_ANNOUNCEMENT = 4 * 1024 * 1024
VERSION = 1


@dataclass(frozen=True, slots=True)
class LocalSkill:
    """A skill this node serves to the cluster: its registry entry and package digest."""

    entry: SkillEntry
    digest: str


@dataclass(frozen=True, slots=True)
class AnnouncedSkill:
    """One skill of a peer, as its verified announcement describes it."""

    spec: SkillSpec
    digest: str
    exposure: Exposure
    annotations: ToolAnnotations
    description: str | None
    limits: Limits


@dataclass(frozen=True, slots=True)
class Announcement:
    """A peer's verified announcement."""

    node: str
    roles: tuple[str, ...]
    bundle: str
    skills: tuple[AnnouncedSkill, ...]
    key_id: str
    fingerprint: str  # sha256 of the payload: an unchanged announcement is not re-read
    box: bytes | None = None  # the node's payload key (X25519): what is sent to it is sealed


def payload(
    node: str,
    roles: tuple[str, ...],
    bundle: str,
    skills: list[LocalSkill],
    box: bytes | None = None,
) -> bytes:
    """The canonical bytes of this node's announcement (``box``: its payload key)."""
    doc: dict[str, Any] = {
        "v": VERSION,
        "node": node,
        "roles": list(roles),
        "bundle": bundle,
        "skills": [
            {
                "spec": s.entry.spec.as_dict(),
                "digest": s.digest,
                "exposure": s.entry.exposure.table(),
                "annotations": {
                    "read_only": s.entry.annotations.read_only,
                    "destructive": s.entry.annotations.destructive,
                    "idempotent": s.entry.annotations.idempotent,
                    "open_world": s.entry.annotations.open_world,
                },
                "description": s.entry.description,
                "limits": {
                    "timeout_ms": s.entry.limits.timeout_ms,
                    "max_concurrency": s.entry.limits.max_concurrency,
                },
            }
            for s in skills
        ],
    }
    if box is not None:
        doc["box"] = base64.b64encode(box).decode()
    return canonical_json(doc)


class Stamper:
    """The stamps of one sender: its start time in nanoseconds, then a counter.

    A sender restarted later has a larger boot time, so receivers take its stamps as
    newer than any of its previous life.
    """

    def __init__(self) -> None:
        self.boot = time.time_ns()
        self._seq = itertools.count(1)
        self._lock = threading.Lock()

    def __call__(self) -> str:
        """The next stamp (any thread)."""
        with self._lock:
            return f"{self.boot}.{next(self._seq)}"


class Freshness:
    """Each stamp of a sender accepted once (anti-replay, as IPsec's window does it).

    Per sender it keeps the newest boot, the highest counter seen in it and which of
    the last :attr:`WINDOW` counters were seen, so messages that overtake each other (two
    threads signing, then publishing in the other order) are still accepted, once. A
    stamp of an older boot, one already seen, or one more than the window behind is
    refused. A receiver that restarts forgets what it saw: it may accept, once, a
    message it never received before.
    """

    WINDOW = 1024
    _MASK = (1 << WINDOW) - 1

    def __init__(self) -> None:
        # sender -> (newest boot, highest counter in it, bit i set: counter top - i seen)
        self._seen: dict[str, tuple[int, int, int]] = {}
        self._lock = threading.Lock()

    def accept(self, sender: str, stamp: tuple[int, int]) -> None:
        """Take ``stamp`` of ``sender`` as seen.

        Raises:
            ClusterError: the stamp was seen before, or is older than what was seen.
        """
        boot, seq = stamp
        with self._lock:
            known = self._seen.get(sender)
            if known is None or boot > known[0]:
                self._seen[sender] = (boot, seq, 1)
                return
            top_boot, top, bits = known
            back = top - seq
            if boot < top_boot or back >= self.WINDOW or (back >= 0 and bits >> back & 1):
                raise ClusterError(
                    f"a replayed or stale message from node {sender!r} (stamp {boot}.{seq} "
                    "was seen already, or is older than the last one accepted)"
                )
            if back < 0:  # a new highest counter: the window slides (a bitmap, as IPsec's)
                # (a jump past the window forgets it all: no shift by a hostile amount)
                bits = ((bits << -back) | 1) & self._MASK if -back < self.WINDOW else 1
                top = seq
            else:
                bits |= 1 << back
            self._seen[sender] = (boot, top, bits)


def sign(data: bytes, key: SigningKey, stamp: str, context: bytes = CONTEXT) -> dict[str, str]:
    """The headers that sign ``data`` with ``stamp`` (a :class:`Stamper`'s)."""
    signature = key.sign(_signed_bytes(context, stamp, data))
    return {H_KEY: key.key_id, H_SIG: base64.b64encode(signature).decode(), H_STAMP: stamp}


def _signed_bytes(context: bytes, stamp: str, data: bytes) -> bytes:
    return context + stamp.encode() + b"\0" + data


def parse_stamp(headers: Mapping[str, str]) -> tuple[int, int]:
    """The ``(boot, seq)`` of a message's stamp header.

    Raises:
        ClusterError: no stamp, or not two positive decimal numbers.
    """
    parts = str(headers.get(H_STAMP, "")).split(".")
    if len(parts) != 2 or not all(p.isdecimal() and 0 < len(p) <= 20 for p in parts):
        raise ClusterError("a cluster message without a valid stamp refused")
    return int(parts[0]), int(parts[1])


def leave_payload(node: str, nonce: str) -> bytes:
    """The canonical bytes of a leave message."""
    return canonical_json({"v": VERSION, "leave": node, "nonce": nonce})


def check_bytes(
    data: bytes, headers: Mapping[str, str] | None, trust: TrustStore, context: bytes
) -> TrustedKey:
    """Verify the signature (stamp included) of a cluster message; returns the key.

    Raises:
        ClusterError: unsigned, no stamp, a key the trust set does not hold, a bad
            signature.
    """
    headers = headers or {}
    kid, sig_b64 = headers.get(H_KEY), headers.get(H_SIG)
    if not kid or not sig_b64:
        raise ClusterError("unsigned cluster message refused")
    stamp = headers.get(H_STAMP, "")
    parse_stamp(headers)
    key = trust.get(kid)
    if key is None:
        raise ClusterError(f"signed by key {kid}, which this node's trust set does not hold")
    try:
        signature = base64.b64decode(sig_b64, validate=True)
    except (binascii.Error, ValueError):
        raise ClusterError(f"the signature of key {kid} is not base64") from None
    if len(data) > MAX_ANNOUNCEMENT or not verify_signature(
        key.public_raw, signature, _signed_bytes(context, stamp, data)
    ):
        raise ClusterError(f"the signature by key {key.name} ({kid}) does not verify")
    return key


def check_signature(
    data: bytes, headers: Mapping[str, str] | None, trust: TrustStore, context: bytes
) -> tuple[dict[str, Any], str]:
    """Verify a signed cluster message; returns its JSON document and the key id.

    The stamp is verified with the rest; whether it was seen before is for the
    receiver's :class:`Freshness` to say.

    Raises:
        ClusterError: unsigned, no stamp, signed by a key the trust set does not hold,
            a bad signature, not JSON, or a node name the key may not speak for.
    """
    key = check_bytes(data, headers, trust, context)
    kid = key.key_id
    try:
        doc = json.loads(data)
    except ValueError:
        raise ClusterError("a signed cluster message that is not JSON") from None
    if not isinstance(doc, dict) or doc.get("v") != VERSION:
        raise ClusterError("a cluster message of an unknown version")
    node = doc.get("node", doc.get("leave"))
    if not isinstance(node, str) or not NODE_RE.fullmatch(node):
        raise ClusterError(f"a cluster message for an invalid node name {node!r}")
    if not key.may_announce(node):
        raise ClusterError(
            f"key {key.name} ({kid}) may not speak for node {node!r}: its trust file's "
            f"'cluster' patterns are {list(key.cluster) or 'empty'}",
            location=key.source or None,
        )
    return doc, kid


# What a node may say it is: it takes calls from clients, or it runs skills.
ROLES = frozenset({"entry", "worker"})


def verify(data: bytes, headers: Mapping[str, str] | None, trust: TrustStore) -> Announcement:
    """A verified announcement from a message's bytes and headers.

    Raises:
        ClusterError: as for :func:`check_signature`, or a malformed announcement.
    """
    doc, kid = check_signature(data, headers, trust, CONTEXT)
    try:
        skills = tuple(
            AnnouncedSkill(
                spec=SkillSpec.from_dict(s["spec"]),
                digest=str(s["digest"]),
                exposure=_exposure(s["exposure"]),
                annotations=ToolAnnotations(**{k: bool(v) for k, v in s["annotations"].items()}),
                description=s.get("description"),
                limits=Limits(
                    timeout_ms=int(s["limits"]["timeout_ms"]),
                    max_concurrency=int(s["limits"]["max_concurrency"]),
                ),
            )
            for s in doc["skills"]
        )
        return Announcement(
            node=_text(doc["node"]),
            roles=_roles(doc["roles"]),
            bundle=_text(doc["bundle"]),
            skills=skills,
            key_id=kid,
            fingerprint=hashlib.sha256(data).hexdigest(),
            box=None if doc.get("box") is None else _box(doc["box"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError, PackageFormatError) as exc:
        raise ClusterError(f"a malformed announcement from {doc.get('node')!r}: {exc!r}") from exc


def _roles(value: object) -> tuple[str, ...]:
    # Strict: a text is not a list of roles (tuple("entry") would read as five).
    if not isinstance(value, list) or not set(value) <= ROLES:
        raise ValueError(f"roles must be a list of {sorted(ROLES)}, not {value!r:.80}")
    return tuple(value)


def _text(value: object) -> str:
    # Strict: None is not a node name or a digest (str(None) would read as one).
    if not isinstance(value, str):
        raise TypeError(f"expected a string, not {type(value).__name__}")
    return value


def _box(text: object) -> bytes:
    raw = base64.b64decode(str(text), validate=True)
    if len(raw) != 32:
        raise ValueError("a payload key is 32 bytes")
    return raw


def _exposure(table: Mapping[str, Any]) -> Exposure:
    return Exposure(
        per_skill=table["tools"] == "per-skill",
        hidden=tuple(table["hidden"]),
        names=dict(table["names"]),
        titles=dict(table["titles"]),
        descriptions=dict(table["descriptions"]),
        client=tuple(table["client"]),
        tasks={str(k): str(v) for k, v in dict(table.get("tasks", {})).items()},
    )
