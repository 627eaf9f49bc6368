"""Defaults and small helpers shared by the command modules."""

from __future__ import annotations

import json
from typing import Any

from skilld.errors import UsageError


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
