"""Moved to ``support.env``; kept so that branches written against the old name still run.

Import from ``support.env`` (the lead deletes this module once every branch is merged).
"""

from support.env import ROOT, SKILLS, cache_dir, cache_env

__all__ = ["ROOT", "SKILLS", "cache_dir", "cache_env"]
