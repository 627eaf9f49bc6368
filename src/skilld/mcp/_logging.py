"""skilld's own log: one JSON object per line, on stderr or in a file, never on stdout."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

from skilld.mcp._config import ServeConfig


def make_logger(
    config: ServeConfig, stream: TextIO | None = None
) -> structlog.typing.FilteringBoundLogger:
    """A structlog logger writing JSON lines at ``config.log_level`` and above.

    Built without touching structlog's global configuration, so that other
    packages (the audit sink) keep theirs.

    Raises:
        OSError: the log file cannot be opened for appending.
    """
    if stream is None:
        # Kept open for the life of the process: the log outlives any one server run.
        stream = open(config.log_file, "a", buffering=1) if config.log_file else sys.stderr  # noqa: SIM115
    level = logging.getLevelNamesMapping()[config.log_level.upper()]
    logger: structlog.typing.FilteringBoundLogger = structlog.wrap_logger(
        structlog.PrintLogger(stream),
        wrapper_class=structlog.make_filtering_bound_logger(level),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.dict_tracebacks,
            structlog.processors.JSONRenderer(),
        ],
        cache_logger_on_first_use=True,
    )
    return logger.bind(component="mcp")
