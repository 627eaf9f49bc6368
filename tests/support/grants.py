"""Giving a skill its read-write grants, as an operator does (docs/confinement.md)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from skilld import confine


def give_grant(paths: Iterable[Path], skill: str | None) -> int:
    """Make each of ``paths`` the skill's: owned by its number (uid and group) and
    writable by its group (each call runs as a uid of its own in that group), as
    ``chown -R N:N`` and ``chmod -R g+rwX`` do; links are chowned, not followed. The
    skill's number."""
    number = confine.uid_for(skill)
    for path in paths:
        os.chown(path, number, number, follow_symlinks=False)
        info = path.lstat()
        if not stat.S_ISLNK(info.st_mode):
            extra = 0o070 if stat.S_ISDIR(info.st_mode) else 0o060
            path.chmod(stat.S_IMODE(info.st_mode) | extra)
    return number


def give_grant_tree(root: Path, skill: str | None) -> int:
    """:func:`give_grant` ``root`` and everything beneath it."""
    return give_grant([root, *root.rglob("*")], skill)
