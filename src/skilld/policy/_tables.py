"""Compiled permission tables: a frozen, canonical, JSON-serialisable value.

The tables are what ``skilld build`` bakes into a bundle and what every check
consults. Their identity is :attr:`Tables.digest`, the sha256 of the canonical
JSON (sorted keys, no spaces, UTF-8), so the same policy always gives the same
digest.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from skilld.errors import PolicyError
from skilld.policy._schema import Exposure
from skilld.types import Limits

FORMAT = "skilld-policy-tables/1"
LIMIT_FIELDS = tuple(f.name for f in fields(Limits))


def freeze(value: Any) -> Any:
    """A deep read-only copy: mappings become ``MappingProxyType``, lists tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({str(k): freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """The JSON-ready (dict/list) form of a frozen value."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [thaw(v) for v in value]
    return value


def canonical_json(value: Any) -> str:
    """Sorted keys, no insignificant whitespace: the bytes the digest is taken of."""
    return json.dumps(thaw(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class Tables:
    """Every skill's effective grants, limits and MCP exposure.

    Build one with :meth:`from_data` (validates the shape) or :func:`load_tables`.
    """

    data: Mapping[str, Any]
    digest: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "data", freeze(self.data))
        text = canonical_json(self.data).encode()
        object.__setattr__(self, "digest", hashlib.sha256(text).hexdigest())

    @classmethod
    def from_data(cls, data: Mapping[str, Any], source: str = "<tables>") -> Tables:
        """Tables from their JSON form.

        Raises:
            PolicyError: not tables of a format this version reads.
        """
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            found = data.get("format") if isinstance(data, Mapping) else type(data).__name__
            raise PolicyError(
                f"not policy tables of format {FORMAT} (found {found!r})",
                location=source,
                hint="recompile with 'skilld policy compile'",
            )
        skills = data.get("skills")
        if not isinstance(skills, Mapping) or not all(
            isinstance(v, Mapping) for v in skills.values()
        ):
            raise PolicyError("tables have no 'skills' mapping", location=source)
        callers = data.get("callers")
        if callers is not None and not (
            isinstance(callers, Mapping)
            and isinstance(callers.get("rules"), list | tuple)
            and all(
                isinstance(r, Mapping) and isinstance(r.get("id"), str) for r in callers["rules"]
            )
            and isinstance(callers.get("open"), list | tuple)
        ):
            raise PolicyError(
                "the tables' 'callers' is not a caller table",
                location=source,
                hint="recompile with 'skilld policy compile'",
            )
        return cls(data)

    @property
    def skills(self) -> tuple[str, ...]:
        """The skill ids the tables know, sorted."""
        return tuple(sorted(self.data["skills"]))

    @property
    def kits(self) -> Mapping[str, Any]:
        """delegate's compiled kits by name (``skilld.policy._kits``); empty without any."""
        kits: Mapping[str, Any] = self.data.get("kits") or {}
        return kits

    @property
    def callers(self) -> Mapping[str, Any] | None:
        """Who may call what (``skilld.policy._callers``): ``{"rules": [...], "open": [...]}``;
        ``None`` for tables compiled without ``policies/callers/``."""
        callers: Mapping[str, Any] | None = self.data.get("callers")
        return callers

    def skill(self, skill_id: str) -> Mapping[str, Any]:
        """One skill's table.

        Raises:
            PolicyError: the tables have no entry for ``skill_id``.
        """
        table = self.data["skills"].get(skill_id)
        if table is None:
            raise PolicyError(
                f"no policy for skill '{skill_id}'",
                location=skill_id,
                hint=f"known: {', '.join(self.skills) or 'none'}; add policies/{skill_id}.yaml",
            )
        return table  # type: ignore[no-any-return]

    def limits(self, skill_id: str) -> Limits:
        """The skill's effective resource limits.

        Raises:
            PolicyError: the tables have no entry for ``skill_id``.
        """
        raw = self.skill(skill_id).get("limits", {})
        return Limits(**{k: int(raw[k]) for k in LIMIT_FIELDS if k in raw})

    def records_arguments(self, skill_id: str) -> bool:
        """Whether the operator opted in to record this skill's call arguments and results
        on its spans (policy ``telemetry.record_arguments``; never by default).

        Raises:
            PolicyError: the tables have no entry for ``skill_id``.
        """
        return bool(self.skill(skill_id).get("telemetry", {}).get("record_arguments", False))

    def exposure(self, skill_id: str) -> Exposure:
        """How the skill's methods become MCP tools.

        Raises:
            PolicyError: the tables have no entry for ``skill_id``.
        """
        raw = self.skill(skill_id).get("mcp", {})
        return Exposure(
            per_skill=raw.get("tools") == "per-skill",
            hidden=tuple(raw.get("hidden", ())),
            names=dict(raw.get("names", {})),
            titles=dict(raw.get("titles", {})),
            descriptions=dict(raw.get("descriptions", {})),
            client=tuple(raw.get("client", ())),
            tasks=dict(raw.get("tasks", {})),
        )

    def scripts(self, skill_id: str) -> Mapping[str, Any]:
        """How the skill's Agent Skills scripts run: ``executor`` and ``interpreters``
        (``None`` when the policy does not say: the build chooses from the scripts),
        ``requirements``, ``programs`` (system programs the scripts need) and
        ``temp_paths`` (fixed directories under /tmp made fresh for each call).

        Raises:
            PolicyError: the tables have no entry for ``skill_id``.
        """
        raw = self.skill(skill_id).get("scripts") or {}
        interpreters = raw.get("interpreters")
        return {
            "executor": raw.get("executor"),
            "interpreters": None if interpreters is None else tuple(interpreters),
            "requirements": tuple(raw.get("requirements", ())),
            "programs": tuple(raw.get("programs", ())),
            "temp_paths": tuple(raw.get("temp_paths", ())),
        }

    def interfaces(self, skill_id: str) -> frozenset[str]:
        """The WIT host interfaces the skill may import: those with an effective grant.

        ``log`` and ``mcp`` (progress and logs to the client) always; ``sample`` and
        ``elicit`` are still checked per call against ``mcp.client``.

        Raises:
            PolicyError: the tables have no entry for ``skill_id``.
        """
        table = self.skill(skill_id)
        out = {"log", "mcp"}
        for name in ("fs", "http", "tcp", "shell", "env", "transfer", "kv"):
            if table.get(name):
                out.add(name)
        invoke = table.get("invoke")
        if invoke and (invoke.get("calls") or invoke.get("remote_calls")):
            out.add("invoke")
        return frozenset(out)

    def to_json(self) -> str:
        """The canonical JSON text (what :func:`load_tables` reads back)."""
        return canonical_json(self.data)

    def write(self, path: str | Path) -> None:
        """Write the canonical JSON to ``path``.

        Raises:
            PolicyError: the file cannot be written.
        """
        try:
            Path(path).write_text(self.to_json() + "\n", encoding="utf-8")
        except OSError as exc:
            raise PolicyError(f"cannot write tables: {exc.strerror}", location=str(path)) from exc


def load_tables(path: str | Path) -> Tables:
    """Read tables written by :meth:`Tables.write`.

    Raises:
        PolicyError: unreadable, not JSON, or not tables.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(f"cannot read tables: {exc.strerror}", location=str(path)) from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PolicyError(
            f"tables are not JSON: {exc.msg}", location=f"{path}:{exc.lineno}"
        ) from exc
    return Tables.from_data(data, str(path))
