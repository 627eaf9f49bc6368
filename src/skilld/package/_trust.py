"""The trust store: which public keys may sign which skills, and how many must.

A trust directory (``policies/trust/`` in an appliance) holds one small JSON file
per key, ``NAME.pub.json``::

    {
      "name": "acme-release",
      "key_id": "3f2a9c0e5b7d1a42",
      "public_key": "<base64 of the raw 32-byte Ed25519 key>",
      "scope": ["acme-*", "notes"],
      "threshold": {"acme-*": 2}
    }

``scope`` lists the skill ids the key may sign, as patterns where ``*`` matches
any run of id characters. ``cluster`` (optional) lists, as patterns of the same
form, the node names whose cluster announcements the key may sign (``skilld serve
--cluster``); a key used only for that may have an empty ``scope``. ``threshold``
(optional) says how many *distinct* trusted keys must sign a skill whose id
matches the pattern; the strictest threshold any trust file declares for an id
applies (1 when none does). Other files in the directory are ignored, so a
README may sit beside the keys.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from skilld.errors import PackageFormatError, SignatureError, TrustError
from skilld.package._keys import (
    PUBLIC_KEY_BYTES,
    b64decode_exact,
    b64encode,
    check_public_key,
    key_id,
)
from skilld.package._manifest import _no_duplicates

TRUST_SUFFIX = ".pub.json"
MAX_TRUST_FILE = 64 * 1024
MAX_THRESHOLD = 64
# Used with fullmatch: "$" would also match before a trailing newline.
_PATTERN_RE = re.compile(r"[a-z0-9*][a-z0-9*-]{0,63}")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_KEYS = {"name", "key_id", "public_key", "scope", "threshold", "cluster"}


def check_scope_pattern(pattern: object) -> str:
    """Return ``pattern`` when it is a valid skill-id pattern (id characters and ``*``).

    Raises:
        ValueError: anything else, with a sentence saying why.
    """
    if not isinstance(pattern, str) or not _PATTERN_RE.fullmatch(pattern):
        raise ValueError(f"scope pattern {pattern!r} must be skill-id characters [a-z0-9-] and '*'")
    return pattern


@dataclass(frozen=True, slots=True)
class TrustedKey:
    """One trusted public key, what it may sign, and the file it came from."""

    name: str
    key_id: str
    public_raw: bytes
    scope: tuple[str, ...]
    thresholds: tuple[tuple[str, int], ...] = ()
    source: str = ""
    cluster: tuple[str, ...] = ()

    def may_sign(self, skill_id: str) -> bool:
        """True when ``skill_id`` matches one of this key's scope patterns."""
        return any(fnmatchcase(skill_id, pattern) for pattern in self.scope)

    def may_announce(self, node: str) -> bool:
        """True when ``node`` matches one of this key's cluster membership patterns."""
        return any(fnmatchcase(node, pattern) for pattern in self.cluster)

    def to_json(self) -> dict[str, Any]:
        """The trust file's content for this key."""
        doc: dict[str, Any] = {
            "name": self.name,
            "key_id": self.key_id,
            "public_key": b64encode(self.public_raw),
            "scope": list(self.scope),
        }
        if self.thresholds:
            doc["threshold"] = dict(self.thresholds)
        if self.cluster:
            doc["cluster"] = list(self.cluster)
        return doc


@dataclass(frozen=True, slots=True)
class TrustStore:
    """The keys an appliance trusts; built by :func:`load_trust` or from keys directly."""

    keys: tuple[TrustedKey, ...] = ()
    source: str = ""

    def get(self, kid: str) -> TrustedKey | None:
        """The trusted key with key id ``kid``, or None."""
        for key in self.keys:
            if key.key_id == kid:
                return key
        return None

    def threshold(self, skill_id: str) -> int:
        """How many distinct trusted keys must sign ``skill_id`` (the strictest rule, or 1)."""
        needed = 1
        for key in self.keys:
            for pattern, n in key.thresholds:
                if fnmatchcase(skill_id, pattern):
                    needed = max(needed, n)
        return needed


def _threshold_rules(thresholds: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    rules = []
    for pattern, n in sorted(thresholds.items()):
        check_scope_pattern(pattern)
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_THRESHOLD:
            raise ValueError(f"threshold for {pattern!r} must be an integer 1..{MAX_THRESHOLD}")
        rules.append((pattern, n))
    return tuple(rules)


def trusted_key(
    name: str,
    public_raw: bytes,
    scope: Sequence[str],
    *,
    thresholds: Mapping[str, int] | None = None,
    source: str = "",
    cluster: Sequence[str] = (),
) -> TrustedKey:
    """Build a :class:`TrustedKey`, checking every field as the loader does.

    Raises:
        TrustError: a bad name, public key, scope or cluster pattern or threshold.
    """
    where = source or name
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise TrustError(f"key name {name!r} must match {_NAME_RE.pattern}", location=where)
    try:
        check_public_key(public_raw)
    except SignatureError as exc:
        raise TrustError(exc.message, location=where) from exc
    for field_name, value in (("scope", scope), ("cluster", cluster)):
        if isinstance(value, str) or not isinstance(value, Sequence):
            raise TrustError(f"'{field_name}' must be a non-empty list of patterns", location=where)
    if not scope and not cluster:
        raise TrustError(
            "'scope' must be a non-empty list of skill-id patterns "
            "(or 'cluster' a non-empty list of node-name patterns)",
            location=where,
        )
    try:
        patterns = tuple(check_scope_pattern(p) for p in scope)
        nodes = tuple(check_scope_pattern(p) for p in cluster)
        rules = _threshold_rules(thresholds or {})
    except ValueError as exc:
        raise TrustError(str(exc), location=where) from exc
    return TrustedKey(name, key_id(public_raw), public_raw, patterns, rules, source, nodes)


def load_trust_file(path: Path) -> TrustedKey:
    """Read and check one ``NAME.pub.json`` trust file.

    Raises:
        TrustError: unreadable, too large, not JSON, an unknown or missing field,
            a malformed public key, a key id that is not the key's, a bad scope
            or threshold; ``location`` names the file.
    """
    where = str(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_TRUST_FILE + 1)
    except OSError as exc:
        raise TrustError(f"cannot read trust file: {exc.strerror}", location=where) from exc
    if len(raw) > MAX_TRUST_FILE:
        raise TrustError(f"trust file is larger than {MAX_TRUST_FILE} bytes", location=where)
    try:
        doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError, PackageFormatError) as exc:
        raise TrustError(f"not a valid JSON trust file: {exc}", location=where) from exc
    if not isinstance(doc, dict):
        raise TrustError("a trust file must hold a JSON object", location=where)
    unknown = sorted(set(doc) - _KEYS)
    if unknown:
        raise TrustError(f"unknown field(s): {', '.join(unknown)}", location=where)
    missing = sorted({"name", "key_id", "public_key", "scope"} - set(doc))
    if missing:
        raise TrustError(f"missing field(s): {', '.join(missing)}", location=where)
    try:
        public_raw = b64decode_exact(doc["public_key"], "public_key", PUBLIC_KEY_BYTES)
    except SignatureError as exc:
        raise TrustError(exc.message, location=where) from exc
    thresholds = doc.get("threshold") or {}
    if not isinstance(thresholds, dict):
        raise TrustError("'threshold' must map skill-id patterns to counts", location=where)
    key = trusted_key(
        doc["name"],
        public_raw,
        doc["scope"],
        thresholds=thresholds,
        source=where,
        cluster=doc.get("cluster") or (),
    )
    if doc["key_id"] != key.key_id:
        raise TrustError(
            f"key_id {doc['key_id']!r} is not the id of this public key ({key.key_id})",
            location=where,
        )
    return key


def load_trust(directory: Path) -> TrustStore:
    """Load every ``*.pub.json`` in ``directory`` into a :class:`TrustStore`.

    Raises:
        TrustError: the directory is missing, a trust file is malformed (names the
            file), or two files name the same key or the same key name (a key
            counts once toward a threshold, whatever it is called).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise TrustError("trust directory does not exist", location=str(directory))
    keys: list[TrustedKey] = []
    by_id: dict[str, TrustedKey] = {}
    by_name: dict[str, TrustedKey] = {}
    for path in sorted(directory.iterdir()):
        if not path.name.endswith(TRUST_SUFFIX) or path.name.startswith("."):
            continue
        key = load_trust_file(path)
        if key.key_id in by_id:
            first = by_id[key.key_id]
            raise TrustError(
                f"key {key.key_id} is already trusted as {first.name!r} ({first.source}); "
                "a key may appear once, so that it counts once toward a threshold",
                location=str(path),
            )
        if key.name in by_name:
            raise TrustError(
                f"key name {key.name!r} is already used by {by_name[key.name].source}",
                location=str(path),
            )
        by_id[key.key_id] = by_name[key.name] = key
        keys.append(key)
    return TrustStore(tuple(keys), str(directory))


def trust_file_bytes(key: TrustedKey) -> bytes:
    """The bytes of ``NAME.pub.json`` for ``key``: indented JSON for people to read."""
    return (json.dumps(key.to_json(), indent=2, sort_keys=True) + "\n").encode("utf-8")
