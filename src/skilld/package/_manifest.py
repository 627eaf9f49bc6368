"""The manifest (``skill.json``): what a package says it is, in canonical JSON.

The manifest names the skill (id, name, semver version, description), the skill
ABI it was built for, what it needs (an opaque JSON mapping in the policy's
vocabulary) and the sha256 and size of every other file in the package. It is
the one thing signatures cover, so covering it binds every byte the package holds.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from skilld.errors import PackageFormatError

FORMAT = "skilld-skill/1"
MANIFEST = "skill.json"
COMPONENT = "component.wasm"
SKILL_MD = "SKILL.md"
# ``kind`` is absent for a wasm component (every package before Agent Skills, so their
# bytes and digests stay the same) and ``agent-skill`` for an Agent Skills directory:
# its SKILL.md and files, no component.
KIND_COMPONENT = "component"
KIND_AGENT_SKILL = "agent-skill"
SIG_DIR = "signatures/"

# Every pattern here is used with fullmatch: "$" would also match before a trailing
# newline, letting "notes\n" or "1.2.3\n" through.
# 64 characters: the Agent Skills specification's longest name is also a skill id.
ID_RE = re.compile(r"[a-z][a-z0-9-]{0,63}")
# semver.org's recommended regex (2.0.0).
SEMVER_RE = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?",
    re.ASCII,
)
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_MANIFEST_KEYS = {"format", "id", "name", "version", "description", "abi", "needs", "files"}
_OPTIONAL_KEYS = {"kind"}
MAX_TEXT = 4096
# C0 controls, DEL and C1 controls: they would reach terminals (``skilld inspect``) and
# logs verbatim. A description may span lines and hold tabs; a name is one line.
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_MULTILINE_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no whitespace, UTF-8: the bytes that digests and signatures cover.

    Raises:
        PackageFormatError: the value holds something JSON cannot carry exactly
            (NaN, infinities, non-string keys, other types).
    """
    try:
        return json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        ).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise PackageFormatError(f"not representable as canonical JSON: {exc}") from exc


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise PackageFormatError(f"duplicate JSON key {key!r}")
        out[key] = value
    return out


def _reject_constant(name: str) -> Any:
    raise PackageFormatError(f"JSON constant {name} is not allowed")


def parse_canonical_json(data: bytes, what: str) -> Any:
    """Parse ``data``, requiring it to be exactly its own canonical form.

    Requiring the canonical bytes means that no byte of a signed or digested JSON
    document can change without the change being seen.

    Raises:
        PackageFormatError: not UTF-8, not JSON, duplicate keys, or not canonical.
    """
    try:
        text = data.decode("utf-8")
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except UnicodeDecodeError as exc:
        raise PackageFormatError(f"{what} is not UTF-8: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise PackageFormatError(f"{what} is not valid JSON: {exc}") from exc
    except PackageFormatError as exc:
        raise PackageFormatError(f"{what}: {exc.message}") from exc
    if canonical_json(value) != data:
        raise PackageFormatError(
            f"{what} is not in canonical JSON form (sorted keys, no whitespace, UTF-8)"
        )
    return value


def check_id(value: object, what: str = "id") -> str:
    """Return ``value`` when it is a valid skill id.

    Raises:
        PackageFormatError: not a string matching ``[a-z][a-z0-9-]{0,63}``.
    """
    if not isinstance(value, str) or not ID_RE.fullmatch(value):
        raise PackageFormatError(f"{what} {value!r} must match {ID_RE.pattern}")
    return value


def check_version(value: object, what: str = "version") -> str:
    """Return ``value`` when it is a semantic version (semver 2.0.0).

    Raises:
        PackageFormatError: not a string, or not semver (e.g. ``1.2`` or ``v1.2.3``).
    """
    if not isinstance(value, str) or not SEMVER_RE.fullmatch(value):
        raise PackageFormatError(f"{what} {value!r} is not a semantic version like 1.2.3")
    return value


def abi_compatible(package_abi: str, host_abi: str) -> bool:
    """True when a component built for ``package_abi`` runs on a host speaking ``host_abi``.

    Same major version, and a minor no newer than the host's; for 0.x the minor
    versions must be equal (0.x makes no compatibility promise across minors).
    """
    pm = SEMVER_RE.fullmatch(package_abi)
    hm = SEMVER_RE.fullmatch(host_abi)
    if not pm or not hm:
        return False
    p_major, p_minor, h_major, h_minor = (int(pm[1]), int(pm[2]), int(hm[1]), int(hm[2]))
    if p_major != h_major:
        return False
    return p_minor == h_minor if p_major == 0 else p_minor <= h_minor


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One file the manifest covers: its archive name, sha256 (hex) and size."""

    name: str
    sha256: str
    size: int


@dataclass(frozen=True, slots=True)
class Manifest:
    """The parsed ``skill.json``.

    ``needs`` is opaque here (the policy defines its vocabulary); it is a read-only
    view, and callers must not mutate what it holds. ``files`` is sorted by name
    and holds ``component.wasm`` (``kind`` ``component``) or ``SKILL.md`` and no
    component (``kind`` ``agent-skill``).
    """

    id: str
    name: str
    version: str
    description: str
    abi: str
    needs: Mapping[str, Any]
    files: tuple[FileEntry, ...]
    kind: str = KIND_COMPONENT

    def file(self, name: str) -> FileEntry | None:
        """The entry for ``name``, or None."""
        for entry in self.files:
            if entry.name == name:
                return entry
        return None

    def to_json(self) -> dict[str, Any]:
        """The manifest as a JSON-ready mapping (what ``skill.json`` holds)."""
        out: dict[str, Any] = {
            "format": FORMAT,
            "id": self.id,
            "name": self.name,
            "version": self.version,
            "description": self.description,
            "abi": self.abi,
            "needs": dict(self.needs),
            "files": {f.name: {"sha256": f.sha256, "size": f.size} for f in self.files},
        }
        if self.kind != KIND_COMPONENT:
            out["kind"] = self.kind
        return out

    def canonical_bytes(self) -> bytes:
        """The exact bytes of ``skill.json``, the bytes signatures cover.

        Raises:
            PackageFormatError: ``needs`` holds something JSON cannot carry exactly.
        """
        return canonical_json(self.to_json())


def check_text(value: object, key: str, *, multiline: bool = False) -> str:
    """Return ``value`` when it is valid free text for manifest field ``key``.

    ``multiline`` allows line feeds and tabs (a description); no other control
    character is ever allowed.

    Raises:
        PackageFormatError: not a string, longer than ``MAX_TEXT``, or holding a
            control character (names the field and the character).
    """
    if not isinstance(value, str):
        raise PackageFormatError(f"manifest field '{key}' must be a string")
    if len(value) > MAX_TEXT:
        raise PackageFormatError(f"manifest field '{key}' is longer than {MAX_TEXT} characters")
    control = (_MULTILINE_CONTROL_RE if multiline else _CONTROL_RE).search(value)
    if control:
        allowed = " (line feeds and tabs are allowed)" if multiline else ""
        raise PackageFormatError(
            f"manifest field '{key}' holds the control character {control[0]!r} at "
            f"index {control.start()}{allowed}"
        )
    return value


def manifest_from_json(doc: object) -> Manifest:
    """Validate a parsed ``skill.json`` and build the :class:`Manifest`.

    File names are checked by the archive layer; here they must only be strings
    that do not name the manifest or a signature.

    Raises:
        PackageFormatError: a field is missing, unknown or malformed (names the field).
    """
    if not isinstance(doc, dict):
        raise PackageFormatError("the manifest must be a JSON object")
    unknown = sorted(set(doc) - _MANIFEST_KEYS - _OPTIONAL_KEYS)
    if unknown:
        raise PackageFormatError(f"unknown manifest field(s): {', '.join(unknown)}")
    missing = sorted(_MANIFEST_KEYS - set(doc))
    if missing:
        raise PackageFormatError(f"manifest field(s) missing: {', '.join(missing)}")
    if doc["format"] != FORMAT:
        raise PackageFormatError(
            f"manifest format {doc['format']!r} is not {FORMAT!r}",
            hint="this skilld reads only its own package format",
        )
    skill_id = check_id(doc["id"], "manifest id")
    version = check_version(doc["version"], "manifest version")
    abi = check_version(doc["abi"], "manifest abi")
    needs = doc["needs"]
    if not isinstance(needs, dict):
        raise PackageFormatError("manifest field 'needs' must be a JSON object")
    files = doc["files"]
    if not isinstance(files, dict):
        raise PackageFormatError("manifest field 'files' must be a JSON object")
    entries = []
    for name in sorted(files):
        spec = files[name]
        if name == MANIFEST or name.startswith(SIG_DIR):
            raise PackageFormatError(f"the manifest may not list {name!r}")
        if not isinstance(spec, dict) or set(spec) != {"sha256", "size"}:
            raise PackageFormatError(f"manifest entry for {name!r} must hold exactly sha256, size")
        digest, size = spec["sha256"], spec["size"]
        if not isinstance(digest, str) or not _SHA256_RE.fullmatch(digest):
            raise PackageFormatError(f"manifest sha256 of {name!r} is not 64 lowercase hex digits")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise PackageFormatError(f"manifest size of {name!r} must be a non-negative integer")
        entries.append(FileEntry(name, digest, size))
    kind = doc.get("kind", KIND_COMPONENT)
    if kind == KIND_AGENT_SKILL:
        if SKILL_MD not in files or COMPONENT in files:
            raise PackageFormatError(
                f"an {KIND_AGENT_SKILL} manifest lists {SKILL_MD} and no {COMPONENT}"
            )
    elif kind != KIND_COMPONENT or "kind" in doc:
        # "component" is written by leaving kind out: one spelling per manifest.
        raise PackageFormatError(f"manifest kind must be absent or {KIND_AGENT_SKILL!r}")
    elif COMPONENT not in files:
        raise PackageFormatError(f"the manifest does not list {COMPONENT}")
    return Manifest(
        id=skill_id,
        name=check_text(doc["name"], "name"),
        version=version,
        description=check_text(doc["description"], "description", multiline=True),
        abi=abi,
        needs=MappingProxyType(needs),
        files=tuple(entries),
        kind=kind,
    )
