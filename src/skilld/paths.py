"""Where skilld's files are: the cache and state directories, the ABI and the skill SDK.

Imports nothing of skilld's and nothing heavy: ``skilld serve`` needs the cache's
location before it has imported the runtime, and the build needs it too.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path


def cache_dir() -> Path:
    """``$SKILLD_CACHE``, else ``~/.cache/skilld``: built components and native code."""
    return Path(os.environ.get("SKILLD_CACHE") or Path.home() / ".cache" / "skilld")


def state_dir(name: str) -> Path:
    """Where ``name``'s key-value state and audit log live unless ``--state-dir`` says.

    ``$SKILLD_STATE_DIR`` as it is (one place an operator chose, as the image does); else
    ``$XDG_STATE_HOME/skilld/NAME``, else ``~/.local/state/skilld/NAME``. ``name`` keeps
    apart what must not share notes: each served bundle (:func:`bundle_state_name`) and
    ``skilld call``.
    """
    if env := os.environ.get("SKILLD_STATE_DIR"):
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "skilld" / name


def bundle_state_name(bundle: Path) -> str:
    """The default state's name for a bundle: its directory's name and a digest of its path.

    Keyed by where the bundle is, not by its content, so that a rebuilt bundle in the same
    place keeps its state, while two bundles never see each other's.
    """
    where = Path(bundle).resolve()
    return f"{where.name}-{hashlib.sha256(str(where).encode()).hexdigest()[:12]}"


def wit_dir() -> Path:
    """The directory holding the skill ABI (``skilld:skill``) shipped with skilld."""
    return Path(__file__).resolve().parent / "wit"


def runner_dir() -> Path:
    """The CPython runner component's sources (``sandbox/pyrunner``: a skill built once)."""
    return Path(__file__).resolve().parent / "sandbox" / "pyrunner"


def sdk_dir() -> Path:
    """The ``skilld_sdk`` package copied into every Python skill (found, not imported)."""
    spec = importlib.util.find_spec("skilld_sdk")
    if spec is None or spec.origin is None:  # pragma: no cover - it ships with skilld
        raise ModuleNotFoundError("skilld_sdk is not installed beside skilld")
    return Path(spec.origin).resolve().parent
