"""Moved to ``support.bundle``; kept so that branches written against the old name still run.

Import from ``support.bundle`` (the lead deletes this module once every branch is merged).
"""

from support.bundle import build

__all__ = ["build"]
