"""OCI references: ``REGISTRY/REPO[:TAG][@sha256:HEX]`` and ``oci:DIR[:TAG][@sha256:HEX]``.

The grammar is the distribution specification's (lowercase repository path components,
tags of at most 128 characters), with two choices of ours: the registry is always named
(no implicit Docker Hub: a reference in a lock must mean one place), and the only digest
algorithm is sha256 (what every registry computes, and what the lock records).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from skilld.errors import UsageError

_HOST = re.compile(
    r"(?:localhost|\[[0-9a-fA-F:]+\]|[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*)(?::[0-9]{1,5})?"
)
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPO = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
# The one digest algorithm: what registries compute and the lock records.
DIGEST_PATTERN = re.compile(r"sha256:[a-f0-9]{64}")
_LOOPBACK = ("localhost", "127.0.0.1", "[::1]")


@dataclass(frozen=True, slots=True)
class Reference:
    """A parsed reference: a registry repository (``registry``, ``repository``) or an
    image layout directory (``layout``), with a tag, a digest or both (the digest wins
    when both are given: the tag is then only a label)."""

    registry: str = ""
    repository: str = ""
    layout: Path | None = None
    tag: str | None = None
    digest: str | None = None

    @property
    def is_layout(self) -> bool:
        """The reference names an OCI image layout directory, not a registry."""
        return self.layout is not None

    @property
    def loopback(self) -> bool:
        """The registry is this machine (plain HTTP is allowed without being named)."""
        host = (
            self.registry.rsplit(":", 1)[0]
            if not self.registry.startswith("[")
            else (self.registry.split("]")[0] + "]")
        )
        return host in _LOOPBACK or host.startswith("127.")

    @property
    def target(self) -> str:
        """What a manifest request names: the digest when known, else the tag."""
        target = self.digest or self.tag
        assert target is not None  # parse() requires one
        return target

    def pinned(self, digest: str) -> Reference:
        """This reference with ``digest`` (the tag kept as a label)."""
        return Reference(self.registry, self.repository, self.layout, self.tag, digest)

    def __str__(self) -> str:
        where = (
            f"oci:{self.layout}"
            if self.layout is not None
            else (f"{self.registry}/{self.repository}")
        )
        return (
            where
            + (f":{self.tag}" if self.tag else "")
            + (f"@{self.digest}" if self.digest else "")
        )


def parse_reference(text: str, *, base: Path | None = None) -> Reference:
    """Parse ``REGISTRY/REPO:TAG``, ``REGISTRY/REPO@sha256:HEX`` or ``oci:DIR[:TAG]``.

    Args:
        base: where a relative layout directory is found (default: as given).

    Raises:
        UsageError: not a reference of this grammar (the message says which part).
    """
    if not isinstance(text, str) or not text or len(text) > 4096 or not text.isprintable():
        raise UsageError(f"not an OCI reference: {text!r}")
    rest, at, digest = text.partition("@")
    if at and not DIGEST_PATTERN.fullmatch(digest):
        raise UsageError(f"{text}: a digest is sha256: and 64 lowercase hex digits")
    if rest.startswith("oci:"):
        path, tag = rest[4:], None
        head, colon, tail = path.rpartition(":")
        if colon and "/" not in tail:
            path, tag = head, tail
        if not path:
            raise UsageError(f"{text}: oci: names a layout directory (oci:DIR:TAG)")
        if tag is not None and not _TAG.fullmatch(tag):
            raise UsageError(f"{text}: {tag!r} is not a tag ([A-Za-z0-9_][A-Za-z0-9._-]*)")
        if tag is None and not at:
            raise UsageError(f"{text}: name a tag or a digest (oci:DIR:TAG)")
        layout = Path(path) if base is None or Path(path).is_absolute() else base / path
        return Reference(layout=layout, tag=tag, digest=digest or None)
    host, slash, name = rest.partition("/")
    if (
        not slash
        or not _HOST.fullmatch(host)
        or ("." not in host and ":" not in host and host != "localhost")
    ):
        raise UsageError(
            f"{text}: name the registry (REGISTRY/REPO:TAG, e.g. ghcr.io/acme/notes:1.0.0); "
            "an image layout directory is oci:DIR:TAG"
        )
    repo, tag = name, None
    head, colon, tail = name.rpartition(":")
    if colon:
        repo, tag = head, tail
        if not _TAG.fullmatch(tag):
            raise UsageError(f"{text}: {tag!r} is not a tag ([A-Za-z0-9_][A-Za-z0-9._-]*)")
    if not _REPO.fullmatch(repo) or len(host) + 1 + len(repo) > 255:
        raise UsageError(f"{text}: {repo!r} is not a repository (lowercase a-z0-9 . _ - /)")
    if tag is None and not at:
        raise UsageError(f"{text}: name a tag or a digest (REPO:TAG or REPO@sha256:...)")
    return Reference(host, repo, None, tag, digest or None)
