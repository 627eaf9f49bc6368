"""Ed25519 keys: generating, storing, loading, signing and checking signatures.

The one module that touches ``cryptography`` for keys; its exceptions become
:class:`~skilld.errors.SignatureError` or :class:`~skilld.errors.UsageError` here.
A key is known by its *key id*: the first 16 hex digits of the sha256 of its raw
32-byte public key. Private keys are PKCS#8 PEM files, optionally encrypted with
a passphrase, written with mode 0600 and never over an existing file.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from skilld.errors import SignatureError, UsageError
from skilld.paths import read_private

PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
MAX_KEY_FILE = 64 * 1024


def key_id(public_raw: bytes) -> str:
    """The key id of a raw Ed25519 public key: 16 hex digits of its sha256."""
    return hashlib.sha256(public_raw).hexdigest()[:16]


def b64encode(data: bytes) -> str:
    """Standard base64 with padding, as every skilld file spells binary values."""
    return base64.b64encode(data).decode("ascii")


def b64decode_exact(text: object, what: str, size: int) -> bytes:
    """Decode base64 that must be canonical (re-encodes to itself) and ``size`` bytes long.

    Canonical means no whitespace, padding present, unused bits zero: two spellings
    of the same bytes would let a byte of a signed file change unnoticed.

    Raises:
        SignatureError: not a string, not canonical base64, or the wrong length.
    """
    if not isinstance(text, str):
        raise SignatureError(f"{what} must be a base64 string")
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise SignatureError(f"{what} is not valid base64: {exc}") from exc
    if b64encode(raw) != text:
        raise SignatureError(f"{what} is not canonical base64")
    if len(raw) != size:
        raise SignatureError(f"{what} must be {size} bytes, got {len(raw)}")
    return raw


@functools.lru_cache(maxsize=256)
def _public_key(public_raw: bytes) -> Ed25519PublicKey:
    # Loading the key is a third of a verification: a cluster node verifies every
    # message between nodes against the few keys of its trust set.
    return Ed25519PublicKey.from_public_bytes(public_raw)


def verify_signature(public_raw: bytes, signature: bytes, data: bytes) -> bool:
    """True when ``signature`` is a valid Ed25519 signature of ``data`` by ``public_raw``."""
    try:
        _public_key(public_raw).verify(signature, data)
    except (InvalidSignature, ValueError):
        return False
    return True


def check_public_key(public_raw: bytes) -> None:
    """Refuse bytes that are not an Ed25519 public key.

    Raises:
        SignatureError: not 32 bytes, or rejected by the Ed25519 implementation.
    """
    try:
        Ed25519PublicKey.from_public_bytes(public_raw)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise SignatureError(f"not an Ed25519 public key: {exc}") from exc


@dataclass(frozen=True, slots=True, repr=False)
class SigningKey:
    """An Ed25519 private key with its public half and key id (never printed by repr)."""

    _private: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> SigningKey:
        """A fresh key from the operating system's random source."""
        return cls(Ed25519PrivateKey.generate())

    @property
    def public_raw(self) -> bytes:
        """The raw 32-byte public key."""
        return self._private.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    @property
    def public_b64(self) -> str:
        """The public key in base64, as trust files hold it."""
        return b64encode(self.public_raw)

    @property
    def key_id(self) -> str:
        """16 hex digits of the sha256 of the raw public key."""
        return key_id(self.public_raw)

    def sign(self, data: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``data`` (deterministic for a key and data)."""
        return self._private.sign(data)

    def private_pem(self, passphrase: bytes | None = None) -> bytes:
        """PKCS#8 PEM, encrypted with ``passphrase`` when one is given."""
        encryption: serialization.KeySerializationEncryption = (
            serialization.BestAvailableEncryption(passphrase)
            if passphrase
            else serialization.NoEncryption()
        )
        return self._private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
        )

    def __repr__(self) -> str:
        return f"SigningKey(key_id={self.key_id!r})"


def write_private_key(
    key: SigningKey, path: Path, *, passphrase: bytes | None = None, force: bool = False
) -> None:
    """Write ``key`` as PEM to ``path`` with mode 0600, created with that mode.

    Raises:
        UsageError: ``path`` exists (and ``force`` is false) or cannot be written.
    """
    pem = key.private_pem(passphrase)
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    flags |= os.O_TRUNC if force else os.O_EXCL
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError as exc:
        raise UsageError(
            f"{path} exists; refusing to overwrite a key", hint="pass --force to replace it"
        ) from exc
    except OSError as exc:
        raise UsageError(f"cannot write key {path}: {exc.strerror}") from exc
    try:
        os.fchmod(fd, 0o600)  # O_TRUNC on an existing file keeps its old mode
        with os.fdopen(fd, "wb", closefd=False) as fh:
            fh.write(pem)
            fh.flush()
            os.fsync(fd)
    finally:
        os.close(fd)


def load_private_key(path: Path, *, passphrase: bytes | None = None) -> SigningKey:
    """Read an Ed25519 private key written by :func:`write_private_key` (or OpenSSL).

    Raises:
        UsageError: unreadable, readable by other users (``skilld.paths.read_private``),
            not an Ed25519 PEM key, encrypted without a passphrase given, or the
            passphrase is wrong.
    """
    pem = read_private(path, "private key")
    if len(pem) > MAX_KEY_FILE:
        raise UsageError(f"{path} is too large to be a key file")
    try:
        private = serialization.load_pem_private_key(pem, password=passphrase or None)
    except TypeError as exc:
        hint = "give --passphrase-env or --passphrase-file" if not passphrase else None
        raise UsageError(f"{path}: {exc}", hint=hint) from exc
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise UsageError(
            f"{path}: not a readable private key (wrong passphrase, or not PEM): {exc}"
        ) from exc
    if not isinstance(private, Ed25519PrivateKey):
        raise UsageError(f"{path}: not an Ed25519 key ({type(private).__name__})")
    return SigningKey(private)
