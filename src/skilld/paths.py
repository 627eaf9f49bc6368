"""Where skilld keeps its files when not told otherwise: the cache and the state directory.

Imports nothing of skilld's and nothing heavy: ``skilld serve`` needs the cache's
location before it has imported the runtime, and the build needs it too.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$SKILLD_CACHE``, else ``~/.cache/skilld``: built components and native code."""
    return Path(os.environ.get("SKILLD_CACHE") or Path.home() / ".cache" / "skilld")


def state_dir() -> Path:
    """``$SKILLD_STATE_DIR``, else ``$XDG_STATE_HOME/skilld``, else ``~/.local/state/skilld``."""
    if env := os.environ.get("SKILLD_STATE_DIR"):
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "skilld"
