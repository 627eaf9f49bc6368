"""NATS NKeys for user seeds: encode, decode, public key and signature, on ``cryptography``.

An NKey is an Ed25519 key in NATS' text form: base32 (no padding) of a prefix, the key
and a CRC-16/XMODEM of both, little-endian. A user seed reads ``SU...`` (two prefix bytes:
the seed's and the user's), a user's public key ``U...``. nats-server challenges a client
with a nonce; the client answers with the Ed25519 signature of it (base64).

Why our own: the ``nkeys`` package on PyPI is a source distribution only (no wheel), so
neither the flake's pinned wheels nor an offline wheelhouse can carry it, and it pulls in
PyNaCl for what ``cryptography`` (already a dependency) does. :data:`NATS_MODULE` has the
shape nats-py's client imports as ``nkeys`` for ``connect(nkeys_seed_str=...)``.
"""

from __future__ import annotations

import base64
import binascii
import types

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from skilld.errors import PackageError

PREFIX_BYTE_SEED = 18 << 3  # "S..."
PREFIX_BYTE_USER = 20 << 3  # "U..."


def _crc16(data: bytes) -> int:
    """CRC-16/XMODEM (polynomial 0x1021, initial 0), as NATS' ``crc16``."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def _encode(raw: bytes) -> bytes:
    return base64.b32encode(raw + _crc16(raw).to_bytes(2, "little")).rstrip(b"=")


def _decode(text: bytes) -> bytes:
    """The raw bytes of an encoded key, its checksum verified.

    Raises:
        PackageError: not base32, too short, or the checksum does not match.
    """
    try:
        raw = base64.b32decode(bytes(text) + b"=" * (-len(text) % 8))
    except (binascii.Error, ValueError):
        raise PackageError("an NKey is not base32") from None
    if len(raw) < 4 or _crc16(raw[:-2]) != int.from_bytes(raw[-2:], "little"):
        raise PackageError("an NKey's checksum does not match")
    return raw[:-2]


def encode_seed(seed: bytes, prefix: int = PREFIX_BYTE_USER) -> bytes:
    """The text form of a 32-byte Ed25519 seed for a ``prefix`` key (a user by default)."""
    if len(seed) != 32:
        raise PackageError("an NKey seed is 32 bytes")
    head = bytes([PREFIX_BYTE_SEED | (prefix >> 5), (prefix & 31) << 3])
    return _encode(head + seed)


class KeyPair:
    """A user NKey from its seed (``from_seed``): ``public_key``, ``sign``, ``wipe``."""

    def __init__(self, seed: bytes, prefix: int):
        self._key: Ed25519PrivateKey | None = Ed25519PrivateKey.from_private_bytes(seed)
        raw = self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.public_key: bytes = _encode(bytes([prefix]) + raw)

    def sign(self, data: bytes) -> bytes:
        """The raw Ed25519 signature of ``data``.

        Raises:
            PackageError: the key was wiped.
        """
        if self._key is None:
            raise PackageError("this NKey was wiped")
        return self._key.sign(bytes(data))

    def wipe(self) -> None:
        """Drop the private key (``cryptography`` holds it; this forgets our reference)."""
        self._key = None


def from_seed(text: bytes | bytearray | str) -> KeyPair:
    """The key pair of an encoded seed (``SU...``).

    Raises:
        PackageError: not a seed, or not a valid encoding.
    """
    raw = _decode(text.encode() if isinstance(text, str) else bytes(text).strip())
    if len(raw) != 34 or raw[0] & 0xF8 != PREFIX_BYTE_SEED:
        raise PackageError("not an NKey seed (it should read 'S...')")
    prefix = ((raw[0] & 7) << 5) | ((raw[1] & 0xF8) >> 3)
    return KeyPair(raw[2:], prefix)


# What nats-py's client imports as ``nkeys`` (``from_seed``, then ``public_key``,
# ``sign`` and ``wipe``): skilld.cluster registers it when the package is absent.
NATS_MODULE = types.ModuleType("nkeys")
NATS_MODULE.from_seed = from_seed  # type: ignore[attr-defined]
NATS_MODULE.encode_seed = encode_seed  # type: ignore[attr-defined]
NATS_MODULE.PREFIX_BYTE_USER = PREFIX_BYTE_USER  # type: ignore[attr-defined]
