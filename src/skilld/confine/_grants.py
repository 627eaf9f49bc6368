"""A skill's compiled grants (the tables' ``fs`` and ``tcp`` rules) as a :class:`Confinement`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from skilld.confine._runner import Confinement, ResourceLimits
from skilld.errors import ConfinementUnavailable
from skilld.policy import patterns as patterns


def _directory(path_pattern: str) -> str:
    """The directory a kernel rule can name for an fs grant: the grant's path when it
    is literal, else the directory before its first wildcard (the argv check keeps
    the glob's precision; the kernel's rule is the wider, second wall)."""
    segments = patterns.parse_path_pattern(path_pattern)
    if patterns.is_literal(segments):
        return patterns.join_path(segments)
    return patterns.literal_prefix(segments)


def _ports(rules: Iterable[Mapping[str, Any]], limit: int) -> tuple[int, ...]:
    out: set[int] = set()
    for rule in rules:
        for lo, hi in rule.get("ports") or ():
            if int(hi) - int(lo) + len(out) >= limit:
                raise ConfinementUnavailable(
                    f"tcp rule {rule.get('id')} grants ports {lo}-{hi}: more than the "
                    f"{limit} port rules a confined command gets",
                    feature="landlock-tcp",
                    hint="grant commands the ports they use, not a range",
                )
            out.update(range(int(lo), int(hi) + 1))
    return tuple(sorted(out))


def from_grants(
    fs: Iterable[Mapping[str, Any]],
    tcp: Iterable[Mapping[str, Any]] = (),
    *,
    limits: ResourceLimits | None = None,
    max_ports: int = 1024,
    skill: str | None = None,
) -> Confinement:
    """The confinement of a command run for a skill with these fs and tcp rules.

    ``fs`` rules (``{"path", "mode"}``) become read-only (``ro``) or read-write
    (``rw``) directory rules; ``tcp`` rules (``{"ports": [[lo, hi], ...]}``) become
    connect rules for their ports (Landlock rules name ports, not hosts). No tcp
    rule: no TCP at all. ``skill`` names whose uid the command runs as.

    Raises:
        ConfinementUnavailable: a tcp range wider than ``max_ports``.
    """
    read_only: list[str] = []
    read_write: list[str] = []
    for rule in fs:
        target = read_write if rule.get("mode") == "rw" else read_only
        directory = _directory(str(rule["path"]))
        if directory not in target:
            target.append(directory)
    return Confinement(
        read_only=tuple(read_only),
        read_write=tuple(read_write),
        tcp_connect=_ports(tcp, max_ports),
        limits=limits or ResourceLimits(),
        skill=skill,
    )
