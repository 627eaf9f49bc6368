"""``skilld build``: verify, compile and lock an appliance bundle.

Steps, each timed and reported through ``progress``:

1. collect skills: ``.skill`` files are used as they are, and so are the packages
   ``sources.yaml`` lists in OCI registries and image layouts (``skilld.distribution``:
   each tag resolved once, or fetched at ``--locked``'s digests; pinned in the lock);
   each kind of skill (``_kinds.py``: wasm components from ``skill.yaml``, delegate
   kits' runner, Agent Skills from ``SKILL.md``) finds its sources and packs them,
   signed with the given skill key or an ephemeral build key whose public half joins
   the bundle's trust set;
2. verify every package against the trust directory (scopes, thresholds);
3. compile the policy with each skill's declared needs;
4. AOT-compile every component for this engine (cached by digest);
5. ask each skill to describe itself (kept in the lock, so serving need not);
6. write the bundle (packages, native code, tables, trust set) and ``bundle.lock``,
   optionally signed with a bundle key.

Each step is a loop over the kinds of skill (``_kinds.py``, one seam each: ``find``,
``needs``, ``stage``, ``finish``). Agent Skills (``skilld.agentskills``) take steps 3-5
their own way there: their ``allowed-tools`` become needs against the policy's grants,
their files are unpacked into ``agentskills/NAME/files`` and their Python requirements
installed from the wheelhouse into ``agentskills/NAME/env`` (every file in the lock),
and the CPython runner component is compiled once when a skill uses the ``wasm``
executor.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from skilld import ABI_VERSION, __version__, distribution, package, paths
from skilld.bundle._kinds import (
    KINDS,
    BuildOptions,
    BuildSummaryRow,
    Grants,
    Staged,
    Staging,
    Verified,
    _sha256,
    _write,
)
from skilld.bundle._lock import (
    FORMAT,
    LOCK,
    LOCK_SIG,
    Lock,
    LockedSource,
    canonical_json,
)
from skilld.errors import BundleError, SkilldError, UsageError
from skilld.policy import CompileResult, compile_policies
from skilld.sandbox import Sandbox

LOCK_SIGNING_CONTEXT = b"skilld bundle lock v1\n"
EPHEMERAL_TRUST = "ephemeral-build.pub.json"

Progress = Callable[[str], None]
_DEFAULTS = BuildOptions()


@dataclass(frozen=True, slots=True)
class BuildResult:
    """What ``build_bundle`` produced."""

    out: Path
    lock: Lock
    rows: tuple[BuildSummaryRow, ...]
    warnings: tuple[str, ...]


def _versions_key(version: str) -> tuple[Any, ...]:
    """Semantic Versioning 2.0 precedence: numeric core, then a pre-release sorts below
    its release, identifiers compared numerically or as text; build metadata ignored.
    Versions reaching here passed the manifest's semver check."""
    core, _, pre = version.split("+")[0].partition("-")
    numbers = tuple(int(p) for p in core.split("."))
    if not pre:
        return (numbers, (1,))
    ids = tuple((0, int(i), "") if i.isdigit() else (1, 0, i) for i in pre.split("."))
    return (numbers, (0, ids))


def _check_downgrades(
    previous: Lock | None, skills: Iterable[tuple[str, str]], allow_downgrade: bool
) -> None:
    if previous is None:
        return
    before = {s.id: s.version for s in previous.skills}
    for sid, version in skills:
        downgrade = sid in before and _versions_key(version) < _versions_key(before[sid])
        if downgrade and not allow_downgrade:
            raise BundleError(
                f"skill '{sid}' would go from {before[sid]} down to {version}",
                location="--previous",
                hint="pass --allow-downgrade if this is intended",
            )


@dataclass(frozen=True, slots=True)
class _Collected:
    path: Path  # where the package sits in the stage
    origin: Path | str  # the .skill file, source directory or sources.yaml line
    expect: tuple[str, str] | None  # (id, version) for packages built here
    pulled: tuple[str, str] | None = None  # (reference as written, manifest digest)


def _pull(skills_dir: Path, pkg_dir: Path, options: BuildOptions) -> list[_Collected]:
    """Fetch the packages ``sources.yaml`` lists (pinned to ``options.locked``'s digests
    when given) into ``pkg_dir``; they are verified with every other package."""
    listing = options.sources or skills_dir / distribution.SOURCES
    if options.sources is None and not listing.is_file():
        return []
    sources = distribution.read_sources(listing)
    pinned = None
    if options.locked is not None:
        pinned = {s.ref: s.digest for s in Lock.read(options.locked).sources}
        options.progress(f"pinned to the digests in {options.locked}")
    before = {s.ref: s.digest for s in Lock.read(options.previous).sources} if (
        options.previous is not None and pinned is None
    ) else {}
    blobs = (options.cache_dir or paths.cache_dir()) / "oci" / "blobs"
    out = []
    for i, pulled in enumerate(
        distribution.pull_sources(sources, blobs, pinned=pinned, progress=options.progress)
    ):
        was = before.get(pulled.entry.text)
        if was is not None and was != pulled.artifact.digest:
            options.progress(
                f"{pulled.entry.text} moved: {was} in {options.previous}, now "
                f"{pulled.artifact.digest}"
            )
        # not *.skill, so no pre-signed file's name; renamed ID-VERSION.skill once verified
        target = pkg_dir / f".pulled-{i}"
        shutil.copyfile(pulled.path, target)
        origin = f"{pulled.entry.where} ({pulled.entry.text})"
        out.append(_Collected(target, origin, None, (pulled.entry.text, pulled.artifact.digest)))
    return out


def _collect(
    skills_dir: Path, policies_dir: Path, stage: Path, epoch: int, options: BuildOptions
) -> list[_Collected]:
    """Copy pre-signed packages, and build, pack and sign every kind's sources, into
    ``stage/packages``."""
    progress = options.progress
    pkg_dir = stage / "packages"
    pkg_dir.mkdir(parents=True)
    trust_dir = stage / "trust"
    trust_dir.mkdir()
    trust_src = policies_dir / "trust"
    if trust_src.is_dir():
        for f in sorted(trust_src.iterdir()):
            if f.is_file() and f.name.endswith(".pub.json"):
                shutil.copyfile(f, trust_dir / f.name)
    sources = [s for kind in KINDS for s in kind.find(skills_dir, policies_dir, options)]
    prebuilt = sorted(skills_dir.glob("*.skill"))
    pulled = _pull(skills_dir, pkg_dir, options)
    if not sources and not prebuilt and not pulled:
        raise BundleError(
            "no skills found (expected *.skill files, directories with skill.yaml, "
            "Agent Skills directories with SKILL.md, or packages listed in sources.yaml)",
            location=str(skills_dir),
        )
    out: list[_Collected] = list(pulled)
    for f in prebuilt:
        progress(f"using pre-signed package {f.name}")
        target = pkg_dir / f.name
        shutil.copyfile(f, target)
        out.append(_Collected(target, f, None))
    if sources:
        if options.skill_key is not None:
            key = package.load_private_key(options.skill_key)
            progress(f"signing source skills with key {key.key_id}")
        else:
            key = package.SigningKey.generate()
            trusted = package.trusted_key(
                "ephemeral-build", key.public_raw, sorted(s.id for s in sources)
            )
            (trust_dir / EPHEMERAL_TRUST).write_bytes(package.trust_file_bytes(trusted))
            progress(f"signing source skills with ephemeral build key {key.key_id}")
        for source in sources:
            data, version = source.pack(key, epoch)
            target = pkg_dir / f"{source.id}-{version}.skill"
            target.write_bytes(data)
            out.append(_Collected(target, source.origin, (source.id, version)))
    return out


def sign_lock(key_path: Path, lock_bytes: bytes) -> bytes:
    """A detached signature of the lock: JSON with the key id and the signature.

    Raises:
        UsageError: the key cannot be read.
    """
    key = package.load_private_key(key_path)
    sig = key.sign(LOCK_SIGNING_CONTEXT + lock_bytes)
    import base64

    return canonical_json({"key_id": key.key_id, "signature": base64.b64encode(sig).decode()})


def verify_lock_signature(trust_file: Path) -> Any:
    """A ``verify_lock`` callback for :func:`open_bundle` that requires a valid signature.

    Raises:
        TrustError: the trust file is malformed.
    """
    import base64
    import binascii
    import json

    trusted = package.load_trust_file(trust_file)

    def verify(lock_bytes: bytes, sig_bytes: bytes | None) -> None:
        where = "bundle.lock.sig"
        if sig_bytes is None:
            raise BundleError(
                "the bundle is not signed, but a lock key is configured", location=where
            )
        try:
            body = json.loads(sig_bytes)
            sig = base64.b64decode(body["signature"], validate=True)
        except (ValueError, KeyError, TypeError, binascii.Error) as exc:
            raise BundleError(f"malformed lock signature: {exc}", location=where) from exc
        if body.get("key_id") != trusted.key_id:
            raise BundleError(
                f"the lock is signed by key {body.get('key_id')}, not by "
                f"{trusted.name} ({trusted.key_id})",
                location=where,
            )
        if not package.verify_signature(trusted.public_raw, sig, LOCK_SIGNING_CONTEXT + lock_bytes):
            raise BundleError(
                "the lock signature does not verify: bundle.lock was changed "
                "or signed by another key",
                location=where,
            )

    return verify


def build_bundle(
    skills_dir: Path,
    policies_dir: Path,
    out: Path,
    *,
    sandbox: Sandbox,
    options: BuildOptions = _DEFAULTS,
    **changes: Any,
) -> BuildResult:
    """Build a bundle from ``skills_dir`` and ``policies_dir`` into ``out``.

    Args:
        options: how (:class:`BuildOptions`); ``changes`` replace some of its fields
            (``build_bundle(..., strict=False)``).

    Raises:
        BundleError: a skill, package, policy or downgrade problem (names the file).
        PackageError, PolicyError: from verification and compilation.
        UsageError: missing input directories.
        TypeError: ``changes`` names no field of :class:`BuildOptions`.
    """
    opts = replace(options, **changes) if changes else options
    progress = opts.progress
    if not skills_dir.is_dir():
        raise UsageError(f"no skills directory: {skills_dir}")
    if not policies_dir.is_dir():
        raise UsageError(f"no policies directory: {policies_dir}")
    epoch = package.source_date_epoch()
    previous_lock = Lock.read(opts.previous) if opts.previous else None

    with tempfile.TemporaryDirectory(prefix="skilld-bundle-") as tmp:
        stage = Path(tmp) / "bundle"
        stage.mkdir()
        progress(f"collecting skills from {skills_dir}")
        collected = _collect(skills_dir, policies_dir, stage, epoch, opts)
        trust = package.load_trust(stage / "trust")
        verified: list[tuple[_Collected, package.VerifiedPackage]] = []
        seen: dict[str, Path | str] = {}
        for c in collected:
            exp_id, exp_version = c.expect or (None, None)
            try:
                v = package.verify_package(
                    c.path, trust, expect_id=exp_id, expect_version=exp_version
                )
            except SkilldError as exc:
                exc.location = str(c.origin)
                raise
            sid = v.manifest.id
            if sid in seen:
                raise BundleError(
                    f"skill '{sid}' comes from both {seen[sid]} and {c.origin}",
                    location=str(c.origin),
                )
            seen[sid] = c.origin
            progress(
                f"verified {sid} {v.manifest.version} (signed by "
                f"{', '.join(v.signer_names) or ', '.join(v.signers)})"
            )
            final = stage / "packages" / f"{sid}-{v.manifest.version}.skill"
            if c.path != final:
                c.path.rename(final)
            verified.append((_Collected(final, c.origin, c.expect, c.pulled), v))
        _check_downgrades(
            previous_lock,
            [(v.manifest.id, v.manifest.version) for _, v in verified],
            opts.allow_downgrade,
        )
        progress("compiling policies")
        needs: dict[str, Mapping[str, Any] | None] = {}
        sources: dict[str, str] = {}
        ready = Verified(stage, sandbox, opts, verified)
        grants = _grants_as_stated(policies_dir, [v.manifest.id for _c, v in verified])
        for kind in KINDS:
            for sid, declared in kind.needs(ready, grants).items():
                needs[sid] = declared.needs
                if declared.source is not None:
                    sources[sid] = declared.source
        compiled = compile_policies(policies_dir, needs, needs_sources=sources)
        for finding in compiled.warnings:
            progress(f"warning: {finding}")
        if opts.strict:
            compiled.raise_for_problems()
        _write(stage / "policy" / "tables.json", compiled.tables_bytes)
        staging = Staging(stage, sandbox, opts, verified, compiled)
        staged = Staged()
        for kind in KINDS:
            kind.stage(staging, staged)
        for kind in KINDS:
            kind.finish(staging, staged)
        files = {}
        for path in sorted(stage.rglob("*")):
            if path.is_file():
                files[path.relative_to(stage).as_posix()] = _sha256(path.read_bytes())
        lock = Lock(
            format=FORMAT,
            skilld_version=__version__,
            abi=ABI_VERSION,
            engine=sandbox.engine.fingerprint,
            engine_description=sandbox.engine.description,
            policy_path="policy/tables.json",
            policy_digest=compiled.digest,
            skills=tuple(sorted(staged.locked, key=lambda s: s.id)),
            files=files,
            source_date_epoch=epoch,
            agent_skills=tuple(sorted(staged.agents, key=lambda a: a.id)),
            runner=staged.runner,
            sources=tuple(
                LockedSource(c.pulled[0], c.pulled[1], v.manifest.id, v.manifest.version,
                             c.path.relative_to(stage).as_posix())
                for c, v in sorted(verified, key=lambda cv: cv[1].manifest.id)
                if c.pulled is not None
            ),
        )
        lock_bytes = lock.to_json()
        _write(stage / LOCK, lock_bytes)
        if opts.bundle_key is not None:
            _write(stage / LOCK_SIG, sign_lock(opts.bundle_key, lock_bytes))
        for path in stage.rglob("*"):
            if path.is_file():
                path.chmod(0o444)
            os.utime(path, (epoch, epoch), follow_symlinks=False)
        _replace(out, stage)
        progress(f"wrote {out} (bundle digest {lock.bundle_digest[:16]})")
        return BuildResult(out, lock, tuple(staged.rows), tuple(str(w) for w in compiled.warnings))


def _grants_as_stated(policies_dir: Path, ids: Sequence[str]) -> Grants:
    """Each skill's grants as its policy states them: the policy compiled without anyone's
    needs (once, when a kind first asks: an Agent Skill's ``allowed-tools`` ask for what
    the operator granted)."""
    compiled: list[CompileResult] = []

    def grants(sid: str) -> Mapping[str, Any]:
        if not compiled:
            compiled.append(compile_policies(policies_dir, dict.fromkeys(ids)))
        return compiled[0].tables.skill(sid)

    return grants


def _replace(out: Path, stage: Path) -> None:
    """Put ``stage`` at ``out`` so that ``out`` is never a half-written bundle.

    The copy goes to a sibling first (same file system) and is renamed into place;
    an interrupted build leaves the old bundle, or none, never a lock beside
    missing files.
    """
    if out.exists() and not (out / LOCK).is_file():
        raise BundleError(f"{out} exists and is not a bundle; not replacing it")
    out.parent.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=f".{out.name}.new-", dir=out.parent))
    old = fresh.with_name(fresh.name.replace(".new-", ".old-"))
    try:
        shutil.copytree(stage, fresh, dirs_exist_ok=True)
        for path in sorted(fresh.rglob("*"), reverse=True):
            if path.is_dir():
                path.chmod(0o555)
        if out.exists():
            out.rename(old)
        fresh.rename(out)
    except BaseException:
        _remove_tree(fresh)
        if old.exists() and not out.exists():
            old.rename(out)
        raise
    _remove_tree(old)


def _remove_tree(root: Path) -> None:
    if not root.exists():
        return
    for path in [root, *root.rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)
    shutil.rmtree(root)


__all__ = ["BuildResult", "BuildSummaryRow", "build_bundle", "sign_lock", "verify_lock_signature"]
