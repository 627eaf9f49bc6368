"""``bundle.lock``: the digest of everything a bundle holds, and its canonical form.

The lock names every file in the bundle with its sha256, each skill with its id,
version, package, component and native-code digests, the engine fingerprint the
native code was compiled for and the policy tables' digest. ``bundle_digest``
identifies the bundle's *content*: it covers the engine, the policy and each
skill's component and native code, but not signatures or keys, so that two builds
from the same inputs agree even when each signed with its own ephemeral key.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from skilld.digest import Prehash, open_regular
from skilld.errors import BundleError

FORMAT = "skilld-bundle/1"
LOCK = "bundle.lock"
LOCK_SIG = "bundle.lock.sig"
# A lock is a few KiB per skill; anything near this is not one.
_LOCK_MAX = 16 << 20


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no whitespace, UTF-8: the bytes that digests and signatures cover."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True, slots=True)
class LockedSkill:
    """One skill as the lock records it."""

    id: str
    version: str
    package: str  # bundle-relative path of the .skill
    component_sha256: str
    native: str  # bundle-relative path of the native code
    native_sha256: str
    signers: tuple[str, ...]
    description: str
    imports: tuple[str, ...]
    spec: dict[str, Any]  # what describe returned, so serving need not ask again


@dataclass(frozen=True, slots=True)
class LockedAgentSkill:
    """One Agent Skill as the lock records it: its package and its unpacked files.

    ``root`` holds the skill's files and ``env`` (``""`` when none) its baked Python
    packages, both bundle-relative directories whose every file the lock lists.
    ``scripts`` is how its scripts run (``skilld.agentskills.Plan.as_lock``): why this
    executor, the interpreters and system programs it starts, and the scripts that
    cannot run here with the reason ``run_script`` answers.
    """

    id: str
    version: str
    package: str
    root: str
    env: str
    executor: str
    signers: tuple[str, ...]
    description: str
    spec: dict[str, Any]
    scripts: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LockedRunner:
    """The CPython runner component (Agent Skills' wasm executor): its native code."""

    component_sha256: str
    native: str
    native_sha256: str


@dataclass(frozen=True, slots=True)
class LockedSource:
    """A package the build took from a registry or an image layout (``sources.yaml``):
    the reference as written, the manifest digest it resolved to (a rebuild with
    ``--locked`` fetches exactly this digest), the skill and its bundle-relative package."""

    ref: str
    digest: str
    id: str
    version: str
    package: str


@dataclass(frozen=True, slots=True)
class Lock:
    """The parsed ``bundle.lock``."""

    format: str
    skilld_version: str
    abi: str
    engine: str
    engine_description: str
    policy_path: str
    policy_digest: str
    skills: tuple[LockedSkill, ...]
    files: dict[str, str] = field(default_factory=dict)  # path -> sha256, every file but the lock
    source_date_epoch: int = 0
    agent_skills: tuple[LockedAgentSkill, ...] = ()
    runner: LockedRunner | None = None
    sources: tuple[LockedSource, ...] = ()

    @property
    def bundle_digest(self) -> str:
        """sha256 of the content identity (engine, policy, skills' code); see the module doc."""
        identity = {
            "abi": self.abi,
            "engine": self.engine,
            "policy": self.policy_digest,
            "skills": [
                [s.id, s.version, s.component_sha256, s.native_sha256]
                for s in sorted(self.skills, key=lambda s: s.id)
            ],
        }
        # Only bundles holding Agent Skills carry these keys: other digests stay as they were.
        # An Agent Skill's content is its unpacked files and environment; its package is
        # not (like a wasm skill's, it holds the signatures of whoever built it).
        if self.agent_skills:
            identity["agent_skills"] = [
                [a.id, a.version, a.executor, self._tree_digest(a)]
                for a in sorted(self.agent_skills, key=lambda a: a.id)
            ]
        if self.runner is not None:
            identity["runner"] = [self.runner.component_sha256, self.runner.native_sha256]
        return hashlib.sha256(canonical_json(identity)).hexdigest()

    def _tree_digest(self, skill: LockedAgentSkill) -> str:
        """sha256 over the names and digests of an Agent Skill's files and environment."""
        prefixes = tuple(f"{d}/" for d in (skill.root, skill.env) if d)
        listing = {k: v for k, v in self.files.items() if k.startswith(prefixes)}
        return hashlib.sha256(canonical_json(listing)).hexdigest()

    def to_json(self) -> bytes:
        """The lock file's bytes, ending in a digest of everything before it."""
        body = asdict(self)
        if not self.agent_skills:
            del body["agent_skills"]
        if self.runner is None:
            del body["runner"]
        if not self.sources:  # locks of builds without sources.yaml keep their bytes
            del body["sources"]
        body["bundle_digest"] = self.bundle_digest
        body["lock_digest"] = hashlib.sha256(canonical_json(body)).hexdigest()
        return canonical_json(body) + b"\n"

    @classmethod
    def read(cls, path: Path) -> Lock:
        """Read and parse a lock file.

        Raises:
            BundleError: missing, not JSON, another format, or malformed (names the file).
        """
        return cls.parse(read_lock_bytes(path), str(path))

    @classmethod
    def parse(cls, data: bytes, location: str) -> Lock:
        """Parse a lock's bytes (the bytes a signature was checked over).

        Raises:
            BundleError: not JSON, another format, malformed, a skill whose files the
                lock does not list, or a digest that does not match (names ``location``).
        """
        try:
            raw = json.loads(data)
        except ValueError as exc:
            raise BundleError(f"unreadable lock: {exc}", location=location) from exc
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise BundleError(f"not a {FORMAT} lock", location=location)
        try:
            skills = tuple(
                LockedSkill(**{**s, "signers": tuple(s["signers"]), "imports": tuple(s["imports"])})
                for s in raw["skills"]
            )
            lock = cls(
                format=raw["format"],
                skilld_version=raw["skilld_version"],
                abi=raw["abi"],
                engine=raw["engine"],
                engine_description=raw["engine_description"],
                policy_path=raw["policy_path"],
                policy_digest=raw["policy_digest"],
                skills=skills,
                files=dict(raw["files"]),
                source_date_epoch=int(raw.get("source_date_epoch", 0)),
                agent_skills=tuple(
                    LockedAgentSkill(**{**a, "signers": tuple(a["signers"])})
                    for a in raw.get("agent_skills", ())
                ),
                runner=LockedRunner(**raw["runner"]) if raw.get("runner") else None,
                sources=tuple(LockedSource(**r) for r in raw.get("sources", ())),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BundleError(f"malformed lock: {exc}", location=location) from exc
        claimed = raw.pop("lock_digest", None)
        if claimed != hashlib.sha256(canonical_json(raw)).hexdigest():
            raise BundleError(
                "the lock's own digest does not match its content: bundle.lock was changed "
                "after it was built",
                location=location,
            )
        if raw.get("bundle_digest") != lock.bundle_digest:
            raise BundleError("bundle_digest does not match the lock's content", location=location)
        listed = [r for s in lock.skills for r in (s.package, s.native)]
        listed += [a.package for a in lock.agent_skills]
        listed += [lock.runner.native] if lock.runner is not None else []
        listed += [r.package for r in lock.sources]
        for rel in [lock.policy_path, *listed]:
            if rel not in lock.files:
                raise BundleError(
                    f"malformed lock: {rel} is not in its file list", location=location
                )
        for s in lock.skills:
            if lock.files[s.native] != s.native_sha256:
                raise BundleError(
                    f"malformed lock: skill {s.id}'s native digest differs from its file's",
                    location=location,
                )
        return lock


def read_lock_bytes(path: Path) -> bytes:
    """The lock file's bytes, read once through a descriptor of the regular file itself.

    Raises:
        BundleError: missing, unreadable, not a regular file, or too large to be a lock.
    """
    try:
        fd = open_regular(path)
    except FileNotFoundError as exc:
        raise BundleError("no bundle.lock: not a bundle", location=str(path)) from exc
    except OSError as exc:
        raise BundleError(f"unreadable lock: {exc.strerror}", location=str(path)) from exc
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(_LOCK_MAX + 1)
    finally:
        os.close(fd)
    if len(data) > _LOCK_MAX:
        raise BundleError(f"larger than {_LOCK_MAX} bytes: not a lock", location=str(path))
    return data


def prehash_bundle(root: Path) -> Prehash:
    """Start opening and hashing the files the bundle's lock lists, in the background.

    The lock is not verified yet, so it is only read for file names, and only plain
    relative names inside the bundle are hashed (a malformed lock hashes nothing).
    :func:`open_bundle` verifies the lock, inventories the bundle and compares every
    digest before a file is used.
    """
    try:
        files = json.loads(read_lock_bytes(Path(root) / LOCK)).get("files", {})
    except (BundleError, ValueError, AttributeError):
        files = {}
    rels = [rel for rel in files if _inside(rel)] if isinstance(files, dict) else []
    return Prehash(Path(root), rels)


def _inside(rel: object) -> bool:
    """A plain relative name: no leading ``/``, no empty, ``.`` or ``..`` segment."""
    return (
        isinstance(rel, str)
        and "\0" not in rel
        and all(part not in ("", ".", "..") for part in rel.split("/"))
    )
