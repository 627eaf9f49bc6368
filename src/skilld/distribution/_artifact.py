"""A ``.skill`` package as an OCI artifact: its media types, pushing, pulling, copying.

::

    manifest  application/vnd.oci.image.manifest.v1+json
      artifactType  application/vnd.skilld.skill.v1
      config        application/vnd.oci.empty.v1+json  ({}: the artifact has no config)
      layers[0]     application/vnd.skilld.skill.v1+zip  (the package's exact bytes)
      annotations   the package manifest's facts (id, version, ABI, kind, signers) and
                    org.opencontainers.image.{title,version,description}

The annotations are for people and registries' user interfaces, never for trust: a build
verifies the package's own signatures against the operator's trust directory, exactly as
for a file in ``skills/``. The manifest is canonical JSON, so the same package pushed
twice (or to two registries) has the same digest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skilld import package
from skilld.distribution._ref import DIGEST_PATTERN, Reference
from skilld.distribution._store import RegistryOptions, Store, open_store, sha256_digest
from skilld.errors import DistributionError

ARTIFACT_TYPE = "application/vnd.skilld.skill.v1"
LAYER_MEDIA_TYPE = "application/vnd.skilld.skill.v1+zip"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
EMPTY_MEDIA_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"
# The image spec's advice (and distribution's default limit) for a manifest.
MANIFEST_CAP = 4 << 20
_ANNOTATION = "dev.skilld.skill."


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def artifact_manifest(data: bytes) -> bytes:
    """The canonical OCI manifest that carries the package ``data`` as one layer.

    Raises:
        PackageError: ``data`` is not a well-formed package (format and digests; its
            signatures are checked by whoever builds from it).
    """
    contents = package.read_package(data)
    m = contents.manifest
    title = f"{m.id}-{m.version}.skill"
    annotations = {
        f"{_ANNOTATION}id": m.id,
        f"{_ANNOTATION}version": m.version,
        f"{_ANNOTATION}abi": m.abi,
        f"{_ANNOTATION}kind": m.kind,
        f"{_ANNOTATION}signers": ",".join(sorted(s.key_id for s in contents.signatures)),
        "org.opencontainers.image.title": title,
        "org.opencontainers.image.version": m.version,
        "org.opencontainers.image.description": m.description[:1024],
    }
    return _canonical(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "artifactType": ARTIFACT_TYPE,
            "config": {"mediaType": EMPTY_MEDIA_TYPE, "digest": sha256_digest(EMPTY), "size": 2},
            "layers": [
                {
                    "mediaType": LAYER_MEDIA_TYPE,
                    "digest": sha256_digest(data),
                    "size": len(data),
                    "annotations": {"org.opencontainers.image.title": title},
                }
            ],
            "annotations": annotations,
        }
    )


@dataclass(frozen=True, slots=True)
class Artifact:
    """A skilld package's manifest as read from a store: its digest and its one layer."""

    ref: Reference  # as asked for, pinned to the digest
    digest: str
    manifest: bytes
    layer_digest: str
    layer_size: int
    annotations: dict[str, str]

    @property
    def skill_id(self) -> str | None:
        """The id the annotations claim (a hint for errors; the package decides)."""
        return self.annotations.get(f"{_ANNOTATION}id")


def _parse(ref: Reference, digest: str, data: bytes, cap: int) -> Artifact:
    where = str(ref)
    try:
        body = json.loads(data)
    except ValueError as exc:
        raise DistributionError(f"manifest {digest} is not JSON", location=where) from exc
    if not isinstance(body, dict) or body.get("mediaType") != MANIFEST_MEDIA_TYPE:
        kind = body.get("mediaType") if isinstance(body, dict) else None
        raise DistributionError(
            f"wrong artifact type: {kind or 'a manifest without mediaType'} is not a "
            "skilld package (an OCI image manifest)",
            location=where,
        )
    artifact = body.get("artifactType") or (body.get("config") or {}).get("mediaType")
    if artifact != ARTIFACT_TYPE:
        raise DistributionError(
            f"wrong artifact type: {artifact or 'none'}; a skilld package is {ARTIFACT_TYPE}",
            location=where,
            hint="publish packages with: skilld push NAME.skill REF",
        )
    layers = body.get("layers")
    if not isinstance(layers, list) or len(layers) != 1 or not isinstance(layers[0], dict):
        raise DistributionError("a skilld package artifact has exactly one layer", location=where)
    layer = layers[0]
    ldigest, size = layer.get("digest"), layer.get("size")
    if layer.get("mediaType") != LAYER_MEDIA_TYPE:
        raise DistributionError(
            f"wrong artifact type: its layer is {layer.get('mediaType')}, not {LAYER_MEDIA_TYPE}",
            location=where,
        )
    if (
        not isinstance(ldigest, str)
        or not DIGEST_PATTERN.fullmatch(ldigest)
        or not isinstance(size, int)
        or isinstance(size, bool)
        or size < 0
    ):
        raise DistributionError("the layer's descriptor is malformed", location=where)
    if size > cap:
        raise DistributionError(
            f"layer {ldigest} is {size} bytes, over the {cap}-byte package limit; refused "
            "before downloading",
            location=where,
        )
    notes = body.get("annotations") or {}
    annotations = {str(k): str(v) for k, v in notes.items()} if isinstance(notes, dict) else {}
    return Artifact(ref.pinned(digest), digest, data, ldigest, size, annotations)


def resolve(ref: Reference, options: RegistryOptions, *, cap: int | None = None) -> Artifact:
    """Read ``ref``'s manifest and check that it is a skilld package (no layer is fetched).

    Raises:
        DistributionError: unauthorized, not found, wrong artifact type, over the cap.
        DigestMismatch: the manifest's bytes are not the digest asked for.
    """
    return resolve_in(open_store(ref, options), ref, cap=cap)


def resolve_in(store: Store, ref: Reference, *, cap: int | None = None) -> Artifact:
    """:func:`resolve` with a store already open (one connection for many calls).

    Raises:
        DistributionError, DigestMismatch: as :func:`resolve`.
    """
    cap = package.PackageLimits().max_package_bytes if cap is None else cap
    digest, data, _media = store.get_manifest(ref, [MANIFEST_MEDIA_TYPE], MANIFEST_CAP)
    return _parse(ref, digest, data, cap)


def fetch_layer(store: Store, artifact: Artifact, blobs: Path) -> Path:
    """The package bytes of ``artifact``, in the content-addressed directory ``blobs``
    (already there and intact: not fetched again).

    Raises:
        DistributionError: the layer is missing, over its declared size, cut short.
        DigestMismatch: its bytes are not its digest (names the layer and the reference).
    """
    return _cached(store, artifact.layer_digest, artifact.layer_size, blobs)


def _cached(store: Store, digest: str, size: int, blobs: Path) -> Path:
    """``digest``'s bytes in ``blobs`` (kept copies are checked again before reuse)."""
    dest = blobs / "sha256" / digest.removeprefix("sha256:")
    if dest.is_file():
        if dest.stat().st_size == size and sha256_digest(dest.read_bytes()) == digest:
            return dest
        dest.unlink()
    store.fetch_blob(digest, size, dest)
    return dest


def push_package(data: bytes, ref: Reference, options: RegistryOptions) -> str:
    """Store the package ``data`` at ``ref`` (a registry or ``oci:DIR:TAG``); the digest.

    Raises:
        PackageError: ``data`` is not a well-formed package.
        DistributionError: unauthorized, refused, unreachable; a ``ref`` with a digest.
    """
    if ref.digest is not None or ref.tag is None:
        raise DistributionError(
            "push to a tag (REPO:TAG or oci:DIR:TAG): the digest is the push's answer",
            location=str(ref),
        )
    manifest = artifact_manifest(data)
    store = open_store(ref, options, create=True)
    store.put_blob(EMPTY)
    store.put_blob(data)
    return store.put_manifest(manifest, MANIFEST_MEDIA_TYPE, ref.tag)


def copy_artifact(
    source: Reference, target: Reference, options: RegistryOptions, blobs: Path
) -> Artifact:
    """Copy a skilld package artifact between stores, bytes unchanged (same digest):
    a registry into an image layout that is carried into an air gap, say. The artifact's
    referrers (signatures, SBOMs, attestations others attached) travel with it.

    Raises:
        DistributionError, DigestMismatch: as :func:`resolve` and :func:`fetch_layer`;
            a target without a tag.
    """
    if target.tag is None or target.digest is not None:
        raise DistributionError("copy to a tag (oci:DIR:TAG)", location=str(target))
    src = open_store(source, options)
    artifact = resolve_in(src, source)
    layer = fetch_layer(src, artifact, blobs)
    dst = open_store(target, options, create=True)
    dst.put_blob(EMPTY)
    dst.put_blob(layer.read_bytes())
    dst.put_manifest(artifact.manifest, MANIFEST_MEDIA_TYPE, target.tag)
    for descriptor in src.referrers(artifact.digest):
        _copy_referrer(src, dst, artifact, descriptor, blobs)
    return artifact


def _copy_referrer(
    src: Store, dst: Store, subject: Artifact, descriptor: dict[str, Any], blobs: Path
) -> None:
    """One referrer of ``subject`` (a signature, an SBOM) and its blobs, bytes unchanged.
    Only image manifests are copied (an index referrer is left out), one level deep."""
    if descriptor.get("mediaType") != MANIFEST_MEDIA_TYPE:
        return
    ref = subject.ref.pinned(str(descriptor["digest"]))
    _digest, data, _media = src.get_manifest(ref, [MANIFEST_MEDIA_TYPE], MANIFEST_CAP)
    try:
        body = json.loads(data)
        parts = [body["config"], *body.get("layers", [])]
        wanted = [(str(d["digest"]), int(d["size"])) for d in parts]
    except (ValueError, KeyError, TypeError) as exc:
        raise DistributionError(
            f"referrer {descriptor['digest']} of {subject.digest} is malformed",
            location=str(subject.ref),
        ) from exc
    cap = package.PackageLimits().max_package_bytes
    for digest, size in wanted:
        if size > cap or size < 0 or not DIGEST_PATTERN.fullmatch(digest):
            raise DistributionError(
                f"referrer {descriptor['digest']} lists blob {digest} ({size} bytes): refused",
                location=str(subject.ref),
            )
        dst.put_blob(_cached(src, digest, size, blobs).read_bytes())
    dst.put_referrer(data, MANIFEST_MEDIA_TYPE, subject.digest)
