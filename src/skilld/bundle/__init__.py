"""``skilld build`` and strict bundle loading.

A bundle is a read-only directory: ``bundle.lock`` (see ``_lock.py``), the signed
packages, native code per skill, the compiled policy tables and the trust set
they were verified against. ``open_bundle`` checks all of it before any byte
reaches the wasm engine.
"""

from skilld.bundle._build import BuildResult, build_bundle, sign_lock, verify_lock_signature
from skilld.bundle._load import LoadedBundle, open_bundle
from skilld.bundle._lock import FORMAT, LOCK, LOCK_SIG, Lock, LockedSkill, canonical_json

__all__ = [
    "FORMAT",
    "LOCK",
    "LOCK_SIG",
    "BuildResult",
    "LoadedBundle",
    "Lock",
    "LockedSkill",
    "build_bundle",
    "canonical_json",
    "open_bundle",
    "sign_lock",
    "verify_lock_signature",
]
