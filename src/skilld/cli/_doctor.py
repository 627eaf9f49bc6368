"""``skilld doctor``: can this host (or container) run native commands confined, and how?

An operator runs it where skilld will run (``docker run ... skilld doctor``), with the
same user, capabilities and ``SKILLD_RUN_AS``/``SKILLD_SKILL_UIDS`` as the server: it
starts the launcher as ``skilld serve`` does, prints each layer of the confinement
(available or not), the identity mode, the uid of each ``--skill`` (to ``chown`` its
read-write grants to; with ``--bundle``, every skill's, and whether it can write its
read-write grants), runs ``/bin/true`` confined, and exits 1 when native commands
(shell commands, native Agent Skill scripts) cannot run here or a grant is not writable.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    """Add ``skilld doctor``."""
    p: argparse.ArgumentParser = sub.add_parser(
        "doctor",
        help="check that native commands can run confined here",
        description="Print the confinement layers this host gives native commands "
        "(Landlock, seccomp, a separate identity per skill, namespaces, the subreaper), "
        "run one command confined, and exit 1 if native commands cannot run here.",
    )
    p.add_argument(
        "--skill",
        action="append",
        default=[],
        metavar="ID",
        help="print the uid this skill's commands run as (repeatable)",
    )
    p.add_argument(
        "--bundle",
        type=Path,
        help="also print each skill's uid and check that it can write its read-write grants",
    )
    p.set_defaults(handler=run)


def _reachable(path: str) -> bool:
    """Whether a user other than the owner (a skill's uid) can execute ``path``."""
    real = Path(os.path.realpath(path))
    try:
        return all(p.stat().st_mode & 0o001 for p in (real, *real.parents))
    except OSError:
        return False


def run(args: argparse.Namespace) -> int:
    """Handle ``skilld doctor``.

    Raises:
        ConfinementUnavailable: ``SKILLD_RUN_AS`` is set and could not be taken.
    """
    from skilld import confine
    from skilld.errors import ConfinementUnavailable, ProgramNotStarted

    confine.start_from_env()
    rows: list[tuple[str, str, bool]] = []
    try:
        prof = confine.profile()
    except ConfinementUnavailable as exc:
        print(f"skilld doctor: the confinement launcher cannot start: {exc.message}")
        return 1
    rows.append(
        ("landlock", f"ABI {prof.landlock_abi} (3 needed, 6 for scoping)", prof.landlock_abi >= 3)
    )
    rows.append(
        (
            "seccomp",
            "filter available" if prof.seccomp else "no filter (libseccomp binding missing)",
            prof.seccomp or (prof.identity == "separate" and "net" in prof.namespaces),
        )
    )
    if prof.identity == "separate":
        ident = f"separate: a uid per call, a group per skill, from {prof.uids[0]}-{prof.uids[1]}"
    else:
        ident = f"shared: skilld's uid {prof.launcher_uid} (metadata refused by seccomp)"
    rows.append(("identity", ident, prof.identity == "separate" or prof.seccomp))
    rows.append(("namespaces", "+".join(prof.namespaces) or "none (not required)", True))
    rows.append(("reaper", f"{prof.reaper} (ends every descendant, setsid or not)", True))
    python = os.path.realpath(sys.executable)
    reachable = prof.identity == "shared" or _reachable(python)
    rows.append(
        (
            "python",
            f"{python} {'runs' if reachable else 'cannot run'} as a skill's uid"
            + ("" if reachable else " (a directory on its path is closed to others)"),
            reachable,
        )
    )
    ran = False
    try:
        started = time.monotonic()
        result = confine.run(
            ["/bin/true"], confinement=confine.Confinement(), deadline=started + 10
        )
        ran = result.exit_code == 0
        took = (time.monotonic() - started) * 1000
        rows.append(("probe", f"/bin/true confined: exit {result.exit_code}, {took:.1f} ms", ran))
    except (ConfinementUnavailable, ProgramNotStarted) as exc:
        rows.append(("probe", f"/bin/true refused: {exc.message}", False))
    width = max(len(name) for name, _, _ in rows)
    for name, text, ok in rows:
        print(f"  {name:<{width}}  {'ok  ' if ok else 'FAIL'}  {text}")
    grants_ok = True
    for skill, rw in _skills(args):
        try:
            uid = confine.uid_for(skill)
        except ConfinementUnavailable as exc:
            print(f"  skill {skill}: {exc.message}")
            continue
        print(
            f"  skill {skill}: uid and gid {uid} (its group and its grants' owner; its "
            f"calls run as uids {uid + 1}-{uid + confine.CALL_SLOT - 1} in that group)"
        )
        for path in rw if prof.identity == "separate" else ():
            problem = confine.unwritable(path, uid)
            grants_ok &= problem is None
            print(f"    FAIL  {problem}" if problem else f"    ok    writes {path}")
    if not grants_ok:
        print("native commands run here, but some skills cannot write their grants (above)")
        return 1
    if prof.runnable and ran and not reachable:
        print(
            f"shell commands run here ({prof.describe()}), but native Python scripts cannot: "
            f"the skills' uids cannot execute {python}"
        )
        return 1
    if prof.runnable and ran:
        print(f"native commands run here: {prof.describe()}")
        return 0
    print(f"native commands are refused here: {prof.reason or 'the probe did not run'}")
    return 1


def _skills(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """(skill id, its read-write grant directories): ``--skill`` ones (no grants known)
    and, with ``--bundle``, every skill of the bundle's policy tables, in sorted order."""
    from skilld import confine
    from skilld.policy import load_tables

    out: list[tuple[str, list[str]]] = [(skill, []) for skill in args.skill]
    if args.bundle is not None:
        tables = load_tables(args.bundle / "policy" / "tables.json")
        skills = sorted(tables.data["skills"])
        confine.assign(skills)
        for skill in skills:
            rules = tables.skill(skill).get("fs") or ()
            rw = confine.from_grants([r for r in rules if r.get("mode") == "rw"]).read_write
            out.append((skill, list(rw)))
    return out
