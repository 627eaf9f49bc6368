"""``SKILL.md``: YAML frontmatter between ``---`` lines, then Markdown instructions.

Validation follows the Agent Skills specification (agentskills.io/specification) and
words its errors like the reference validator ``skills-ref`` does, prefixed with
``SKILL.md:LINE`` and the field, so that users recognise them:

- ``name``: 1-64 characters, lowercase letters, digits and hyphens, no leading,
  trailing or doubled hyphen, equal to the directory's name;
- ``description``: 1-1024 characters;
- ``license`` (string), ``compatibility`` (string of at most 500 characters),
  ``metadata`` (a mapping of strings to strings), ``allowed-tools`` (a
  space-separated string, or a list of strings as skills-ref also reads);
- any other field is refused.

Names: skilld accepts the specification's ASCII alphabet only (``a-z``, ``0-9``, ``-``).
``skills-ref`` also accepts Unicode lowercase letters (``café``), but a skill's name is
also its skilld id, which becomes an MCP tool name, a policy file name and the host of
``skill://`` URIs: those stay ASCII. A skilld id also starts with a letter and is at
most 63 characters, so a name starting with a digit is refused too.

Strict (the default) refuses on any finding, and names every one at once. Lenient
follows the specification's client implementation guide, which skips a skill only when
its description is missing or empty or its frontmatter cannot be parsed: every other
finding (a name that differs from its directory, is over-long, holds a double hyphen or
other characters; an over-long description or ``compatibility``; an unknown top-level
field such as ``version:``; a non-string ``metadata`` value, kept as its JSON text; a
malformed ``license``, ``compatibility`` or ``allowed-tools``, left out) loads with a
warning. A frontmatter that is not YAML because a value holds an unquoted ``: `` is
retried once with such values quoted, as the guide suggests. A skill whose name cannot
be a skilld id is served under its directory's name; when neither can, it is refused
(skilld must still be able to name, lock and serve it).

A skilld id is at most 64 characters, the specification's longest name, so every
valid name builds in both modes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from skilld.errors import AgentSkillError, PolicyError
from skilld.policy import load_yaml

SKILL_MD = "SKILL.md"
MAX_NAME = 64
MAX_DESCRIPTION = 1024
MAX_COMPATIBILITY = 500
FIELDS = ("name", "description", "license", "compatibility", "metadata", "allowed-tools")
_NAME_RE = re.compile(r"[a-z0-9-]+", re.ASCII)
# What a skilld id must be (package manifest ids): a letter first, at most 63 characters.
_SKILLD_ID_RE = re.compile(r"[a-z][a-z0-9-]{0,63}", re.ASCII)
# A top-level ``key: value`` line whose value holds ': ' (the guide's common YAML slip).
_UNQUOTED = re.compile(r"^(?P<key>[A-Za-z0-9_-]+):[ \t]+(?P<value>[^'\"\s|>&*!\[{#].*: .*)$")
_FENCE = "---"


@dataclass(frozen=True, slots=True)
class SkillMd:
    """A parsed, validated ``SKILL.md``.

    ``id`` is the name skilld serves it under: its ``name``, or in lenient mode the
    directory's name when the frontmatter's cannot be a skilld id. ``body_line`` is the
    file line where the Markdown body starts. ``warnings`` hold what lenient mode let by.
    ``frontmatter`` is every field the author wrote, as JSON values (dates as ISO text):
    what the MCP skills extension publishes verbatim.
    """

    id: str
    name: str
    description: str
    body: str
    body_line: int
    license: str | None = None
    compatibility: str | None = None
    metadata: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    allowed_tools: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    allowed_tools_line: int = 0
    frontmatter: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


@dataclass
class _Findings:
    source: str
    lenient: bool
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def error(self, line: int, fld: str | None, message: str) -> None:
        self.errors.append(self._at(line, fld, message))

    def soft(self, line: int, fld: str | None, message: str) -> None:
        """A finding the client guide loads with a warning in lenient mode."""
        (self.warnings if self.lenient else self.errors).append(self._at(line, fld, message))

    def _at(self, line: int, fld: str | None, message: str) -> str:
        where = f"{self.source}:{line}"
        return f"{where}: {fld}: {message}" if fld else f"{where}: {message}"


def split_frontmatter(text: str, source: str) -> tuple[str, str, int]:
    """``(frontmatter, body, body_line)`` of a SKILL.md's text.

    The frontmatter runs from a first line ``---`` to the next line that is ``---``.

    Raises:
        AgentSkillError: no opening or closing ``---`` (at the line where it was expected).
    """
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].rstrip("\r\n").rstrip() != _FENCE:
        raise AgentSkillError(
            "SKILL.md must start with YAML frontmatter (---)",
            location=f"{source}:1",
            hint="begin the file with a line '---', the name and description, and '---'",
        )
    for index in range(1, len(lines)):
        if lines[index].rstrip("\r\n").rstrip() == _FENCE:
            return "".join(lines[1:index]), "".join(lines[index + 1 :]), index + 2
    raise AgentSkillError(
        "SKILL.md frontmatter not properly closed with ---",
        location=f"{source}:{len(lines)}",
        hint="end the frontmatter with a line '---' before the Markdown body",
    )


def parse_skill_md(skill_dir: Path, *, lenient: bool = False) -> SkillMd:
    """Read and validate ``skill_dir/SKILL.md`` (see the module docstring for the rules).

    Raises:
        AgentSkillError: the file is missing, unreadable or invalid; the message lists
            every finding as ``SKILL.md:LINE: field: what``.
    """
    path = skill_dir / SKILL_MD
    source = f"{skill_dir.name}/{SKILL_MD}"
    if not path.is_file():
        raise AgentSkillError(
            "Missing required file: SKILL.md",
            location=str(skill_dir),
            hint="an Agent Skill is a directory holding SKILL.md (upper case)",
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AgentSkillError(f"cannot read SKILL.md: {exc}", location=str(path)) from exc
    return parse_skill_text(text, skill_dir.name, source=source, lenient=lenient)


def parse_skill_text(text: str, dir_name: str, *, source: str, lenient: bool = False) -> SkillMd:
    """Validate the text of a SKILL.md found in a directory named ``dir_name``.

    Raises:
        AgentSkillError: as :func:`parse_skill_md`.
    """
    front, body, body_line = split_frontmatter(text, source)
    found = _Findings(source, lenient)
    doc = _load_frontmatter(front, source, found)
    if not isinstance(doc, dict):
        raise AgentSkillError("SKILL.md frontmatter must be a YAML mapping", location=f"{source}:2")
    lines: Mapping[str, int] = getattr(doc, "key_lines", {})
    top = 2

    def line(key: str) -> int:
        return lines.get(key, top)

    extra = sorted(set(doc) - set(FIELDS), key=str)
    for key in extra:
        found.soft(
            line(str(key)),
            str(key),
            f"Unexpected field in frontmatter. Only {sorted(FIELDS)} are allowed.",
        )
    name = _check_name(doc, dir_name, found, line("name"))
    description = _check_description(doc, found, line("description"))
    license_ = _optional_str(doc, "license", found, line("license"))
    compatibility = _optional_str(doc, "compatibility", found, line("compatibility"))
    if compatibility is not None and len(compatibility) > MAX_COMPATIBILITY:
        found.soft(
            line("compatibility"),
            "compatibility",
            f"Compatibility exceeds {MAX_COMPATIBILITY} character limit "
            f"({len(compatibility)} chars)",
        )
    metadata = _check_metadata(doc, found, line("metadata"))
    tools = _check_allowed_tools(doc, found, line("allowed-tools"))
    skill_id = name
    if not _SKILLD_ID_RE.fullmatch(name) and not found.errors:
        # Only lenient mode gets here (a name skilld cannot serve): use its directory's.
        if _SKILLD_ID_RE.fullmatch(dir_name):
            skill_id = dir_name
            shown = f"'{name[:20]}...'" if len(name) > 20 else f"'{name}'"
            found.warnings.append(
                f"{source}:{line('name')}: name: served as '{dir_name}' (its directory): "
                f"{shown} cannot be a skilld id (a lowercase letter, then at most 63 "
                "letters, digits or hyphens)"
            )
        else:
            found.error(
                line("name"),
                "name",
                f"neither the name nor the directory '{dir_name}' can be a skilld id "
                "(a lowercase letter, then at most 63 letters, digits or hyphens)",
            )
    if found.errors:
        raise AgentSkillError(
            "; ".join(found.errors),
            hint="see docs/agent-skills.md for the rules"
            + ("" if lenient else "; --lenient loads all but a missing description with a warning"),
        )
    return SkillMd(
        id=skill_id,
        name=name,
        description=description,
        body=body,
        body_line=body_line,
        license=license_,
        compatibility=compatibility,
        metadata=MappingProxyType(metadata),
        allowed_tools=tools,
        warnings=tuple(found.warnings),
        allowed_tools_line=line("allowed-tools"),
        frontmatter=MappingProxyType({str(k): jsonable(v) for k, v in doc.items()}),
    )


def _load_frontmatter(front: str, source: str, found: _Findings) -> Any:
    """The frontmatter's YAML; in lenient mode retried once with unquoted ``: `` values
    quoted (the guide's fallback).

    Raises:
        AgentSkillError: it is not YAML (strict, or still not after the retry).
    """
    if not front.strip():
        return None
    try:
        # The frontmatter starts on the file's line 2: pad so YAML's lines are the file's.
        return load_yaml("\n" + front, source)
    except PolicyError as exc:
        error = exc
    if found.lenient:
        fixed = [_quote_value(raw) for raw in front.split("\n")]
        if fixed != front.split("\n"):
            try:
                doc = load_yaml("\n" + "\n".join(fixed), source)
            except PolicyError:
                pass
            else:
                found.warnings.append(
                    f"{source}:2: frontmatter is not valid YAML ({error.message}); "
                    "loaded with values holding ': ' quoted"
                )
                return doc
    raise AgentSkillError(
        f"Invalid YAML in frontmatter: {error.message}",
        location=error.location,
        hint="quote values holding ': ' or '#', and indent with spaces",
    ) from error


def _quote_value(raw: str) -> str:
    match = _UNQUOTED.match(raw.rstrip("\r"))
    if match is None:
        return raw
    value = match["value"].replace("\\", "\\\\").replace('"', '\\"')
    return f'{match["key"]}: "{value}"'


def jsonable(value: Any) -> Any:
    """A YAML value as JSON: mappings with string keys, lists, scalars; dates as ISO text."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if hasattr(value, "isoformat"):
        return str(value.isoformat())
    return str(value)


def _required_text(
    doc: Mapping[str, Any], key: str, report: Callable[[int, str | None, str], None], at: int
) -> str | None:
    """The frontmatter's required field ``key`` when it is a non-empty string; else None,
    its absence or its wrong type told to ``report`` (``_Findings.soft`` or ``.error``:
    how hard each field's finding is stays the caller's)."""
    if key not in doc:
        report(at, None, f"Missing required field in frontmatter: {key}")
        return None
    value = doc[key]
    if not isinstance(value, str) or not value.strip():
        report(at, key, f"Field '{key}' must be a non-empty string")
        return None
    return value


def _check_name(doc: Mapping[str, Any], dir_name: str, found: _Findings, at: int) -> str:
    name = _required_text(doc, "name", found.soft, at)
    if name is None:
        return ""
    if len(name) > MAX_NAME:
        found.soft(
            at,
            "name",
            f"Skill name '{name[:20]}...' exceeds {MAX_NAME} character limit ({len(name)} chars)",
        )
    if name != name.lower():
        found.soft(at, "name", f"Skill name '{name}' must be lowercase")
    if name.startswith("-") or name.endswith("-"):
        found.soft(at, "name", "Skill name cannot start or end with a hyphen")
    if "--" in name:
        found.soft(at, "name", "Skill name cannot contain consecutive hyphens")
    if not _NAME_RE.fullmatch(name.lower()):
        found.soft(
            at,
            "name",
            f"Skill name '{name}' contains invalid characters. Only letters, digits, and "
            "hyphens are allowed (skilld: ASCII a-z and 0-9 only)",
        )
    elif name[0].isdigit():
        found.soft(at, "name", f"Skill name '{name}' must start with a letter to be a skilld id")
    if name != dir_name:
        found.soft(at, "name", f"Directory name '{dir_name}' must match skill name '{name}'")
    return name


def _check_description(doc: Mapping[str, Any], found: _Findings, at: int) -> str:
    text = _required_text(doc, "description", found.error, at)
    if text is None:
        return ""
    if len(text) > MAX_DESCRIPTION:
        found.soft(
            at,
            "description",
            f"Description exceeds {MAX_DESCRIPTION} character limit ({len(text)} chars)",
        )
    return text.strip()


def _optional_str(doc: Mapping[str, Any], key: str, found: _Findings, at: int) -> str | None:
    if key not in doc:
        return None
    value = doc[key]
    if not isinstance(value, str):
        found.soft(at, key, f"Field '{key}' must be a string (left out)")
        return None
    return value


def _check_metadata(doc: Mapping[str, Any], found: _Findings, at: int) -> dict[str, str]:
    if "metadata" not in doc:
        return {}
    value = doc["metadata"]
    if not isinstance(value, Mapping):
        found.soft(
            at, "metadata", "Field 'metadata' must be a mapping of strings to strings (left out)"
        )
        return {}
    lines: Mapping[str, int] = getattr(value, "key_lines", {})
    out: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(item, str):
            found.soft(
                lines.get(key, at),
                f"metadata.{key}",
                f"Field 'metadata' values must be strings, got {_kind(item)} "
                "(kept as its JSON text; quote it)",
            )
            item = json.dumps(jsonable(item), ensure_ascii=False)
        out[str(key)] = item
    return out


def _kind(value: Any) -> str:
    """A YAML value's kind in the words a SKILL.md author uses."""
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "a date" if hasattr(value, "isoformat") else "a non-string value"


def _check_allowed_tools(doc: Mapping[str, Any], found: _Findings, at: int) -> tuple[str, ...]:
    if "allowed-tools" not in doc:
        return ()
    value = doc["allowed-tools"]
    if isinstance(value, str):
        return tuple(split_allowed_tools(value))
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return tuple(t for item in value for t in split_allowed_tools(item))
    found.soft(
        at,
        "allowed-tools",
        "Field 'allowed-tools' must be either a string or a list of strings (left out)",
    )
    return ()


def split_allowed_tools(text: str) -> list[str]:
    """Split a space-separated ``allowed-tools`` value; spaces inside ``(...)`` stay.

    ``Bash(git status:*) Read`` is two tools: ``Bash(git status:*)`` and ``Read``.
    """
    out: list[str] = []
    depth = 0
    current = ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        if ch.isspace() and depth == 0:
            if current:
                out.append(current)
            current = ""
            continue
        current += ch
    if current:
        out.append(current)
    return out
