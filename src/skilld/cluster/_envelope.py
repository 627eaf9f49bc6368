"""The envelope every message between nodes travels in (announcements aside).

A routed call, each event of its reply stream (started, progress, log, sample and
elicit requests and their answers, result parts), a cancellation and each step of a
file transfer carry one header of routing facts (``Skilld-Meta``: canonical JSON with
the message's kind, the call id, the sending node ``from``, the target node ``to`` and,
for a call, the target's boot, the caller chain and depth) and a stamp
(``Skilld-Stamp``), and are sealed in one of two ways:

- **paired** (:meth:`Sealer.seal_to` with the receiver's payload key, the hot path):
  the payload is encrypted with ChaCha20-Poly1305 under the key the two nodes share
  (:class:`~skilld.package.BoxKey`: X25519 of their payload keys, HKDF), with a context
  string, the stamp and the routing facts as associated data. Only those two nodes hold
  that key, so a message that decrypts was made by the other one of them: it is
  authenticated (sender, target, call id, chain, kind, stamp, payload) and confidential
  at the cost of microseconds, with no signature per message. A message's sender is
  bound to its payload key by the ``Skilld-Box`` header: the key, signed once per boot
  with the node's Ed25519 key (a key the receiver's trust set holds for that node name);
  a receiver verifies each such certificate once and remembers it.
- **signed** (:meth:`Sealer.seal`, when the receiver's payload key is unknown): the
  sender's Ed25519 signature over a context string, the stamp, the routing facts and
  the sha256 of the payload (sent as it is), made by :func:`skilld.cluster._announce.
  sign` and verified with :func:`~skilld.cluster._announce.check_bytes`.

Either way the receiver checks that the node may be spoken for by that key (the
``cluster`` patterns of its trust file), that ``to`` is itself, and takes the stamp
through the node's one :class:`~skilld.cluster._announce.Freshness` (shared with
membership), so each message is accepted once. Nothing from the bus is used before
:meth:`Opener.open` returns. Third parties never verify these messages (announcements,
which everyone verifies, stay signed): a pairwise key is enough.

A replay after the *receiver* restarted finds a window that remembers nothing; that is
why a call names the target's boot (the first half of the stamps the target signs its
announcements with): a call made for an earlier life of the holder is refused by the
next one (``stale``: sealed to the old life's key, it cannot even be read), and the
holder answers a signed ``restarted`` naming the :func:`digest` of the exact message it
got; the entry sends its call again for the new boot only when that digest is its own
call's (it never ran). The routing facts stay readable (the bus routes on subjects
anyway); arguments, results, relayed events and file bytes do not.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skilld import telemetry
from skilld.cluster import _announce
from skilld.cluster._config import NODE_RE
from skilld.cluster._wire import H_SIG, H_STAMP
from skilld.errors import ClusterError, SignatureError
from skilld.package import BoxKey, SigningKey, TrustedKey, TrustStore, verify_signature

CONTEXT = b"skilld-cluster-envelope-v1\0"
PAIR_CONTEXT = b"skilld-cluster-paired-v1\0"
BOX_CONTEXT = b"skilld-cluster-box-v1\0"
H_META = "Skilld-Meta"
H_BOX = "Skilld-Box"  # "<payload key> <key id> <signature>", all but the id in base64
MAX_META = 8192
_MAX_BOXES = 4096  # verified certificates remembered (one per node boot in practice)


@dataclass(frozen=True, slots=True)
class Opened:
    """A verified message: its routing facts and the node that sent it."""

    meta: dict[str, Any]
    sender: str
    boot: int  # the sender's boot (first half of its stamp)
    data: bytes  # the payload, decrypted when it was sealed for this node
    stale: bool = False  # made for another boot of this node: payload left unread
    box: bytes | None = None  # the sender's payload key (verified): answers are sealed to it
    digest: str = ""  # of a stale message: what this node's ``restarted`` answer names


def digest(headers: Mapping[str, str], data: bytes) -> str:
    """What identifies one message as it was sent: sha256 of its routing facts and payload."""
    meta = str(headers.get(H_META, "")).encode()
    return hashlib.sha256(meta + b"\0" + data).hexdigest()


def _signed(meta_json: bytes, data: bytes) -> bytes:
    return meta_json + b"\0" + hashlib.sha256(data).digest()


def _box_signed(node: str, box: bytes) -> bytes:
    return BOX_CONTEXT + node.encode() + b"\0" + box


class Sealer:
    """This node's side: seals what it sends, paired to the receiver's payload key when
    it knows it (:meth:`seal_to`), signed otherwise; one stamper for everything."""

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
        self._cert: str | None = None
        if box is not None:
            signature = key.sign(_box_signed(node, box.public_raw))
            self._cert = " ".join(
                (
                    base64.b64encode(box.public_raw).decode(),
                    key.key_id,
                    base64.b64encode(signature).decode(),
                )
            )

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
        """The headers and the payload to send: ``data`` encrypted under the key this
        node shares with the holder of payload key ``box`` (the stamp and routing facts
        its associated data), or signed and as it is without one.

        Raises:
            ClusterError: ``box`` is not a usable X25519 public key.
        """
        # The trace context is a routing fact: sealed with them, read once verified.
        full = {**meta, **telemetry.carrier(), "from": self.node}
        mine = self.box if box is not None else None
        if mine is not None:
            full["pair"] = 1
        meta_json = json.dumps(full, separators=(",", ":"), sort_keys=True).encode()
        stamp = self._stamper()
        if mine is not None and box is not None:
            try:
                data = mine.seal(box, data, PAIR_CONTEXT + stamp.encode() + b"\0" + meta_json)
            except SignatureError as exc:
                raise ClusterError(f"cannot encrypt to that node: {exc.message}") from exc
            headers = {H_STAMP: stamp}
        else:
            headers = _announce.sign(_signed(meta_json, data), self._key, stamp, CONTEXT)
        headers[H_META] = meta_json.decode()
        if self._cert is not None:
            headers[H_BOX] = self._cert
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
        # (node, Skilld-Box header) -> the payload key it certifies, once verified
        self._boxes: dict[tuple[str, str], bytes] = {}
        self._lock = threading.Lock()

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
        unread and its stamp not taken (a paired one was sealed to that boot's key: it
        cannot be read, nor authenticated, here), with the :func:`digest` to answer.

        Raises:
            ClusterError: no envelope; a key the trust set does not hold or that may not
                speak for the node it claims; a bad signature or certificate; a payload
                that does not decrypt under the pair's key; not addressed to this node;
                from another node than ``sender``; facts other than ``expect``; or a
                stamp seen before (a replay).
        """
        headers = headers or {}
        meta_text = headers.get(H_META, "")
        if not meta_text or len(meta_text) > MAX_META:
            raise ClusterError("an unsealed cluster message refused (no signed envelope)")
        paired = H_SIG not in headers
        cert = headers.get(H_BOX)
        if paired and cert is None:
            raise ClusterError(
                "unsigned cluster message refused (neither signed nor sealed with a "
                "certified payload key)"
            )
        meta_json = meta_text.encode()
        try:
            meta = json.loads(meta_json)
        except ValueError:
            raise ClusterError("a cluster envelope that is not JSON") from None
        if not isinstance(meta, dict):
            raise ClusterError("a cluster envelope that is not an object")
        claimed_by = meta.get("from")
        if not isinstance(claimed_by, str) or not NODE_RE.fullmatch(claimed_by):
            raise ClusterError(f"a cluster envelope from an invalid node name {claimed_by!r}")
        if paired and meta.get("pair") != 1:
            raise ClusterError(f"unsigned cluster message refused (claiming node {claimed_by!r})")
        peer = None if cert is None else self._certified(claimed_by, cert)
        if not paired:
            key = _announce.check_bytes(_signed(meta_json, data), headers, self._trust, CONTEXT)
            _may_speak(key, claimed_by)
        if meta.get("to") != self.node:
            raise ClusterError(
                f"a message from node {claimed_by!r} addressed to {meta.get('to')!r}, not to "
                f"this node ({self.node})"
            )
        if sender is not None and claimed_by != sender:
            raise ClusterError(
                f"a message from node {claimed_by!r} where only node {sender!r} may speak "
                f"(it did not start, or was not sent, this exchange)"
            )
        for name, value in expect.items():
            if meta.get(name) != value:
                raise ClusterError(
                    f"a message from node {claimed_by!r} for {name} {meta.get(name)!r}, "
                    f"not {value!r}"
                )
        stamp = _announce.parse_stamp(headers)
        if boot is not None and meta.get("boot") != boot:
            return Opened(meta, claimed_by, stamp[0], b"", True, peer, digest(headers, data))
        if paired:
            if self._box is None or peer is None:
                raise ClusterError(f"a paired message from node {claimed_by!r}: no payload key")
            aad = PAIR_CONTEXT + headers[H_STAMP].encode() + b"\0" + meta_json
            try:
                data = self._box.open(peer, data, aad)
            except SignatureError as exc:
                raise ClusterError(f"from node {claimed_by!r}: {exc.message}") from exc
        self._fresh.accept(claimed_by, stamp)
        return Opened(meta, claimed_by, stamp[0], data, False, peer)

    def _certified(self, node: str, cert: str) -> bytes:
        """The payload key ``cert`` certifies for ``node`` (verified once, then remembered).

        Raises:
            ClusterError: malformed, a key the trust set does not hold or that may not
                speak for ``node``, or a signature that does not verify.
        """
        known = self._boxes.get((node, cert))
        if known is not None:
            return known
        parts = cert.split(" ")
        if len(parts) != 3:
            raise ClusterError(f"a malformed payload key certificate from node {node!r}")
        try:
            box = base64.b64decode(parts[0], validate=True)
            signature = base64.b64decode(parts[2], validate=True)
        except (binascii.Error, ValueError):
            raise ClusterError(f"a payload key certificate from {node!r} not in base64") from None
        key = self._trust.get(parts[1])
        if key is None:
            raise ClusterError(
                f"a payload key certified by key {parts[1]}, which this node's trust set "
                "does not hold"
            )
        if len(box) != 32 or not verify_signature(
            key.public_raw, signature, _box_signed(node, box)
        ):
            raise ClusterError(f"the payload key certificate by key {key.name} does not verify")
        _may_speak(key, node)
        with self._lock:
            if len(self._boxes) >= _MAX_BOXES:
                self._boxes.clear()
            self._boxes[(node, cert)] = box
        return box


def _may_speak(key: TrustedKey, node: str) -> None:
    if not key.may_announce(node):
        raise ClusterError(
            f"key {key.name} ({key.key_id}) may not speak for node {node!r}",
            location=key.source or None,
        )


def claimed(headers: Mapping[str, str] | None) -> str:
    """The node an unverified message claims to come from (for the refusal's record)."""
    try:
        meta = json.loads((headers or {}).get(H_META, "") or "{}")
    except ValueError:
        return "?"
    sender = meta.get("from", "?") if isinstance(meta, dict) else "?"
    return str(sender)[:64]
