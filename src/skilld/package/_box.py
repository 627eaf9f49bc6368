"""Payload encryption between cluster nodes: X25519 agreement, ChaCha20-Poly1305.

Each node makes a :class:`BoxKey` when it starts (in memory only, never written) and
announces its public half, signed with the rest of its announcement. Two nodes derive
one key per pair with HKDF-SHA256 over the X25519 shared secret and both public keys
(cached: one agreement per peer and boot), and seal each payload with a fresh random
nonce, the routing facts as associated data. Only the two nodes of a message can read it.
"""

from __future__ import annotations

import functools
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from skilld.errors import SignatureError

_INFO = b"skilld-cluster-payload-v1"
_NONCE = 12


class BoxKey:
    """This node's X25519 key for payloads (``public_raw`` is announced)."""

    def __init__(self) -> None:
        self._private = X25519PrivateKey.generate()
        self.public_raw = self._private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self._pair = functools.lru_cache(maxsize=1024)(self._derive)

    def _derive(self, peer_raw: bytes) -> ChaCha20Poly1305:
        try:
            shared = self._private.exchange(X25519PublicKey.from_public_bytes(peer_raw))
        except ValueError as exc:
            raise SignatureError(f"not an X25519 public key: {exc}") from exc
        low, high = sorted((self.public_raw, peer_raw))
        key = HKDF(hashes.SHA256(), 32, salt=None, info=_INFO + low + high).derive(shared)
        return ChaCha20Poly1305(key)

    def seal(self, peer_raw: bytes, data: bytes, aad: bytes) -> bytes:
        """``data`` for the holder of ``peer_raw`` only: nonce, then ciphertext and tag.

        Raises:
            SignatureError: ``peer_raw`` is not an X25519 public key.
        """
        nonce = os.urandom(_NONCE)
        return nonce + self._pair(peer_raw).encrypt(nonce, data, aad)

    def open(self, peer_raw: bytes, blob: bytes, aad: bytes) -> bytes:
        """What :meth:`seal` of the holder of ``peer_raw`` sealed for this key.

        Raises:
            SignatureError: not sealed for this key by that peer, or changed.
        """
        try:
            return self._pair(peer_raw).decrypt(blob[:_NONCE], blob[_NONCE:], aad)
        except (InvalidTag, ValueError) as exc:
            raise SignatureError("a payload that does not decrypt for this node") from exc
