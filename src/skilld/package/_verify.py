"""Reading and verifying ``.skill`` packages: the one gate every package passes.

:func:`verify_package` returns a :class:`VerifiedPackage` only after every check
has passed, in this order (cheap refusals first, hashing last):

1. size of the package against ``limits``, before a byte is parsed;
2. the archive's canonical form (:mod:`skilld.package._zip`): safe, unique names,
   regular files only, stored entries within the per-file and total limits;
3. the manifest (``skill.json``): canonical JSON, every field valid, ABI compatible;
4. the file set: every file the manifest lists is present and nothing else is,
   besides signatures;
5. signatures: each well formed and each by a trusted key valid; the distinct
   trusted keys whose scope covers the skill id must meet its threshold;
6. the caller's expectations (skill id, version);
7. every file's size and sha256 against the manifest, then every CRC-32.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from skilld import ABI_VERSION
from skilld.errors import (
    DigestMismatch,
    PackageFormatError,
    SignatureError,
    TrustError,
)
from skilld.package._keys import SIGNATURE_BYTES, b64decode_exact, verify_signature
from skilld.package._manifest import (
    COMPONENT,
    MANIFEST,
    SIG_DIR,
    Manifest,
    abi_compatible,
    manifest_from_json,
    parse_canonical_json,
)
from skilld.package._trust import TrustStore
from skilld.package._zip import ZipArchive, ZipEntry, check_crc, read_zip

# What every signature signs: this context, then the manifest's canonical bytes. The
# context keeps a signature over a manifest from being replayed as one over anything
# else the same key signs (a bundle lock, say), and vice versa.
SIGNING_CONTEXT = b"skilld-skill/1 manifest\x00"
SIG_ALGORITHM = "ed25519"
_SIG_NAME = re.compile(r"signatures/([0-9a-f]{16})\.sig")  # fullmatch: "$" allows a final "\n"

PackageSource = Path | str | bytes
_THREADED_DIGEST_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class PackageLimits:
    """Size limits checked before and while a package is parsed."""

    max_package_bytes: int = 256 * 1024 * 1024
    max_file_bytes: int = 192 * 1024 * 1024
    max_total_bytes: int = 256 * 1024 * 1024
    max_entries: int = 4096
    max_manifest_bytes: int = 1024 * 1024
    max_signature_bytes: int = 1024
    max_signatures: int = 32


@dataclass(frozen=True, slots=True)
class Signature:
    """One signature found in a package (not yet, or not necessarily, verified)."""

    key_id: str
    signature: bytes


@dataclass(frozen=True, slots=True)
class PackageContents:
    """A package whose format and digests are checked but whose signatures are NOT.

    For ``skilld inspect`` and ``skilld sign``; never hand this to the engine.
    """

    manifest: Manifest
    manifest_bytes: bytes
    signatures: tuple[Signature, ...]
    files: Mapping[str, memoryview]
    archive: ZipArchive
    sha256: str


@dataclass(frozen=True, slots=True)
class VerifiedPackage:
    """A package whose format, digests, signatures and trust have all been checked.

    ``files`` holds every file but ``component.wasm`` and ``skill.json`` (``component`` is
    empty for an Agent Skill, ``manifest.kind`` ``agent-skill``);
    ``signers`` the key ids of the trusted, in-scope keys whose signatures counted.
    """

    manifest: Manifest
    manifest_bytes: bytes
    component: bytes
    files: Mapping[str, bytes]
    signers: tuple[str, ...]
    signer_names: tuple[str, ...]
    sha256: str


def signed_message(manifest_bytes: bytes) -> bytes:
    """The bytes a package signature covers: the signing context, then the manifest."""
    return SIGNING_CONTEXT + manifest_bytes


def _sha256_beside(data: bytes) -> Callable[[], str]:
    """Start hashing ``data`` on another thread (when large); the result comes from the call."""
    if len(data) < _THREADED_DIGEST_BYTES:
        digest = hashlib.sha256(data).hexdigest()
        return lambda: digest
    out: list[str] = []
    thread = threading.Thread(
        target=lambda: out.append(hashlib.sha256(data).hexdigest()),
        name="skilld-package-digest",
        daemon=True,
    )
    thread.start()

    def result() -> str:
        thread.join()
        return out[0]

    return result


# A package is a zip archive: its first bytes are a local file header (or, for an
# archive with no entries, the end record).
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
_WHAT_A_PACKAGE_IS = "a .skill package is the signed zip 'skilld pack' writes"


def read_bytes(source: PackageSource, limits: PackageLimits) -> bytes:
    """The bytes of a package given as bytes or a path, refusing oversize input unread.

    Raises:
        PackageFormatError: unreadable, not a regular file, over the size limit, or (a
            path) not a zip archive at all.
    """
    if isinstance(source, bytes):
        if len(source) > limits.max_package_bytes:
            raise PackageFormatError(
                f"package is {len(source)} bytes, over the limit of {limits.max_package_bytes}"
            )
        return source
    path = str(source)
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer,
        # forever, before fstat could refuse it.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise PackageFormatError(f"cannot open package: {exc.strerror}", location=path) from exc
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise PackageFormatError(
                "not a .skill package (a directory, not a regular file)",
                location=path,
                hint=_WHAT_A_PACKAGE_IS,
            )
        if not stat.S_ISREG(st.st_mode):
            raise PackageFormatError(
                "package is not a regular file (a directory, FIFO, socket or device)",
                location=path,
            )
        os.set_blocking(fd, True)
        if st.st_size > limits.max_package_bytes:
            raise PackageFormatError(
                f"package is {st.st_size} bytes, over the limit of {limits.max_package_bytes}",
                location=path,
            )
        with os.fdopen(fd, "rb", closefd=False) as fh:
            # One byte past the size stat gave, to notice a file that grew meanwhile.
            data = fh.read(min(st.st_size, limits.max_package_bytes) + 1)
    except OSError as exc:
        raise PackageFormatError(f"cannot read package: {exc.strerror}", location=path) from exc
    finally:
        os.close(fd)
    if len(data) > st.st_size:
        raise PackageFormatError("package changed while it was read", location=path)
    if not data.startswith(_ZIP_MAGIC):
        start = data[:16].decode("ascii", "replace") if data else ""
        raise PackageFormatError(
            f"not a .skill package (not a zip archive; it begins {start!r})"
            if data
            else "not a .skill package (it is empty)",
            location=path,
            hint=_WHAT_A_PACKAGE_IS,
        )
    return data


def _parse_signature(entry: ZipEntry, limits: PackageLimits) -> Signature:
    m = _SIG_NAME.fullmatch(entry.name)
    if not m:
        raise SignatureError(
            f"signature entry {entry.name!r} must be named signatures/<16-hex key id>.sig"
        )
    if len(entry.data) > limits.max_signature_bytes:
        raise SignatureError(f"signature entry {entry.name!r} is too large")
    try:
        doc = parse_canonical_json(bytes(entry.data), entry.name)
    except PackageFormatError as exc:
        raise SignatureError(exc.message) from exc
    if not isinstance(doc, dict) or set(doc) != {"algorithm", "key_id", "signature"}:
        raise SignatureError(f"{entry.name} must hold exactly algorithm, key_id, signature")
    if doc["algorithm"] != SIG_ALGORITHM:
        raise SignatureError(f"{entry.name}: algorithm {doc['algorithm']!r} is not ed25519")
    if doc["key_id"] != m[1]:
        raise SignatureError(
            f"{entry.name} holds a signature by key {doc['key_id']!r}, not by {m[1]!r}"
        )
    raw = b64decode_exact(doc["signature"], f"{entry.name} signature", SIGNATURE_BYTES)
    return Signature(m[1], raw)


def _contents(data: bytes, limits: PackageLimits, *, digests: bool, sha256: str) -> PackageContents:
    archive = read_zip(
        data,
        max_entries=limits.max_entries,
        max_file_bytes=limits.max_file_bytes,
        max_total_bytes=limits.max_total_bytes,
    )
    entries = {e.name: e for e in archive.entries}
    manifest_entry = entries.get(MANIFEST)
    if manifest_entry is None:
        raise PackageFormatError(f"the package has no {MANIFEST}")
    if len(manifest_entry.data) > limits.max_manifest_bytes:
        raise PackageFormatError(
            f"{MANIFEST} is {len(manifest_entry.data)} bytes, over the limit of "
            f"{limits.max_manifest_bytes}"
        )
    manifest_bytes = bytes(manifest_entry.data)
    manifest = manifest_from_json(parse_canonical_json(manifest_bytes, MANIFEST))
    if not abi_compatible(manifest.abi, ABI_VERSION):
        raise PackageFormatError(
            f"skill '{manifest.id}' was built for skill ABI {manifest.abi}; this skilld "
            f"speaks {ABI_VERSION}",
            hint="rebuild the skill against this skilld's SDK",
        )
    sig_entries = [e for e in archive.entries if e.name.startswith(SIG_DIR)]
    if len(sig_entries) > limits.max_signatures:
        raise SignatureError(
            f"the package holds {len(sig_entries)} signatures, over the limit of "
            f"{limits.max_signatures}"
        )
    signatures = tuple(_parse_signature(e, limits) for e in sig_entries)
    listed = {f.name for f in manifest.files}
    present = {n for n in entries if n != MANIFEST and not n.startswith(SIG_DIR)}
    if extra := sorted(present - listed):
        raise PackageFormatError(
            f"file(s) in the archive but not in the manifest: {', '.join(extra)}"
        )
    if missing := sorted(listed - present):
        raise PackageFormatError(
            f"file(s) listed in the manifest but missing from the archive: {', '.join(missing)}"
        )
    if digests:
        _check_digests(manifest, entries, archive)
    return PackageContents(
        manifest=manifest,
        manifest_bytes=manifest_bytes,
        signatures=signatures,
        files=MappingProxyType({n: entries[n].data for n in sorted(listed)}),
        archive=archive,
        sha256=sha256,
    )


def _check_digests(
    manifest: Manifest, entries: Mapping[str, ZipEntry], archive: ZipArchive
) -> None:
    for f in manifest.files:
        view = entries[f.name].data
        if len(view) != f.size:
            raise DigestMismatch(f"{f.name} is {len(view)} bytes; the manifest says {f.size}")
        if hashlib.sha256(view).hexdigest() != f.sha256:
            raise DigestMismatch(f"sha256 of {f.name} does not match the manifest")
    for entry in archive.entries:
        check_crc(entry)


def read_package(source: PackageSource, limits: PackageLimits | None = None) -> PackageContents:
    """Parse a package and check its format and digests, but NOT its signatures or trust.

    For tools that show or extend a package (``skilld inspect``, ``skilld sign``);
    anything that runs a skill uses :func:`verify_package`.

    Raises:
        PackageFormatError: malformed archive or manifest, or a limit exceeded.
        DigestMismatch: a file's size or sha256 differs from the manifest.
        SignatureError: a signature entry is malformed.
    """
    limits = limits or PackageLimits()
    try:
        data = read_bytes(source, limits)
        return _contents(data, limits, digests=True, sha256=hashlib.sha256(data).hexdigest())
    except (PackageFormatError, DigestMismatch, SignatureError) as exc:
        if exc.location is None and not isinstance(source, bytes):
            exc.location = str(source)
        raise


def _check_trust(contents: PackageContents, trust: TrustStore) -> tuple[str, ...]:
    manifest = contents.manifest
    if not contents.signatures:
        raise SignatureError(
            f"skill '{manifest.id}' is not signed",
            hint="sign it with 'skilld sign PKG --key KEY'",
        )
    message = signed_message(contents.manifest_bytes)
    counted: dict[bytes, str] = {}  # raw public key -> key id: a key counts once
    repeated: list[str] = []
    unknown: list[str] = []
    out_of_scope: list[str] = []
    for sig in contents.signatures:
        key = trust.get(sig.key_id)
        if key is None:
            unknown.append(sig.key_id)
            continue
        if not verify_signature(key.public_raw, sig.signature, message):
            raise SignatureError(
                f"the signature by key {key.name!r} ({sig.key_id}) does not verify: the "
                "manifest was changed after signing, or the signature is corrupt"
            )
        if not key.may_sign(manifest.id):
            out_of_scope.append(
                f"key {key.name!r} ({key.key_id}) may not sign skill '{manifest.id}': its "
                f"scope is {list(key.scope)} ({key.source or 'trust store'})"
            )
            continue
        if key.public_raw in counted:
            # The same public key under a second key id (a trust store built by hand):
            # one signer, however many signatures it made.
            repeated.append(
                f"key {key.name!r} ({key.key_id}) is the same public key as "
                f"{counted[key.public_raw]} and counts once"
            )
            continue
        counted[key.public_raw] = key.key_id
    needed = trust.threshold(manifest.id)
    if len(counted) >= needed:
        return tuple(sorted(counted.values()))
    reasons = out_of_scope + repeated
    if unknown:
        reasons.append(f"signed by unknown key(s) {', '.join(unknown)} (not in the trust store)")
    if counted:
        reasons.append(
            f"threshold not met: skill '{manifest.id}' needs {needed} distinct trusted keys, "
            f"has {len(counted)} ({', '.join(sorted(counted.values()))})"
        )
    raise TrustError(
        "; ".join(reasons) or f"no trusted key signed skill '{manifest.id}'",
        hint=f"trust store: {trust.source}" if trust.source else None,
    )


def _check_expected(manifest: Manifest, expect_id: str | None, expect_version: str | None) -> None:
    if expect_id is not None and manifest.id != expect_id:
        raise TrustError(f"package is skill '{manifest.id}', expected '{expect_id}'")
    if expect_version is not None and manifest.version != expect_version:
        raise TrustError(
            f"package is version {manifest.version} of '{manifest.id}', expected {expect_version}"
        )


def verify_package(
    source: PackageSource,
    trust: TrustStore,
    *,
    expect_id: str | None = None,
    expect_version: str | None = None,
    limits: PackageLimits | None = None,
) -> VerifiedPackage:
    """Verify a ``.skill`` package completely and return its contents.

    ``source`` is a path or the package's bytes. Nothing is returned unless every
    check passed (see the module docstring for the order).

    Raises:
        PackageFormatError: too large, malformed archive or manifest, unsafe entry,
            a file missing from or not listed in the manifest, ABI incompatible.
        DigestMismatch: a file's size or sha256 differs from the manifest.
        SignatureError: unsigned, or a signature malformed or invalid.
        TrustError: only unknown or out-of-scope keys signed, too few distinct
            keys for the threshold, or the id or version is not the expected one.
    """
    limits = limits or PackageLimits()
    try:
        data = read_bytes(source, limits)
        # The package digest is for the caller (the bundle lock), not a check: compute
        # it beside the checks; hashlib releases the GIL, so it costs no wall time.
        package_sha256 = _sha256_beside(data)
        contents = _contents(data, limits, digests=False, sha256="")
        signers = _check_trust(contents, trust)
        manifest = contents.manifest
        _check_expected(manifest, expect_id, expect_version)
        entries = {e.name: e for e in contents.archive.entries}
        _check_digests(manifest, entries, contents.archive)
    except (PackageFormatError, DigestMismatch, SignatureError, TrustError) as exc:
        if exc.location is None and not isinstance(source, bytes):
            exc.location = str(source)
        raise
    names = {k.key_id: k.name for k in trust.keys}
    return VerifiedPackage(
        manifest=manifest,
        manifest_bytes=contents.manifest_bytes,
        component=bytes(contents.files.get(COMPONENT, b"")),
        files=MappingProxyType({n: bytes(v) for n, v in contents.files.items() if n != COMPONENT}),
        signers=signers,
        signer_names=tuple(names[k] for k in signers),
        sha256=package_sha256(),
    )
