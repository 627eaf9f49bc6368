"""Skills from a registry: signed ``.skill`` packages as OCI artifacts.

A registry (or an OCI image layout directory, ``oci:DIR``, the air gap's registry) is a
transport, never a source of trust: a package pulled from one is verified exactly like a
file in ``skills/`` (signatures, trust scopes, rollback), and only ``skilld build``,
``push`` and ``pull`` reach a registry. A bundle holds the packages it was built from, so
serving never does.

- :mod:`._ref`: the reference grammar (``REGISTRY/REPO:TAG``, ``@sha256:…``, ``oci:DIR:TAG``);
- :mod:`._auth`: credentials from the Docker/containers auth files;
- :mod:`._store`: a registry through oras-py, or a layout directory, behind one contract;
- :mod:`._artifact`: the artifact's media types; push, resolve, fetch, copy;
- :mod:`._sources`: ``skills/sources.yaml``, resolved once and pinned in the lock.
"""

from skilld.distribution._artifact import (
    ARTIFACT_TYPE,
    LAYER_MEDIA_TYPE,
    Artifact,
    artifact_manifest,
    copy_artifact,
    fetch_layer,
    push_package,
    resolve,
    resolve_in,
)
from skilld.distribution._auth import Credential, auth_files, find_credential
from skilld.distribution._ref import Reference, parse_reference
from skilld.distribution._sources import (
    SOURCES,
    Pulled,
    SourceEntry,
    Sources,
    pull_sources,
    read_sources,
)
from skilld.distribution._store import (
    LayoutStore,
    RegistryOptions,
    RegistryStore,
    Store,
    open_store,
)

__all__ = [
    "ARTIFACT_TYPE",
    "LAYER_MEDIA_TYPE",
    "SOURCES",
    "Artifact",
    "Credential",
    "LayoutStore",
    "Pulled",
    "Reference",
    "RegistryOptions",
    "RegistryStore",
    "SourceEntry",
    "Sources",
    "Store",
    "artifact_manifest",
    "auth_files",
    "copy_artifact",
    "fetch_layer",
    "find_credential",
    "open_store",
    "parse_reference",
    "pull_sources",
    "push_package",
    "read_sources",
    "resolve",
    "resolve_in",
]
