"""The ``.skill`` package: format, keys, signing, verification and trust scopes.

A package is a canonical ZIP archive (``_zip``) holding ``skill.json`` (the
manifest, ``_manifest``), ``component.wasm``, optional files, and
``signatures/<key id>.sig``. Signatures cover the manifest, which holds the
sha256 of every other file, so a signature binds every byte. The rest of skilld
calls :func:`verify_package` with a :class:`TrustStore` from :func:`load_trust`
and uses only what it returns. ``docs/package-format.md`` specifies the format.

``build`` (compiling Python skills to components) is separate and imported on its
own, so that reading packages does not pull in the build toolchain.
"""

from __future__ import annotations

from skilld.package import _nkeys as nkeys
from skilld.package._box import BoxKey
from skilld.package._keys import (
    SigningKey,
    key_id,
    load_private_key,
    verify_signature,
    write_private_key,
)
from skilld.package._manifest import (
    COMPONENT,
    FORMAT,
    KIND_AGENT_SKILL,
    MANIFEST,
    FileEntry,
    Manifest,
    canonical_json,
)
from skilld.package._pack import (
    SkillMeta,
    add_signature,
    build_package,
    pack_directory,
    read_skill_meta,
    sign_package,
    source_date_epoch,
    write_atomic,
    write_ephemeral_signer,
)
from skilld.package._tls import TlsFiles, write_server_tls
from skilld.package._trust import (
    TrustedKey,
    TrustStore,
    load_trust,
    load_trust_file,
    trust_file_bytes,
    trusted_key,
)
from skilld.package._verify import (
    SIGNING_CONTEXT,
    PackageContents,
    PackageLimits,
    Signature,
    VerifiedPackage,
    read_package,
    verify_package,
)
from skilld.package._zip import check_name

__all__ = [
    "COMPONENT",
    "FORMAT",
    "KIND_AGENT_SKILL",
    "MANIFEST",
    "SIGNING_CONTEXT",
    "BoxKey",
    "FileEntry",
    "Manifest",
    "PackageContents",
    "PackageLimits",
    "Signature",
    "SigningKey",
    "SkillMeta",
    "TlsFiles",
    "TrustStore",
    "TrustedKey",
    "VerifiedPackage",
    "add_signature",
    "build_package",
    "canonical_json",
    "check_name",
    "key_id",
    "load_private_key",
    "load_trust",
    "load_trust_file",
    "nkeys",
    "pack_directory",
    "read_package",
    "read_skill_meta",
    "sign_package",
    "source_date_epoch",
    "trust_file_bytes",
    "trusted_key",
    "verify_package",
    "verify_signature",
    "write_atomic",
    "write_ephemeral_signer",
    "write_private_key",
    "write_server_tls",
]
