"""The ``<available_skills>`` block agents put in a system prompt (``skilld skills list --xml``).

The same shape as the reference implementation's ``skills-ref to-prompt``: one
``<skill>`` per skill with its name, description and location, text escaped. The
location of a skill served by skilld is its ``SKILL.md`` as an MCP resource.
"""

from __future__ import annotations

import html
from collections.abc import Iterable


def available_skills_xml(skills: Iterable[tuple[str, str, str]]) -> str:
    """The block for ``(name, description, location)`` triples, in the order given."""
    lines = ["<available_skills>"]
    for name, description, location in skills:
        lines += [
            "<skill>",
            f"<name>{html.escape(name)}</name>",
            f"<description>{html.escape(description)}</description>",
            f"<location>{html.escape(location)}</location>",
            "</skill>",
        ]
    lines.append("</available_skills>")
    return "\n".join(lines)
