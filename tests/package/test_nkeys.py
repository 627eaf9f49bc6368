"""NATS NKeys on cryptography: the text forms nats-server and the ``nkeys`` package use."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from skilld.errors import PackageError
from skilld.package import nkeys

# Made with the PyPI ``nkeys`` package 0.2.1 and checked against this module: the seed
# bytes 0..31 as a user seed, its public key, and the signature of b"nonce".
SEED = b"SUAAAAICAMCAKBQHBAEQUCYMBUHA6EARCIJRIFIWC4MBSGQ3DQOR4H776Y"
PUBLIC = b"UAB2CB576PHBBPQ5ODORRZ2LYCMWPZGWGCN2KDK7DXOIMZASKUY3RLKK"
SIGNATURE = bytes.fromhex(
    "f874eae1de830c754d6fc32c4d1019b5221ad2f5c0ff2b996e5c1303b253e706"
    "3398a071276c2961f8c787b85ca6d66589d6d5c3fe992f2b9b8e6ff20e4f8e09"
)


def test_a_user_seed_encodes_signs_and_names_its_public_key_as_nats_does() -> None:
    """The seed, public key and signature match the reference implementation's."""
    assert nkeys.encode_seed(bytes(range(32))) == SEED
    pair = nkeys.from_seed(bytearray(SEED))
    assert pair.public_key == PUBLIC
    assert pair.sign(b"nonce") == SIGNATURE


def test_a_wiped_key_signs_nothing() -> None:
    """After wipe() (as nats-py calls it) the pair refuses to sign."""
    pair = nkeys.from_seed(SEED)
    pair.wipe()
    with pytest.raises(PackageError):
        pair.sign(b"nonce")


def test_a_changed_character_breaks_the_checksum() -> None:
    """One character changed in a seed is refused, never a different key."""
    changed = SEED[:10] + (b"A" if SEED[10:11] != b"A" else b"B") + SEED[11:]
    with pytest.raises(PackageError):
        nkeys.from_seed(changed)


@given(st.binary(max_size=80))
def test_any_text_is_a_seed_or_a_clear_error(text: bytes) -> None:
    """Arbitrary bytes end as a key pair or a PackageError, nothing else."""
    with contextlib.suppress(PackageError):
        nkeys.from_seed(text)
