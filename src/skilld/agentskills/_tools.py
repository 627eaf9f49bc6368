"""``allowed-tools`` → needs in the policy's vocabulary.

An Agent Skill declares the agent tools its instructions use (``Bash(git:*) Read``).
skilld turns them into *needs*, the same thing a wasm skill declares in ``skill.yaml``,
so that the policy compiler intersects them with the operator's grants and reports
what no grant covers, exactly as for wasm skills. The operator's policy stays the
ceiling: a need only ever narrows what the policy grants.

======================  ===================================================================
declared tool           need
======================  ===================================================================
``Read``, ``Grep``,     every ``fs`` path the policy grants, read-only
``Glob``, ``LS``
``Write``, ``Edit``,    every ``fs`` path the policy grants ``rw``, read-write (the per-call
``MultiEdit``           workspace is writable whatever is declared)
``Bash(cmd:*)``         ``shell``: program ``cmd`` with any arguments
``Bash(cmd sub:*)``     ``shell``: program ``cmd``, first argument ``sub``, then any
``WebFetch``            every ``http`` URL the policy names, ``GET`` only
anything else           nothing (reported as a finding)
======================  ===================================================================

``allowed-tools`` narrows, never gates: a skill that names no file tool (most published
skills declare no ``allowed-tools`` at all) keeps every ``fs`` grant the operator wrote
for it, as written, so its scripts can read the user's files the operator allowed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from skilld.policy import LMap

READ_TOOLS = frozenset({"Read", "Grep", "Glob", "LS"})
WRITE_TOOLS = frozenset({"Write", "Edit", "MultiEdit"})
_BASH = re.compile(r"Bash\((?P<cmd>[^():]+?)(?::\*)?\)")
_PROGRAM = re.compile(r"[A-Za-z0-9_./+-]+")


@dataclass(frozen=True, slots=True)
class ToolNeeds:
    """What ``allowed-tools`` asks for: the needs mapping, and what it cannot express."""

    needs: dict[str, Any]
    findings: tuple[str, ...]


def tools_to_needs(tools: Sequence[str], grants: Mapping[str, Any], line: int = 0) -> ToolNeeds:
    """Map declared tools onto needs, given the operator's grants for the skill.

    ``grants`` is the skill's policy table as the compiler would emit it with no
    needs (``fs``, ``http`` lists of rule tables). A ``Read`` cannot name paths the
    operator did not; it asks for what the operator granted, read-only. ``line`` is
    the line of ``allowed-tools`` in SKILL.md: the compiler's findings point at it.
    """
    fs: list[dict[str, Any]] = []
    shell: list[dict[str, Any]] = []
    http: list[dict[str, Any]] = []
    findings: list[str] = []
    for tool in tools:
        bash = _BASH.fullmatch(tool)
        if tool in READ_TOOLS:
            fs += [{"path": r["path"], "mode": "ro"} for r in grants.get("fs") or ()]
        elif tool in WRITE_TOOLS:
            rw = [
                {"path": r["path"], "mode": "rw"}
                for r in grants.get("fs") or ()
                if r["mode"] == "rw"
            ]
            if not rw:
                findings.append(
                    f"allowed-tools {tool}: no fs grant is rw; scripts write only their workspace"
                )
            fs += rw
        elif bash is not None:
            words = bash["cmd"].split()
            if not words or not all(_PROGRAM.fullmatch(w) for w in words):
                findings.append(
                    f"allowed-tools {tool}: not a program and arguments; grants nothing"
                )
                continue
            shell.append({"program": words[0], "args": [*words[1:], "**"]})
        elif tool == "WebFetch":
            urls = [r["url"] for r in grants.get("http") or ()]
            if not urls:
                findings.append(
                    f"allowed-tools {tool}: the policy names no http URL; grants nothing"
                )
            http += [{"url": u, "methods": ["GET"]} for u in urls]
        elif tool == "Bash":
            findings.append(
                "allowed-tools Bash: any program cannot be granted; name each as Bash(cmd:*)"
            )
        else:
            findings.append(f"allowed-tools {tool}: not a tool skilld maps; grants nothing")
    if not any(t in READ_TOOLS or t in WRITE_TOOLS for t in tools):
        fs = [{"path": r["path"], "mode": r.get("mode", "ro")} for r in grants.get("fs") or ()]
    needs = LMap()
    needs.line, needs.key_lines = line, {}
    for key, items in (("fs", fs), ("shell", shell), ("http", http)):
        unique = {repr(sorted(i.items())): i for i in items}
        if unique:
            needs[key] = list(unique.values())
            needs.key_lines[key] = line
    return ToolNeeds(needs, tuple(findings))
