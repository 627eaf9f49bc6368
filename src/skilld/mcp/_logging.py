"""skilld's own log: one line per event, on stderr or in a file, never on stdout.

JSON objects for machines; for a person at a terminal, ``skilld: LEVEL: EVENT key=value``.
One stream carries one of the two, never both.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

from skilld.mcp._config import ServeConfig

Logger = structlog.typing.FilteringBoundLogger


def make_logger(config: ServeConfig, stream: TextIO | None = None) -> Logger:
    """A structlog logger writing ``config.log_format`` lines at ``config.log_level`` and above.

    Built without touching structlog's global configuration, so that other
    packages (the audit sink) keep theirs.

    Raises:
        OSError: the log file cannot be opened for appending.
    """
    if stream is None:
        # Kept open for the life of the process: the log outlives any one server run.
        stream = open(config.log_file, "a", buffering=1) if config.log_file else sys.stderr  # noqa: SIM115
    level = logging.getLevelNamesMapping()[config.log_level.upper()]
    logger: Logger = structlog.wrap_logger(
        structlog.PrintLogger(stream),
        wrapper_class=structlog.make_filtering_bound_logger(level),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.dict_tracebacks,
            structlog.processors.JSONRenderer() if config.log_format == "json" else render_text,
        ],
        cache_logger_on_first_use=True,
    )
    return logger.bind(component="mcp")


def render_text(_logger: object, _name: str, event: structlog.typing.EventDict) -> str:
    """``skilld: LEVEL: EVENT key=value ...``: one line a person reads (a structlog renderer)."""
    level = event.pop("level", "info")
    message = event.pop("event", "")
    for quiet in ("timestamp", "component"):
        event.pop(quiet, None)
    fields = " ".join(f"{key}={value}" for key, value in event.items())
    return f"skilld: {level}: {message}" + (f" {fields}" if fields else "")
