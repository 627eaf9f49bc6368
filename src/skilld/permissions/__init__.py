"""Fast permission checks against compiled policy tables.

The sandbox's host functions ask one :class:`SkillPermissions` per skill::

    checker = SkillPermissions.from_tables(tables, "notes")
    checker.limits                      # skilld.types.Limits
    checker.check_path("/data/notes/a.txt")              # Decision (fs read)
    checker.check_url("https://api.example.com/v1/x", "GET")
    checker.check("env", "read", "HOME")                 # a question about one name
    checker.check_address("10.0.0.5", 5432, "tcp")       # after resolution
    checker.check_argv(("git", "status"))                # a command, as its argv
    check_text(checker, "shell", "run", "git status")    # the same, written by a person

Every answer is a :class:`~skilld.types.Decision` naming the rule that decided
(``default-deny`` when none matched) and why. :func:`explain` answers the
questions ``skilld policy explain`` asks.

Who may list and call which tools, prompts, resources and skills is one more typed
question, about a caller rather than a skill::

    CallerPolicy.from_tables(tables).may(caller, "call", Target("tool", "notes/add", "notes"))
"""

from __future__ import annotations

from skilld.errors import UsageError
from skilld.permissions._callers import (
    TARGET_KINDS,
    CallerPolicy,
    Target,
    TargetKind,
    open_rule,
)
from skilld.permissions._checker import (
    DEFAULT_DENY,
    FS_READ_ACTIONS,
    FS_WRITE_ACTIONS,
    SkillPermissions,
)
from skilld.permissions._text import check_text
from skilld.permissions._url import NormalUrl, UrlRefused, normalize_url
from skilld.policy import HTTP_METHODS, Tables
from skilld.types import Decision

# The questions the host functions ask, and so the ones `skilld policy explain` answers;
# anything else is a typo, never a deny.
EXPLAIN_ACTIONS = (
    *(f"fs.{a}" for a in ("read", "write")),
    *(f"fs.{a}" for a in sorted((FS_READ_ACTIONS | FS_WRITE_ACTIONS) - {"read", "write"})),
    *(f"http.{m.lower()}" for m in HTTP_METHODS),
    "http.address",
    "tcp.connect",
    "tcp.address",
    "shell.run",
    "shell.cwd",
    "env.read",
    "invoke.call",
    "invoke.called-by",
    "transfer.send",
    "transfer.fetch",
    "kv.get",
    "kv.set",
    "kv.delete",
    "kv.keys",
    "mcp.sample",
    "mcp.elicit",
)

__all__ = [
    "DEFAULT_DENY",
    "EXPLAIN_ACTIONS",
    "TARGET_KINDS",
    "CallerPolicy",
    "NormalUrl",
    "SkillPermissions",
    "Target",
    "TargetKind",
    "UrlRefused",
    "check_text",
    "explain",
    "explain_action",
    "normalize_url",
    "open_rule",
]


def explain_action(action: str) -> tuple[str, str]:
    """``CAPABILITY.ACTION`` split, when it is a question :func:`explain` answers.

    Raises:
        UsageError: not one of :data:`EXPLAIN_ACTIONS` (``http.GET`` counts as ``http.get``).
    """
    capability, _, act = action.partition(".")
    if capability == "http":
        act = act.lower()
    if f"{capability}.{act}" not in EXPLAIN_ACTIONS:
        raise UsageError(f"unknown action {action!r}", hint=f"one of: {', '.join(EXPLAIN_ACTIONS)}")
    return capability, act


def explain(tables: Tables, skill_id: str, action: str, target: str) -> Decision:
    """Answer ``CAPABILITY.ACTION TARGET`` for a skill, as ``skilld policy explain`` does.

    ``fs.read PATH``, ``fs.write PATH``, ``http.get URL`` (any method),
    ``http.address IP:PORT``, ``tcp.connect HOST:PORT``, ``shell.run "CMD ARGS"``
    (split like a shell would, then checked as argv), ``shell.cwd DIR``,
    ``env.read NAME``, ``invoke.call SKILL``, ``invoke.called-by NODE/SKILL``,
    ``transfer.send NODE:PATH``.

    Raises:
        UsageError: ``action`` is not one of :data:`EXPLAIN_ACTIONS` (``http.GET`` as well
            as ``http.get``).
        PolicyError: the tables have no entry for ``skill_id``.
    """
    capability, act = explain_action(action)
    checker = SkillPermissions.from_tables(tables, skill_id)
    return check_text(checker, capability, act, target)
