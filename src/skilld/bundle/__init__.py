"""``skilld build`` and strict bundle loading.

A bundle is a read-only directory: ``bundle.lock`` (see ``_lock.py``), the signed
packages, native code per skill, the compiled policy tables and the trust set
they were verified against. ``open_bundle`` checks all of it before any byte
reaches the wasm engine.
"""

from typing import TYPE_CHECKING, Any

from skilld.bundle._lock import (
    FORMAT,
    LOCK,
    LOCK_SIG,
    Lock,
    LockedAgentSkill,
    LockedRunner,
    LockedSkill,
    LockedSource,
    canonical_json,
    prehash_bundle,
)

if TYPE_CHECKING:
    from skilld.bundle._build import (
        BuildResult,
        build_bundle,
        sign_lock,
        verify_lock_signature,
    )
    from skilld.bundle._kinds import BuildOptions
    from skilld.bundle._load import LoadedBundle, open_bundle

_BUILD = ("BuildResult", "build_bundle", "sign_lock", "verify_lock_signature")
_LOAD = ("LoadedBundle", "open_bundle")


def __getattr__(name: str) -> Any:
    # The build side pulls in the package toolchain (cryptography, componentize) and
    # the load side the wasm engine; ``skilld serve`` starts hashing the bundle
    # (``prehash_bundle``) before it pays for either, so both load on first use.
    if name in _BUILD:
        from skilld.bundle import _build

        return getattr(_build, name)
    if name == "BuildOptions":
        from skilld.bundle import _kinds

        return _kinds.BuildOptions
    if name in _LOAD:
        from skilld.bundle import _load

        return getattr(_load, name)
    raise AttributeError(f"module 'skilld.bundle' has no attribute {name!r}")


__all__ = [
    "FORMAT",
    "LOCK",
    "LOCK_SIG",
    "BuildOptions",
    "BuildResult",
    "LoadedBundle",
    "Lock",
    "LockedAgentSkill",
    "LockedRunner",
    "LockedSkill",
    "LockedSource",
    "build_bundle",
    "canonical_json",
    "open_bundle",
    "prehash_bundle",
    "sign_lock",
    "verify_lock_signature",
]
