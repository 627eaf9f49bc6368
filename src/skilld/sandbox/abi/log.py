"""``log``: guest messages to the host's log, never to the process's stdout."""

from __future__ import annotations

from skilld.call import MAX_LOG_LINES, CallContext
from skilld.sandbox.abi import Functions


def write(ctx: CallContext, level: str, message: str) -> None:
    """Keep one guest log line (bounded per call)."""
    if len(ctx.logs) < MAX_LOG_LINES:
        ctx.logs.append((level, message[:4096]))


FUNCTIONS: Functions = {"write": (write, "plain")}
