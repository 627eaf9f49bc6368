"""Writing ``.skill`` packages: from a skill directory, deterministically, and signing them.

The same inputs and ``SOURCE_DATE_EPOCH`` always give the same bytes: the archive
is canonical (see :mod:`skilld.package._zip`), the manifest is canonical JSON and
Ed25519 signatures are deterministic.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from skilld import ABI_VERSION
from skilld.errors import PackageFormatError, UsageError
from skilld.package._keys import SigningKey, b64encode, load_private_key, write_private_key
from skilld.package._manifest import (
    COMPONENT,
    KIND_AGENT_SKILL,
    KIND_COMPONENT,
    MANIFEST,
    SIG_DIR,
    SKILL_MD,
    FileEntry,
    Manifest,
    canonical_json,
    check_id,
    check_text,
    check_version,
    manifest_from_json,
)
from skilld.package._trust import TRUST_SUFFIX, trust_file_bytes, trusted_key
from skilld.package._verify import (
    SIG_ALGORITHM,
    PackageLimits,
    read_bytes,
    read_package,
    signed_message,
)
from skilld.package._zip import check_name, dos_datetime, write_zip

SKILL_YAML = "skill.yaml"
RESOURCES = "resources"
_SKIP = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}


@dataclass(frozen=True, slots=True)
class SkillMeta:
    """What a skill says about itself before it is packed (``skill.yaml``'s fields)."""

    id: str
    name: str
    version: str
    description: str
    needs: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


def source_date_epoch() -> int:
    """``$SOURCE_DATE_EPOCH`` as an integer, or 0 when unset.

    Raises:
        UsageError: the variable is set but is not a non-negative integer.
    """
    text = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if not text:
        return 0
    if not text.isdigit():
        raise UsageError(f"SOURCE_DATE_EPOCH={text!r} is not a non-negative integer")
    return int(text)


def signature_entry(key: SigningKey, manifest_bytes: bytes) -> tuple[str, bytes]:
    """The ``signatures/<key id>.sig`` entry ``key`` adds for a manifest."""
    doc = {
        "algorithm": SIG_ALGORITHM,
        "key_id": key.key_id,
        "signature": b64encode(key.sign(signed_message(manifest_bytes))),
    }
    return f"{SIG_DIR}{key.key_id}.sig", canonical_json(doc)


def build_package(
    meta: SkillMeta,
    component: bytes | None,
    *,
    files: Mapping[str, bytes] | None = None,
    keys: Sequence[SigningKey] = (),
    epoch: int | None = None,
) -> bytes:
    """The bytes of a ``.skill`` package holding ``component`` and ``files``, signed by ``keys``.

    ``files`` maps archive names (``SKILL.md``, ``resources/...``) to bytes.
    ``epoch`` defaults to :func:`source_date_epoch`. Without a component the package
    is an Agent Skill (manifest ``kind`` ``agent-skill``), whose files hold ``SKILL.md``.

    Raises:
        PackageFormatError: a bad id, version, name or needs value, or an unsafe
            or reserved file name.
    """
    files = dict(files or {})
    for name in files:
        check_name(name)
        if name in (MANIFEST, COMPONENT) or name.startswith(SIG_DIR):
            raise PackageFormatError(f"{name!r} is a reserved name in a package")
    if component is not None:
        files[COMPONENT] = component
    manifest = Manifest(
        id=check_id(meta.id),
        name=meta.name,
        version=check_version(meta.version),
        description=meta.description,
        abi=ABI_VERSION,
        needs=MappingProxyType(dict(meta.needs)),
        files=tuple(
            FileEntry(n, hashlib.sha256(data).hexdigest(), len(data))
            for n, data in sorted(files.items())
        ),
        kind=KIND_COMPONENT if component is not None else KIND_AGENT_SKILL,
    )
    manifest_bytes = manifest.canonical_bytes()
    manifest_from_json(manifest.to_json())  # the same checks a reader applies
    entries: list[tuple[str, bytes | memoryview]] = [(MANIFEST, manifest_bytes), *files.items()]
    entries += [signature_entry(k, manifest_bytes) for k in _distinct(keys)]
    when = source_date_epoch() if epoch is None else epoch
    return write_zip(entries, dos=dos_datetime(when))


def _distinct(keys: Sequence[SigningKey]) -> list[SigningKey]:
    seen: dict[str, SigningKey] = {}
    for key in keys:
        seen.setdefault(key.key_id, key)
    return list(seen.values())


def read_skill_meta(src_dir: Path) -> SkillMeta:
    """Read ``skill.yaml`` from a skill source directory.

    Raises:
        PackageFormatError: missing, not YAML, or a field missing or malformed;
            ``location`` names the file.
    """
    path = Path(src_dir) / SKILL_YAML
    where = str(path)
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise PackageFormatError(f"no {SKILL_YAML} in {src_dir}", location=where) from exc
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise PackageFormatError(f"cannot read {SKILL_YAML}: {exc}", location=where) from exc
    if not isinstance(doc, dict):
        raise PackageFormatError(f"{SKILL_YAML} must be a mapping", location=where)
    for key in ("id", "version"):
        if not isinstance(doc.get(key), str):
            hint = "quote it in YAML: version: '1.0.0'" if key in doc else None
            raise PackageFormatError(
                f"'{key}' is required and must be a string", location=where, hint=hint
            )
    needs = doc.get("needs") or {}
    if not isinstance(needs, dict):
        raise PackageFormatError("'needs' must be a mapping", location=where)
    try:
        canonical_json(needs)  # YAML dates, sets and the like have no JSON form
        return SkillMeta(
            id=check_id(doc["id"]),
            name=check_text(str(doc.get("name", doc["id"])), "name"),
            version=check_version(doc["version"]),
            description=check_text(str(doc.get("description", "")), "description", multiline=True),
            needs=MappingProxyType(needs),
        )
    except PackageFormatError as exc:
        raise PackageFormatError(exc.message, location=where) from exc


def _extra_files(src_dir: Path) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    md = src_dir / SKILL_MD
    candidates = [md] if md.exists() else []
    res = src_dir / RESOURCES
    if res.is_dir():
        candidates += sorted(
            p for p in res.rglob("*") if not _SKIP.intersection(p.relative_to(src_dir).parts)
        )
    for path in candidates:
        rel = path.relative_to(src_dir).as_posix()
        if path.is_symlink():
            raise PackageFormatError(f"{rel} is a symbolic link; packages hold regular files")
        if path.is_dir():
            continue
        if not path.is_file():
            raise PackageFormatError(f"{rel} is not a regular file")
        check_name(rel)
        out[rel] = path.read_bytes()
    return out


def pack_directory(
    src_dir: Path,
    component: bytes,
    *,
    keys: Sequence[SigningKey] = (),
    epoch: int | None = None,
) -> bytes:
    """Pack a skill source directory with its built component.

    Takes the metadata from ``skill.yaml`` and, when present, ``SKILL.md`` and
    every regular file under ``resources/``.

    Raises:
        PackageFormatError: a bad ``skill.yaml``, or an unsafe file under the directory.
    """
    src_dir = Path(src_dir)
    meta = read_skill_meta(src_dir)
    return build_package(meta, component, files=_extra_files(src_dir), keys=keys, epoch=epoch)


def write_atomic(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename (never half-written).

    Raises:
        UsageError: the directory cannot be written.
    """
    path = Path(path)
    directory = path.parent if str(path.parent) else Path()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}") from exc
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        Path(tmp).replace(path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise UsageError(f"cannot write {path}: {exc.strerror}") from exc
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def add_signature(data: bytes, key: SigningKey, limits: PackageLimits | None = None) -> bytes:
    """``data`` (a package) with a signature by ``key`` added; unchanged if already signed by it.

    The package's format and digests are checked first; existing signatures are
    kept as they are (they are not verified here: no trust store is involved).

    Raises:
        PackageFormatError, DigestMismatch, SignatureError: the package is not sound.
    """
    contents = read_package(data, limits)
    if any(s.key_id == key.key_id for s in contents.signatures):
        return data
    archive = contents.archive
    entries: list[tuple[str, bytes | memoryview]] = [(e.name, e.data) for e in archive.entries]
    entries.append(signature_entry(key, contents.manifest_bytes))
    return write_zip(entries, dos=(archive.dos_time, archive.dos_date))


def sign_package(path: Path, key: SigningKey, limits: PackageLimits | None = None) -> bool:
    """Add ``key``'s signature to the package at ``path`` in place, atomically.

    Returns False when ``key`` had signed it already (the file is left untouched).

    Raises:
        PackageFormatError, DigestMismatch, SignatureError: the package is not sound.
        UsageError: the file cannot be rewritten.
    """
    path = Path(path)
    limits = limits or PackageLimits()
    data = read_bytes(path, limits)
    signed = add_signature(data, key, limits)
    if signed is data:
        return False
    write_atomic(path, signed, mode=path.stat().st_mode & 0o777)
    return True


def write_ephemeral_signer(key_dir: Path, skill_id: str) -> tuple[SigningKey, Path]:
    """A throwaway key for ``skill_id`` and a trust file scoped to exactly that id.

    Writes ``KEY_DIR/<id>.key`` (mode 0600, unencrypted: it is meant to be thrown
    away with the directory) and ``KEY_DIR/<id>.pub.json``; returns the key and the
    trust file's path. When ``KEY_DIR`` already holds a key for the id, that key is
    reused, so that re-running a recipe gives the same bytes. For recipes and tests
    that pack sample skills; never commit the directory.

    Raises:
        UsageError: the key file cannot be written, or an existing one not read.
        PackageFormatError: ``skill_id`` is not a valid id.
    """
    check_id(skill_id)
    key_dir = Path(key_dir)
    key_dir.mkdir(parents=True, exist_ok=True)
    key_path = key_dir / f"{skill_id}.key"
    if key_path.exists():
        key = load_private_key(key_path)
    else:
        key = SigningKey.generate()
        write_private_key(key, key_path)
    trust_path = key_dir / f"{skill_id}{TRUST_SUFFIX}"
    trusted = trusted_key(f"ephemeral-{skill_id}", key.public_raw, [skill_id])
    write_atomic(trust_path, trust_file_bytes(trusted))
    return key, trust_path
