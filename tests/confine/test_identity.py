"""The uids of a skill's calls: a slot per skill, a uid per running call."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from skilld import confine
from skilld.confine import _identity
from skilld.confine._identity import SLOT


def test_skills_get_disjoint_slots_and_calls_distinct_uids() -> None:
    """Two skills' slots never overlap; running calls of one skill never share a uid, and
    none runs as the skill's number (its group, the owner of its grants)."""
    a, b = confine.uid_for("slot-a"), confine.uid_for("slot-b")
    assert a % SLOT == b % SLOT == confine.uid_for(None) % SLOT
    assert abs(a - b) >= SLOT
    taken = [_identity.take(a, time.monotonic() + 1) for _ in range(SLOT - 1)]
    try:
        assert sorted(taken) == list(range(a + 1, a + SLOT))  # type: ignore[type-var]
    finally:
        for uid in taken:
            assert uid is not None
            _identity.give_back(a, uid)


def test_a_call_waits_for_a_uid_and_gives_up_at_its_deadline() -> None:
    """With every uid of the slot running a call, the next waits: it gets the first one
    given back, or nothing at its deadline."""
    base = confine.uid_for("slot-busy")
    held = [_identity.take(base, time.monotonic() + 1) for _ in range(SLOT - 1)]
    assert None not in held
    try:
        started = time.monotonic()
        assert _identity.take(base, started + 0.2) is None
        assert time.monotonic() - started >= 0.2
        got: list[int | None] = []
        waiter = threading.Thread(
            target=lambda: got.append(_identity.take(base, time.monotonic() + 10))
        )
        waiter.start()
        _identity.give_back(base, base + 7)
        waiter.join(10)
        assert got == [base + 7]
        held.remove(base + 7)
        held.append(base + 7)
    finally:
        for uid in held:
            assert uid is not None
            _identity.give_back(base, uid)


@pytest.mark.skipif(os.geteuid() != 0, reason="chowns a directory")
@pytest.mark.parametrize(("mode", "writable"), [(0o755, False), (0o775, True), (0o757, False)])
def test_a_grant_is_writable_through_the_skills_group(
    tmp_path: Path, mode: int, writable: bool
) -> None:
    """No call runs as the grant's owner, and every call is in its group: the group's
    write bits are the ones that count (the others' do not apply to a member)."""
    grant = tmp_path / "g"
    grant.mkdir()
    number = confine.uid_for("slot-grant")
    os.chown(grant, number, number)
    grant.chmod(mode)
    assert (confine.unwritable(str(grant), number) is None) == writable
