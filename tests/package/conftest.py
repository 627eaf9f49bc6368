"""Fixtures for package tests: fresh keys, trust stores and packages."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from skilld.package import SigningKey, TrustStore, build_package, trusted_key
from support.packages import COMPONENT, META


@pytest.fixture
def key() -> SigningKey:
    """A fresh signing key."""
    return SigningKey.generate()


@pytest.fixture
def trust(key: SigningKey) -> TrustStore:
    """A trust store holding ``key``, which may sign ``notes``."""
    return TrustStore((trusted_key("alice", key.public_raw, ["notes"]),))


@pytest.fixture
def package(key: SigningKey) -> bytes:
    """A valid package of ``notes`` signed by ``key``, with a SKILL.md and a resource."""
    return build_package(
        META,
        COMPONENT,
        files={"SKILL.md": b"# Notes\n", "resources/help.txt": b"help"},
        keys=[key],
    )


@pytest.fixture
def make_trust() -> Callable[..., TrustStore]:
    """Build a trust store from (name, key, scope[, thresholds]) tuples."""

    def make(*specs: tuple[Any, ...]) -> TrustStore:
        keys = []
        for spec in specs:
            name, k, scope, *rest = spec
            keys.append(
                trusted_key(name, k.public_raw, scope, thresholds=rest[0] if rest else None)
            )
        return TrustStore(tuple(keys))

    return make
