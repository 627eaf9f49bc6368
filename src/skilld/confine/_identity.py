"""Which uids a skill's confined processes run as: a uid per call, a group per skill.

The range is ``SKILLD_SKILL_UIDS`` (``FIRST`` or ``FIRST-LAST``; default
``200000-265535``): uids that own nothing on the host, outside the ones any distribution
hands out (and outside the image's ``skilld`` user, 10001). It is cut into slots of
:data:`SLOT` (64) uids. Slot 0 (from ``FIRST``) is for commands run for no particular
skill; a skill's slot is ``1 + sha256(skill id) mod (slots - 1)``, and its number, the
first uid of its slot (``FIRST + 64 * slot``), is the skill's **group** and the owner an
operator gives its read-write grants (``skilld doctor`` prints it): ``chown -R N:N`` and
``chmod -R g+rwX``. No process ever runs as that number. Each call of the skill runs as
one of the 63 other uids of the slot, taken for the call and given back when its whole
tree is gone (:func:`take`, :func:`give_back`), with the skill's group as its gid and
no supplementary group: concurrent calls never share a uid, so the kernel's own
permission checks keep one call's processes from another's (signals, rlimits,
priorities, ``/proc``, files), and what a call leaves in the skill's grants is shared
through the group. A collision moves the later skill to the next free slot: two skills
never share a slot, so a uid never serves two skills.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

from skilld.errors import ConfinementUnavailable

RANGE_ENV = "SKILLD_SKILL_UIDS"
DEFAULT_RANGE = (200_000, 265_535)
# Uids per skill: its group's number, then one uid per concurrent call.
SLOT = 64

_lock = threading.Lock()
_by_skill: dict[str | None, int] = {}
_taken: dict[int, str | None] = {}
# Call uids in use, by the skill's number; a change wakes the calls waiting for one.
_busy: dict[int, set[int]] = {}
_freed = threading.Condition(_lock)


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
    if last - first + 1 < 2 * SLOT or last >= 2**32 - 1:
        raise _bad(
            f"{RANGE_ENV} gives {first}-{last}: at least {2 * SLOT} uids below 2^32-1 are "
            f"needed (slots of {SLOT}: one for commands of no skill, one per skill)"
        )
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
    """The number of ``skill`` (``None``: no skill): its group, the owner of its grants,
    the first uid of its slot; its calls run as the slot's other uids (:func:`take`).

    Raises:
        ConfinementUnavailable: the range is unusable (see :func:`uid_range`) or full.
    """
    first, last = uid_range(forbidden)
    with _lock:
        known = _by_skill.get(skill)
        if known is not None and first <= known and known + SLOT - 1 <= last:
            return known
        if skill is None:
            base = first
        else:
            slots = (last - first + 1) // SLOT - 1
            digest = int.from_bytes(hashlib.sha256(skill.encode()).digest()[:8], "big")
            slot = digest % slots
            for step in range(slots):
                base = first + SLOT * (1 + (slot + step) % slots)
                if _taken.get(base, skill) == skill:
                    break
            else:
                raise _bad(f"all {slots} slots are taken by other skills")
        _by_skill[skill] = base
        _taken[base] = skill
        return base


def take(base: int, deadline: float, cancelled: Callable[[], bool] | None = None) -> int | None:
    """A uid of the slot ``base`` for one call, none of whose other calls holds it; when
    all are held, waits for one until ``deadline`` (``time.monotonic()``) or
    ``cancelled()``: ``None`` then. Give it back with :func:`give_back` once the call's
    whole tree is gone."""
    with _freed:
        busy = _busy.setdefault(base, set())
        while True:
            for uid in range(base + 1, base + SLOT):
                if uid not in busy:
                    busy.add(uid)
                    return uid
            left = deadline - time.monotonic()
            if left <= 0 or (cancelled is not None and cancelled()):
                return None
            _freed.wait(min(left, 0.05))


def give_back(base: int, uid: int) -> None:
    """The call that ran as ``uid`` (of slot ``base``) is over: nothing of it runs."""
    with _freed:
        _busy.get(base, set()).discard(uid)
        _freed.notify()


def assign(skills: list[str], forbidden: tuple[int, ...] = ()) -> dict[str, int]:
    """Give each of ``skills`` its uid, in sorted order (so that collisions resolve the
    same way at every start); the skill → uid table.

    Raises:
        ConfinementUnavailable: see :func:`uid_for`.
    """
    return {skill: uid_for(skill, forbidden) for skill in sorted(skills)}


def unwritable(path: str, uid: int) -> str | None:
    """Why the calls of the skill numbered ``uid`` (its group; each call runs as a uid of
    its own in that group) cannot write in the directory ``path``, naming its owner and
    mode and what to do; ``None`` when they can or the path does not exist (a grant that
    is not there gives nothing to write to either)."""
    try:
        info = Path(path).lstat()
    except OSError:
        return None
    mode = stat.S_IMODE(info.st_mode)
    # No call runs as the owner: the group's bits, or the others', are what count.
    bits = 0o030 if info.st_gid == uid else 0o003
    if mode & bits == bits:
        return None
    return (
        f"the read-write grant {path} is owned by uid {info.st_uid} gid {info.st_gid} with "
        f"mode {mode:04o}: the skill's commands (its number, group and uid {uid}; each call "
        f"runs as one of uids {uid + 1}-{uid + SLOT - 1} in that group) cannot write there "
        f"(chown -R {uid}:{uid} {path} && chmod -R g+rwX {path})"
    )
