"""``skills/sources.yaml``: the packages a build takes from registries and layouts.

::

    packages:
      - registry.example.com/acme/notes:1.4.0          # a tag: resolved once, pinned in the lock
      - registry.example.com/acme/search@sha256:9f2c…   # a digest: pinned already
      - oci:../carry:echo-1.0.0                          # an image layout (relative to this file)
    registries:                                          # optional, per registry
      registry.internal:5000:
        plain_http: true                                 # only where named (loopback needs not)
        ca_file: ../certs/internal-ca.pem

Credentials never appear here: they come from the auth files (:mod:`._auth`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from skilld.distribution._artifact import Artifact, fetch_layer, resolve_in
from skilld.distribution._ref import Reference, parse_reference
from skilld.distribution._store import RegistryOptions, Store, open_store
from skilld.errors import DistributionError, SkilldError, UsageError

SOURCES = "sources.yaml"
_MAX = 1 << 20


@dataclass(frozen=True, slots=True)
class SourceEntry:
    """One line of ``packages``: as written, parsed, and where."""

    text: str
    ref: Reference
    where: str  # file:line


@dataclass(frozen=True, slots=True)
class Sources:
    """A parsed ``sources.yaml``."""

    path: Path
    entries: tuple[SourceEntry, ...]
    registries: Mapping[str, RegistryOptions] = field(default_factory=dict)

    def options(self, ref: Reference) -> RegistryOptions:
        """How ``ref``'s registry is reached (defaults unless ``registries`` names it)."""
        return self.registries.get(ref.registry, RegistryOptions())


@dataclass(frozen=True, slots=True)
class Pulled:
    """A package fetched for a build: the entry, the artifact (pinned) and its bytes' file."""

    entry: SourceEntry
    artifact: Artifact
    path: Path


def _fail(path: Path, node: yaml.Node | None, message: str) -> UsageError:
    line = f":{node.start_mark.line + 1}" if node is not None else ""
    return UsageError(message, location=f"{path}{line}")


def read_sources(path: Path) -> Sources:
    """Parse ``sources.yaml``.

    Raises:
        UsageError: not YAML, an unknown key, a bad reference or registry setting
            (names the file and line).
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"unreadable: {exc.strerror}", location=str(path)) from exc
    if len(raw) > _MAX:
        raise UsageError(f"larger than {_MAX} bytes", location=str(path))
    try:
        root = yaml.compose(raw.decode(), Loader=yaml.SafeLoader)
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise UsageError(f"not YAML: {exc}", location=str(path)) from exc
    if root is None:
        return Sources(path, ())
    if not isinstance(root, yaml.MappingNode):
        raise _fail(path, root, "a mapping with packages (and registries) is expected")
    entries: list[SourceEntry] = []
    registries: dict[str, RegistryOptions] = {}
    seen: set[str] = set()
    for key, value in root.value:
        if key.value == "packages":
            if not isinstance(value, yaml.SequenceNode):
                raise _fail(path, value, "packages is a list of references")
            for item in value.value:
                if not isinstance(item, yaml.ScalarNode) or item.tag != "tag:yaml.org,2002:str":
                    raise _fail(path, item, "each package is a reference (a string)")
                try:
                    ref = parse_reference(item.value, base=path.parent)
                except UsageError as exc:
                    raise _fail(path, item, exc.message) from exc
                if item.value in seen:
                    raise _fail(path, item, f"{item.value} is listed twice")
                seen.add(item.value)
                where = f"{path}:{item.start_mark.line + 1}"
                entries.append(SourceEntry(item.value, ref, where))
        elif key.value == "registries":
            if not isinstance(value, yaml.MappingNode):
                raise _fail(path, value, "registries maps a host[:port] to its settings")
            for host, settings in value.value:
                registries[str(host.value)] = _registry(path, str(host.value), settings)
        else:
            raise _fail(path, key, f"unknown key {key.value!r} (packages, registries)")
    return Sources(path, tuple(entries), registries)


def _registry(path: Path, host: str, node: yaml.Node) -> RegistryOptions:
    if not isinstance(node, yaml.MappingNode):
        raise _fail(path, node, f"{host}: settings are a mapping (plain_http, ca_file)")
    plain, ca = False, None
    for key, value in node.value:
        if key.value == "plain_http":
            if value.value not in ("true", "false"):
                raise _fail(path, value, "plain_http is true or false")
            plain = value.value == "true"
        elif key.value == "ca_file":
            ca = path.parent / str(value.value)
            if not ca.is_file():
                raise _fail(path, value, f"ca_file {ca} does not exist")
        else:
            raise _fail(path, key, f"unknown key {key.value!r} (plain_http, ca_file)")
    return RegistryOptions(plain_http=frozenset({host}) if plain else frozenset(), ca_file=ca)


def pull_sources(
    sources: Sources,
    blobs: Path,
    *,
    pinned: Mapping[str, str] | None = None,
    progress: Callable[[str], None] = lambda _m: None,
) -> list[Pulled]:
    """Resolve every entry to a digest (once) and fetch its package into ``blobs``.

    Args:
        pinned: reference as written → digest (a lock's): each entry is fetched by that
            digest and its tag is never asked about; an entry the lock lacks is refused.

    Raises:
        DistributionError: an entry is missing from ``pinned``, or a store refused
            (unauthorized, not found, wrong artifact type, over the cap); names the
            entry's file and line.
        DigestMismatch: a manifest or layer is not its digest (names the layer).
    """
    stores: dict[tuple[str, str, Path | None], Store] = {}  # one per repository or layout
    out: list[Pulled] = []
    for entry in sources.entries:
        ref = entry.ref
        if pinned is not None:
            digest = pinned.get(entry.text)
            if digest is None:
                raise DistributionError(
                    f"{entry.text} is not in the lock the build is pinned to",
                    location=entry.where,
                    hint="build without --locked to resolve and pin it",
                )
            if ref.digest is not None and ref.digest != digest:
                raise DistributionError(
                    f"{entry.text} names {ref.digest}, but the lock pins {digest}",
                    location=entry.where,
                    hint="build without --locked to pin what sources.yaml names",
                )
            ref = ref.pinned(digest)
        try:
            key = (ref.registry, ref.repository, ref.layout)
            if key not in stores:
                stores[key] = open_store(ref, sources.options(ref))
            store = stores[key]
            start = time.monotonic()
            artifact = resolve_in(store, ref)
            path = fetch_layer(store, artifact, blobs)
        except SkilldError as exc:
            exc.location = f"{entry.where}: {exc.location or entry.text}"
            raise
        progress(
            f"pulled {entry.text} -> {artifact.digest[:19]} "
            f"({artifact.layer_size / 1e6:.1f} MB, {time.monotonic() - start:.2f} s)"
        )
        out.append(Pulled(entry, artifact, path))
    return out
