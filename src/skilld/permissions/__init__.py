"""Fast permission checks against compiled policy tables.

The sandbox's host functions ask one :class:`SkillPermissions` per skill::

    checker = SkillPermissions.from_tables(tables, "notes")
    checker.limits                      # skilld.types.Limits
    checker.check("fs", "read", "/data/notes/a.txt")     # Decision
    checker.check_url("https://api.example.com/v1/x", "GET")
    checker.check_address("10.0.0.5", 5432, "tcp")       # after resolution

Every answer is a :class:`~skilld.types.Decision` naming the rule that decided
(``default-deny`` when none matched) and why. :func:`explain` answers the
questions ``skilld policy explain`` asks.
"""

from __future__ import annotations

import shlex

from skilld.permissions._checker import DEFAULT_DENY, SkillPermissions
from skilld.permissions._url import NormalUrl, UrlRefused, normalize_url
from skilld.policy import Tables
from skilld.types import Decision

__all__ = [
    "DEFAULT_DENY",
    "NormalUrl",
    "SkillPermissions",
    "UrlRefused",
    "explain",
    "normalize_url",
]


def explain(tables: Tables, skill_id: str, action: str, target: str) -> Decision:
    """Answer ``CAPABILITY.ACTION TARGET`` for a skill, as ``skilld policy explain`` does.

    ``fs.read PATH``, ``fs.write PATH``, ``http.get URL`` (any method),
    ``http.address IP:PORT``, ``tcp.connect HOST:PORT``, ``shell.run "CMD ARGS"``
    (split like a shell would, then checked as argv), ``shell.cwd DIR``,
    ``env.read NAME``, ``invoke.call SKILL``, ``transfer.send NODE:PATH``.

    Raises:
        PolicyError: the tables have no entry for ``skill_id``.
    """
    checker = SkillPermissions.from_tables(tables, skill_id)
    capability, _, act = action.partition(".")
    if capability == "http" and act != "address":
        return checker.check_url(target, act.upper() or "GET")
    if capability == "shell" and act == "run":
        try:
            return checker.check_argv(shlex.split(target))
        except ValueError as exc:
            return Decision(False, "shell", "run", target, "bad-request", str(exc))
    return checker.check(capability, act, target)
