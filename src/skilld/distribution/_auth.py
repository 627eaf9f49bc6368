"""Registry credentials, read from the auth files Docker and the containers tools write.

Never from the command line (argv is visible to every user of the machine) nor from
skilld's own configuration: operators already log in with ``docker login``,
``podman login``, ``skopeo login`` or ``oras login``, and those write one of these files.
The first file that holds an entry for the registry wins, in the containers tools'
order (containers-auth.json(5)):

1. ``$REGISTRY_AUTH_FILE``;
2. ``$XDG_RUNTIME_DIR/containers/auth.json``;
3. ``$XDG_CONFIG_HOME/containers/auth.json`` (``~/.config/containers/auth.json``);
4. ``$DOCKER_CONFIG/config.json`` (``~/.docker/config.json``).

Within a file the most specific key wins: ``host/namespace/repo`` before ``host``
(containers' per-repository credentials); ``https://host`` and Docker's legacy
``https://host/v1/`` spellings mean ``host``. Credential helpers (``credsStore``,
``credHelpers``) are not run: a build runs no program it was not given.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from dataclasses import dataclass
from pathlib import Path

from skilld.errors import DistributionError


@dataclass(frozen=True, slots=True)
class Credential:
    """A user name and secret for one registry, and the file they came from."""

    username: str
    password: str
    source: Path

    def __repr__(self) -> str:  # never print the secret
        return f"Credential(username={self.username!r}, source={str(self.source)!r})"


def auth_files(env: dict[str, str] | None = None) -> list[Path]:
    """The auth files to look in, in order (they need not exist)."""
    env = dict(os.environ) if env is None else env
    home = Path(env.get("HOME") or Path.home())
    files: list[Path] = []
    if env.get("REGISTRY_AUTH_FILE"):
        files.append(Path(env["REGISTRY_AUTH_FILE"]))
    if env.get("XDG_RUNTIME_DIR"):
        files.append(Path(env["XDG_RUNTIME_DIR"]) / "containers" / "auth.json")
    config = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else home / ".config"
    files.append(config / "containers" / "auth.json")
    docker = Path(env["DOCKER_CONFIG"]) if env.get("DOCKER_CONFIG") else home / ".docker"
    files.append(docker / "config.json")
    return files


def _key(raw: str) -> str:
    for scheme in ("https://", "http://"):
        raw = raw.removeprefix(scheme)
    for suffix in ("/v1/", "/v2/", "/v1", "/v2"):
        raw = raw.removesuffix(suffix)
    return raw.rstrip("/")


def _decode(entry: object, where: Path, key: str) -> tuple[str, str] | None:
    if not isinstance(entry, dict):
        raise DistributionError(f"the entry for {key} is not an object", location=str(where))
    if entry.get("auth"):
        try:
            user, sep, secret = (
                base64.b64decode(entry["auth"], validate=True).decode().partition(":")
            )
        except (binascii.Error, ValueError, TypeError) as exc:
            raise DistributionError(
                f"the entry for {key} has an auth field that is not base64 of user:password",
                location=str(where),
            ) from exc
        if not sep:
            raise DistributionError(
                f"the entry for {key} has an auth field without user:password",
                location=str(where),
            )
        return user, secret
    if isinstance(entry.get("username"), str) and isinstance(entry.get("password"), str):
        return entry["username"], entry["password"]
    return None


def find_credential(
    registry: str, repository: str, files: list[Path] | None = None
) -> Credential | None:
    """The credential for ``registry/repository``, or ``None`` (anonymous).

    Raises:
        DistributionError: an auth file that exists is not JSON or has a malformed entry
            for this registry (names the file).
    """
    wanted = f"{registry}/{repository}"
    for path in auth_files() if files is None else files:
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise DistributionError(f"unreadable: {exc.strerror}", location=str(path)) from exc
        try:
            auths = json.loads(raw).get("auths", {})
        except (ValueError, AttributeError) as exc:
            raise DistributionError(
                "not a Docker/containers auth file (JSON with an auths object)",
                location=str(path),
            ) from exc
        if not isinstance(auths, dict):
            raise DistributionError("auths is not an object", location=str(path))
        best: tuple[int, str] | None = None
        for key in auths:
            k = _key(str(key))
            if (wanted == k or wanted.startswith(k + "/")) and (best is None or len(k) > best[0]):
                best = (len(k), key)
        if best is None:
            continue
        pair = _decode(auths[best[1]], path, best[1])
        if pair is not None:
            return Credential(pair[0], pair[1], path)
    return None
