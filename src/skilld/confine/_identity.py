"""Which uid each skill's confined processes run as: one per skill, from a configured range.

The range is ``SKILLD_SKILL_UIDS`` (``FIRST`` or ``FIRST-LAST``; default
``200000-265535``): uids that own nothing on the host, outside the ones any distribution
hands out (and outside the image's ``skilld`` user, 10001). ``FIRST`` itself is the
identity of commands run for no particular skill; a skill's uid is ``FIRST + 1 +
sha256(skill id) mod (size - 1)``, so an operator can compute it (``skilld doctor``
prints it) and ``chown`` the skill's read-write grants to it. A collision with another
skill of this process moves the later skill to the next free uid: two skills never share
a uid. The gid is the same number; supplementary groups are none.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from pathlib import Path

from skilld.errors import ConfinementUnavailable

RANGE_ENV = "SKILLD_SKILL_UIDS"
DEFAULT_RANGE = (200_000, 265_535)

_lock = threading.Lock()
_by_skill: dict[str | None, int] = {}
_taken: dict[int, str | None] = {}


def uid_range(forbidden: tuple[int, ...] = ()) -> tuple[int, int]:
    """The configured (first, last) uids, both included.

    Raises:
        ConfinementUnavailable: the setting is malformed, smaller than two uids, or
            contains root, skilld's own uid or one of ``forbidden``.
    """
    text = os.environ.get(RANGE_ENV, "").strip()
    if not text:
        first, last = DEFAULT_RANGE
    else:
        lo, _, hi = text.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise _bad(f"{RANGE_ENV}={text!r} is not FIRST or FIRST-LAST")
        first = int(lo)
        last = int(hi) if hi else first + DEFAULT_RANGE[1] - DEFAULT_RANGE[0]
    if last - first < 1 or last >= 2**32 - 1:
        raise _bad(f"{RANGE_ENV} gives {first}-{last}: at least two uids below 2^32-1 are needed")
    for uid in (0, os.geteuid(), os.getuid(), *forbidden):
        if first <= uid <= last:
            raise _bad(f"{RANGE_ENV} range {first}-{last} contains uid {uid} (root or skilld's)")
    return first, last


def _bad(detail: str) -> ConfinementUnavailable:
    return ConfinementUnavailable(
        f"the skills' uid range is unusable: {detail}",
        feature="identity",
        hint=f"set {RANGE_ENV} to a range of uids that own no file, e.g. 200000-265535",
    )


def uid_for(skill: str | None, forbidden: tuple[int, ...] = ()) -> int:
    """The uid (and gid) ``skill``'s confined processes run as (``None``: no skill).

    Raises:
        ConfinementUnavailable: the range is unusable (see :func:`uid_range`) or full.
    """
    first, last = uid_range(forbidden)
    with _lock:
        known = _by_skill.get(skill)
        if known is not None and first <= known <= last:
            return known
        if skill is None:
            uid = first
        else:
            size = last - first
            digest = int.from_bytes(hashlib.sha256(skill.encode()).digest()[:8], "big")
            slot = digest % size
            for step in range(size):
                uid = first + 1 + (slot + step) % size
                if _taken.get(uid, skill) == skill:
                    break
            else:
                raise _bad(f"all {size} uids are taken by other skills")
        _by_skill[skill] = uid
        _taken[uid] = skill
        return uid


def assign(skills: list[str], forbidden: tuple[int, ...] = ()) -> dict[str, int]:
    """Give each of ``skills`` its uid, in sorted order (so that collisions resolve the
    same way at every start); the skill → uid table.

    Raises:
        ConfinementUnavailable: see :func:`uid_for`.
    """
    return {skill: uid_for(skill, forbidden) for skill in sorted(skills)}


def unwritable(path: str, uid: int) -> str | None:
    """Why ``uid`` (with gid ``uid``, no other group) cannot write in the directory
    ``path``, naming its owner and mode and what to do; ``None`` when it can or the path
    does not exist (a grant that is not there gives nothing to write to either)."""
    try:
        info = Path(path).lstat()
    except OSError:
        return None
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid == uid:
        bits = 0o300
    elif info.st_gid == uid:
        bits = 0o030
    else:
        bits = 0o003
    if mode & bits == bits:
        return None
    return (
        f"the read-write grant {path} is owned by uid {info.st_uid} gid {info.st_gid} with "
        f"mode {mode:04o}: commands running as uid {uid} cannot write there "
        f"(chown -R {uid}:{uid} {path})"
    )
