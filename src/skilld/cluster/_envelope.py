"""The signed envelope every message between nodes travels in (announcements aside).

A routed call, each event of its reply stream (started, progress, log, sample and
elicit requests and their answers, result parts), a cancellation and each step of a
file transfer carry one header of routing facts (``Skilld-Meta``: canonical JSON with
the message's kind, the call id, the sending node ``from``, the target node ``to`` and,
for a call, the target's boot, the caller chain and depth) and the sender's Ed25519
signature over a context string, the stamp, those facts and the sha256 of the payload,
made by :func:`skilld.cluster._announce.sign`. The receiver verifies it with
:func:`~skilld.cluster._announce.check_bytes` against its bundle's trust set, checks that
the key may speak for ``from`` (the ``cluster`` patterns of its trust file), that ``to``
is itself, and takes the stamp through the node's one :class:`~skilld.cluster._announce.
Freshness` (shared with membership), so each message is accepted once. Nothing from the
bus is used before :meth:`Opener.open` returns.

Payloads are also encrypted to the receiving node when its payload key is known
(:class:`~skilld.package.BoxKey`: X25519 and ChaCha20-Poly1305, the routing facts as
associated data): a node announces its key, and every envelope carries the sender's
(``box``, signed with the rest) so that answers are sealed back to it. The routing facts
stay readable (the bus routes on subjects anyway); arguments, results, relayed events
and file bytes do not.

A replay after the *receiver* restarted finds a window that remembers nothing; that is
why a call names the target's boot (the first half of the stamps the target signs its
announcements with): a call made for an earlier life of the holder is refused by the
next one, and the entry, told so in a signed ``restarted`` answer, sends it again for
the new boot (it never ran).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skilld.cluster import _announce
from skilld.cluster._config import NODE_RE
from skilld.errors import ClusterError, SignatureError
from skilld.package import BoxKey, SigningKey, TrustStore

CONTEXT = b"skilld-cluster-envelope-v1\0"
H_META = "Skilld-Meta"
MAX_META = 8192


@dataclass(frozen=True, slots=True)
class Opened:
    """A verified message: its routing facts and the node that sent it."""

    meta: dict[str, Any]
    sender: str
    boot: int  # the sender's boot (first half of its stamp)
    data: bytes  # the payload, decrypted when it was sealed for this node
    stale: bool = False  # made for another boot of this node: payload left unread

    @property
    def box(self) -> bytes | None:
        """The sender's payload key (signed with the rest): answers are sealed to it."""
        return _box_of(self.meta)


def _box_of(meta: dict[str, Any]) -> bytes | None:
    text = meta.get("box")
    if not isinstance(text, str):
        return None
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) == 32 else None


def _signed(meta_json: bytes, data: bytes) -> bytes:
    return meta_json + b"\0" + hashlib.sha256(data).digest()


class Sealer:
    """This node's side: signs what it sends with its key and its one stamper, and
    encrypts payloads to the receiver's payload key when it knows it (:meth:`seal_to`)."""

    def __init__(
        self,
        node: str,
        key: SigningKey,
        stamper: _announce.Stamper,
        box: BoxKey | None = None,
    ):
        self.node = node
        self._key = key
        self._stamper = stamper
        self.box = box
        self._box_b64 = None if box is None else base64.b64encode(box.public_raw).decode()

    @property
    def boot(self) -> int:
        """This node's boot: targets of calls check that a call was made for it."""
        return self._stamper.boot

    def seal(self, meta: Mapping[str, Any], data: bytes) -> dict[str, str]:
        """The headers that carry ``meta`` (``from`` added) and sign it with ``data``
        (sent as it is: for messages with nothing to hide)."""
        return self.seal_to(None, meta, data)[0]

    def seal_to(
        self, box: bytes | None, meta: Mapping[str, Any], data: bytes
    ) -> tuple[dict[str, str], bytes]:
        """The headers and the payload to send: ``data`` encrypted to the payload key
        ``box`` (the routing facts its associated data), or as it is without one.

        Raises:
            ClusterError: ``box`` is not a usable X25519 public key.
        """
        full = {**meta, "from": self.node}
        if self._box_b64 is not None:
            full["box"] = self._box_b64
        mine = self.box if box is not None else None
        if mine is not None:
            full["enc"] = 1
        meta_json = json.dumps(full, separators=(",", ":"), sort_keys=True).encode()
        if mine is not None and box is not None:
            try:
                data = mine.seal(box, data, meta_json)
            except SignatureError as exc:
                raise ClusterError(f"cannot encrypt to that node: {exc.message}") from exc
        headers = _announce.sign(_signed(meta_json, data), self._key, self._stamper(), CONTEXT)
        headers[H_META] = meta_json.decode()
        return headers, data


class Opener:
    """The receiving side: verifies a message before anything of it is used."""

    def __init__(
        self,
        node: str,
        trust: TrustStore,
        fresh: _announce.Freshness,
        box: BoxKey | None = None,
    ):
        self.node = node
        self._trust = trust
        self._fresh = fresh
        self._box = box

    def open(
        self,
        headers: Mapping[str, str] | None,
        data: bytes,
        sender: str | None = None,
        boot: int | None = None,
        **expect: Any,
    ) -> Opened:
        """Verify a sealed message addressed to this node; accept its stamp once.

        ``sender``, when given, is the only node it may come from; ``expect`` are routing
        facts it must carry (``call=ID``: an event of that call). ``boot``, when given, is
        this node's: a message made for another boot is returned ``stale``, its payload
        unread (sealed to that boot's payload key, it could not be read anyway).

        Raises:
            ClusterError: unsigned, a key the trust set does not hold or that may not
                speak for the node it claims, a bad signature, not addressed to this node,
                from another node than ``sender``, facts other than ``expect``, or a stamp
                seen before (a replay).
        """
        expected = sender
        headers = headers or {}
        meta_text = headers.get("Skilld-Meta", "")
        if not meta_text or len(meta_text) > MAX_META:
            raise ClusterError("an unsealed cluster message refused (no signed envelope)")
        meta_json = meta_text.encode()
        key = _announce.check_bytes(_signed(meta_json, data), headers, self._trust, CONTEXT)
        try:
            meta = json.loads(meta_json)
        except ValueError:
            raise ClusterError("a cluster envelope that is not JSON") from None
        if not isinstance(meta, dict):
            raise ClusterError("a cluster envelope that is not an object")
        claimed_by = meta.get("from")
        if not isinstance(claimed_by, str) or not NODE_RE.fullmatch(claimed_by):
            raise ClusterError(f"a cluster envelope from an invalid node name {claimed_by!r}")
        if not key.may_announce(claimed_by):
            raise ClusterError(
                f"key {key.name} ({key.key_id}) may not speak for node {claimed_by!r}",
                location=key.source or None,
            )
        if meta.get("to") != self.node:
            raise ClusterError(
                f"a message from node {claimed_by!r} addressed to {meta.get('to')!r}, not to "
                f"this node ({self.node})"
            )
        if expected is not None and claimed_by != expected:
            raise ClusterError(
                f"a message from node {claimed_by!r} where only node {expected!r} may speak "
                f"(it did not start, or was not sent, this exchange)"
            )
        for name, value in expect.items():
            if meta.get(name) != value:
                raise ClusterError(
                    f"a message from node {claimed_by!r} for {name} {meta.get(name)!r}, "
                    f"not {value!r}"
                )
        stale = boot is not None and meta.get("boot") != boot
        if stale:
            data = b""
        elif meta.get("enc"):
            peer = _box_of(meta)
            if self._box is None or peer is None:
                raise ClusterError(f"an encrypted message from node {claimed_by!r} without keys")
            try:
                data = self._box.open(peer, data, meta_json)
            except SignatureError as exc:
                raise ClusterError(f"from node {claimed_by!r}: {exc.message}") from exc
        stamp = _announce.parse_stamp(headers)
        self._fresh.accept(claimed_by, stamp)
        return Opened(meta, claimed_by, stamp[0], data, stale)


def claimed(headers: Mapping[str, str] | None) -> str:
    """The node an unverified message claims to come from (for the refusal's record)."""
    try:
        meta = json.loads((headers or {}).get(H_META, "") or "{}")
    except ValueError:
        return "?"
    sender = meta.get("from", "?") if isinstance(meta, dict) else "?"
    return str(sender)[:64]
