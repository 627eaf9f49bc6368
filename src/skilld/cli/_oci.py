"""``skilld push`` and ``skilld pull``: signed packages to and from OCI registries and
image layout directories (docs/registry.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from skilld import paths
from skilld.errors import UsageError

_REF_HELP = (
    "REGISTRY/REPO:TAG, REGISTRY/REPO@sha256:..., or oci:DIR:TAG for an OCI image layout "
    "directory"
)
_AUTH_NOTE = (
    "Credentials come from the Docker/containers auth files ($REGISTRY_AUTH_FILE, "
    "$XDG_RUNTIME_DIR/containers/auth.json, ~/.config/containers/auth.json, "
    "~/.docker/config.json; written by docker/podman/oras login), never from the command line."
)


def _transport(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ca-file",
        type=Path,
        metavar="PEM",
        help="CA certificates that sign the registry's TLS certificate",
    )
    p.add_argument(
        "--plain-http",
        action="store_true",
        help="talk plain HTTP to this registry (loopback registries need not say so)",
    )


def register(sub: Any) -> None:
    """Add ``skilld push`` and ``skilld pull``."""
    p: argparse.ArgumentParser = sub.add_parser(
        "push",
        help="publish a signed .skill package as an OCI artifact",
        description="Store NAME.skill at REF as an OCI artifact (artifact type "
        "application/vnd.skilld.skill.v1, the package as its one layer, its manifest's facts "
        "as annotations) and print the manifest digest. " + _AUTH_NOTE,
    )
    p.add_argument("package", type=Path, metavar="NAME.skill")
    p.add_argument("ref", metavar="REF", help=_REF_HELP + " (a tag: the digest is the answer)")
    _transport(p)
    p.set_defaults(handler=run_push)

    q: argparse.ArgumentParser = sub.add_parser(
        "pull",
        help="fetch a package from a registry or image layout",
        description="Fetch the package at REF, checking every byte against its digest, into "
        "DIR/ID-VERSION.skill; with -o oci:DIR:TAG copy the artifact unchanged (same digest) "
        "into an image layout directory that can be carried into an air gap. The package's "
        "signatures are checked when it is built (or with skilld verify). " + _AUTH_NOTE,
    )
    q.add_argument("ref", metavar="REF", help=_REF_HELP)
    q.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="DIR|oci:DIR:TAG",
        help="a directory for the .skill file, or an image layout to copy the artifact into",
    )
    _transport(q)
    q.set_defaults(handler=run_pull)


def _options(args: argparse.Namespace, host: str) -> Any:
    from skilld.distribution import RegistryOptions

    return RegistryOptions(
        plain_http=frozenset({host}) if args.plain_http else frozenset(),
        ca_file=args.ca_file,
    )


def run_push(args: argparse.Namespace) -> int:
    """Handle ``skilld push``."""
    from skilld.distribution import parse_reference, push_package

    ref = parse_reference(args.ref)
    try:
        data = args.package.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {args.package}: {exc.strerror}") from exc
    print(push_package(data, ref, _options(args, ref.registry)))
    return 0


def run_pull(args: argparse.Namespace) -> int:
    """Handle ``skilld pull``."""
    from skilld import package
    from skilld.distribution import (
        copy_artifact,
        fetch_layer,
        open_store,
        parse_reference,
        resolve_in,
    )

    ref = parse_reference(args.ref)
    options = _options(args, ref.registry)
    blobs = paths.cache_dir() / "oci" / "blobs"
    if args.output.startswith("oci:"):
        target = parse_reference(args.output)
        artifact = copy_artifact(ref, target, options, blobs)
        print(f"{artifact.digest}  {target}")
        return 0
    store = open_store(ref, options)
    artifact = resolve_in(store, ref)
    data = fetch_layer(store, artifact, blobs).read_bytes()
    manifest = package.read_package(data).manifest
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    target_file = out / f"{manifest.id}-{manifest.version}.skill"
    package.write_atomic(target_file, data)
    print(f"{artifact.digest}  {target_file}")
    return 0
