"""Strict loading of a bundle: only what the lock names, every digest checked first.

Refuses, naming the file, on: a missing or unknown file, a digest mismatch, a lock
whose signature does not verify (when a key is configured), and native code built
for another engine (unless told to recompile, which compiles from the verified
packages into the cache, never into the read-only bundle).

Digests are checked in parallel (hashlib releases the GIL); native code is hashed
through the descriptor it is loaded from, so it is read once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skilld.bundle._lock import LOCK, LOCK_SIG, Lock, LockedSkill, read_lock_bytes
from skilld.digest import Prehash, open_regular, sha256_fd
from skilld.errors import BundleError, DigestMismatch, SkilldError
from skilld.policy import Tables
from skilld.sandbox import Component, Sandbox

log = logging.getLogger("skilld.bundle")


@dataclass
class LoadedBundle:
    """A verified bundle: its lock, its policy tables and every skill's component."""

    root: Path
    lock: Lock
    tables: Tables
    components: dict[str, Component]
    timings_ms: dict[str, float] = field(default_factory=dict)

    def skill(self, skill_id: str) -> LockedSkill:
        """The lock's record of one skill.

        Raises:
            BundleError: the bundle has no such skill.
        """
        for s in self.lock.skills:
            if s.id == skill_id:
                return s
        raise BundleError(f"the bundle has no skill '{skill_id}'", location=str(self.root))


def _check_file(
    root: Path, rel: str, expected: str, prehash: Prehash | None = None
) -> bytes | None:
    """Check one file's sha256; return its bytes when it is JSON (the tables)."""
    path = root / rel
    opened = prehash.take(rel) if prehash is not None else None
    if opened is None:
        try:
            fd = open_regular(path)
        except OSError as exc:
            raise BundleError(
                f"listed in the lock but unreadable: {exc.strerror}", location=str(path)
            ) from exc
    else:
        fd = opened[0]
    try:
        actual = sha256_fd(fd) if opened is None else opened[1]
        if actual != expected:
            raise BundleError(
                f"sha256 is {actual[:16]}…, the lock says {expected[:16]}…; the "
                "bundle was changed after it was built",
                location=str(path),
            )
        if rel.endswith(".json"):
            # Read through the descriptor that was hashed: the same bytes.
            os.lseek(fd, 0, os.SEEK_SET)
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            return b"".join(chunks)
        return None
    finally:
        os.close(fd)


def _inventory(root: Path, lock: Lock) -> None:
    present = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + [d for d in dirnames if (Path(dirpath) / d).is_symlink()]:
            rel = (Path(dirpath) / name).relative_to(root).as_posix()
            if rel in (LOCK, LOCK_SIG):
                continue
            if (Path(dirpath) / name).is_symlink():
                raise BundleError("symlinks are not allowed in a bundle", location=str(root / rel))
            if rel not in lock.files:
                raise BundleError(
                    "file not named in bundle.lock; refusing to serve a bundle "
                    "with unknown content",
                    location=str(root / rel),
                )
            present.add(rel)
    missing = sorted(set(lock.files) - present)
    if missing:
        raise BundleError("named in bundle.lock but missing", location=str(root / missing[0]))


def open_bundle(
    root: Path,
    sandbox: Sandbox,
    *,
    recompile: bool = False,
    verify_lock: Callable[[bytes, bytes | None], None] | None = None,
    prehash: Prehash | None = None,
) -> LoadedBundle:
    """Verify and load the bundle at ``root``.

    The order is the point: the lock's bytes are read once, their signature checked
    (when ``verify_lock`` is given) and only then parsed; every file is inventoried;
    the policy tables are hashed and parsed from the bytes that were hashed, and
    each component's imports are checked against them while its native code loads.

    Args:
        recompile: compile native code again when the engine fingerprint changed.
        verify_lock: called with the lock bytes and the signature bytes (``None`` when
            there is no ``bundle.lock.sig``); raises to refuse.
        prehash: the bundle's files already opened and hashed (:func:`prehash_bundle`);
            each digest is still compared with this lock before its file is used.

    Raises:
        BundleError: anything wrong with the bundle; the message names the file.
        PolicyError: the tables (whose digest matched) are not tables this version reads.
        LinkError: a component imports what its policy does not grant.
    """
    root = Path(root)
    timings: dict[str, float] = {}
    t = time.perf_counter()
    lock_path = root / LOCK
    lock_bytes = read_lock_bytes(lock_path)
    sig_path = root / LOCK_SIG
    if verify_lock is not None:
        verify_lock(lock_bytes, sig_path.read_bytes() if sig_path.exists() else None)
    elif sig_path.exists():
        log.warning(
            "%s is present but not checked: no lock key is configured (serve --lock-key)",
            sig_path,
        )
    lock = Lock.parse(lock_bytes, str(lock_path))
    _inventory(root, lock)
    tables_path = root / lock.policy_path
    tables_bytes = _check_file(root, lock.policy_path, lock.files[lock.policy_path], prehash)
    if tables_bytes is None:
        raise BundleError("policy tables must be a .json file", location=str(tables_path))
    try:
        tables = Tables.from_data(json.loads(tables_bytes), str(tables_path))
    except ValueError as exc:
        raise BundleError(f"policy tables are not JSON: {exc}", location=str(tables_path)) from exc
    if tables.digest != lock.policy_digest:
        raise BundleError("policy digest differs from the lock", location=str(tables_path))
    timings["load"] = (time.perf_counter() - t) * 1000

    same_engine = lock.engine == sandbox.engine.fingerprint
    if not same_engine and not recompile:
        raise BundleError(
            f"native code was compiled for engine {lock.engine} ({lock.engine_description}); "
            f"this host runs {sandbox.engine.fingerprint} ({sandbox.engine.description})",
            location=str(lock_path),
            hint="rebuild the bundle, or serve with --recompile to compile into the cache",
        )
    natives = {s.native for s in lock.skills}
    t = time.perf_counter()
    components: dict[str, Component] = {}

    def check(rel: str) -> None:
        _check_file(root, rel, lock.files[rel], prehash)

    def load(skill: LockedSkill) -> Component:
        granted = tables.interfaces(skill.id)
        native = root / skill.native
        if same_engine:
            opened = prehash.take(skill.native) if prehash is not None else None
            try:
                return sandbox.load_native(
                    native, lock.files[skill.native], name=skill.id, granted=granted, opened=opened
                )
            except DigestMismatch as exc:
                raise BundleError(
                    f"{exc.message}; the bundle was changed after it was built",
                    location=str(native),
                ) from exc
            finally:
                if opened is not None:
                    os.close(opened[0])
        check(skill.native)  # still refuse a damaged bundle, even when not using the file
        # Only recompiling opens packages; serving never needs the package toolchain.
        from skilld.package import load_trust, verify_package

        verified = verify_package(
            root / skill.package,
            load_trust(root / "trust"),
            expect_id=skill.id,
            expect_version=skill.version,
        )
        if hashlib.sha256(verified.component).hexdigest() != skill.component_sha256:
            raise BundleError(
                "component digest differs from the lock", location=str(root / skill.package)
            )
        return sandbox.load(verified.component, name=skill.id, granted=granted)

    others = [rel for rel in lock.files if rel not in natives and rel != lock.policy_path]
    workers = max(2, os.cpu_count() or 2)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="skilld-verify") as pool:
        checking = [pool.submit(check, rel) for rel in others]
        loading = {s.id: pool.submit(load, s) for s in lock.skills}
        try:
            for checked in checking:
                checked.result()
            for sid, loaded in loading.items():
                components[sid] = loaded.result()
        except SkilldError:
            pending: list[Future[Any]] = [*checking, *loading.values()]
            for fut in pending:
                fut.cancel()
            raise
    timings["verify_and_native"] = (time.perf_counter() - t) * 1000
    log.info(
        "bundle %s verified: %d skills, digest %s", root, len(components), lock.bundle_digest[:16]
    )
    return LoadedBundle(root, lock, tables, components, timings)
