"""Defaults and small helpers shared by the command modules."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from skilld.errors import UsageError


def state_dir_default() -> Path:
    """``$SKILLD_STATE_DIR``, else ``$XDG_STATE_HOME/skilld``, else ``~/.local/state/skilld``."""
    if env := os.environ.get("SKILLD_STATE_DIR"):
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "skilld"


def cache_dir_default() -> Path:
    """``$SKILLD_CACHE`` or ``~/.cache/skilld``."""
    from skilld.package.build import default_cache_dir

    return default_cache_dir()


def parse_json_object(text: str, what: str) -> dict[str, Any]:
    """Parse a JSON object given on the command line.

    Raises:
        UsageError: not JSON, or not an object.
    """
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise UsageError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value
