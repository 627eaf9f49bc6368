"""Property tests: no single flipped byte and no truncation of a package gets past verify."""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skilld.errors import PackageError
from skilld.package import SigningKey, TrustStore, build_package, trusted_key, verify_package
from support.packages import COMPONENT, META


@cache
def _fixture() -> tuple[bytes, TrustStore]:
    """One small valid package (two signatures, extra files) and a store trusting both keys."""
    keys = [SigningKey.generate(), SigningKey.generate()]
    data = build_package(
        META, COMPONENT, files={"SKILL.md": b"# Notes\n", "resources/a.txt": b"a"}, keys=keys
    )
    trust = TrustStore(
        tuple(trusted_key(f"k{i}", k.public_raw, ["notes"]) for i, k in enumerate(keys))
    )
    verify_package(data, trust)  # the unmodified package is valid
    return data, trust


@st.composite
def _flip(draw: st.DrawFn) -> bytes:
    data, _ = _fixture()
    at = draw(st.integers(0, len(data) - 1))
    mask = draw(st.integers(1, 255))
    out = bytearray(data)
    out[at] ^= mask
    return bytes(out)


@st.composite
def _truncate(draw: st.DrawFn) -> bytes:
    data, _ = _fixture()
    return data[: draw(st.integers(0, len(data) - 1))]


def _refused(data: bytes) -> None:
    _, trust = _fixture()
    with pytest.raises(PackageError):
        verify_package(data, trust)


_FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_SLOW = settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_FAST
@given(_flip())
def test_flipped_byte_refused(data: bytes) -> None:
    """Changing any one byte of a valid package makes verification fail (100 examples)."""
    _refused(data)


@_FAST
@given(_truncate())
def test_truncated_refused(data: bytes) -> None:
    """Cutting a valid package short at any point makes verification fail (100 examples)."""
    _refused(data)


@pytest.mark.slow
@_SLOW
@given(_flip())
def test_flipped_byte_refused_many(data: bytes) -> None:
    """Changing any one byte of a valid package makes verification fail (1,000 examples)."""
    _refused(data)


@pytest.mark.slow
@_SLOW
@given(_truncate())
def test_truncated_refused_many(data: bytes) -> None:
    """Cutting a valid package short at any point makes verification fail (1,000 examples)."""
    _refused(data)


def test_every_byte_and_every_cut_refused() -> None:
    """Exhaustively: each single-bit flip at every offset, and every truncation, is refused."""
    data, trust = _fixture()
    for at in range(len(data)):
        for cut in (data[:at], data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]):
            with pytest.raises(PackageError):
                verify_package(cut, trust)
