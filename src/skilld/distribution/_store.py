"""Where artifacts live: a registry repository (over oras-py) or an OCI image layout.

Both answer the same small :class:`Store` contract, so pushing, pulling and copying never
branch on which one they talk to. Every byte read is checked against the digest that
named it before anyone uses it, and never more bytes than the caller's cap are read.

oras-py (the ORAS project's Python SDK) speaks the registry's authentication: every
request goes through its client, which answers a challenge (``Www-Authenticate: Bearer``
→ the realm → a token, anonymous or bought with basic credentials; or ``Basic``) and
retries the request with it. The distribution API calls themselves (manifests by tag or
digest, blob upload sessions, ranged blob reads, referrers) are single requests made here
through that client: oras-py's own helpers for them return parsed JSON or write files
without the digests, caps and canonical bytes a build needs. It is wrapped, not forked,
where it falls short:

- its request retry sleeps up to 83 s on a refused connection: a build fails at once
  and names the registry (the undecorated request is used);
- it sends no timeout: every request here has one;
- it reads only ``~/.docker/config.json`` and merges files in no fixed order:
  credentials come from :mod:`._auth` (the containers tools' files and order);
- it downloads with no size cap, no resume and no digest check: :meth:`RegistryStore.fetch_blob`
  streams with all three;
- it chooses token or basic authentication once for the client: the registry's own
  challenge (``GET /v2/``) chooses here.

Image layout directories (``oci:DIR``) are plain files (``oci-layout``, ``index.json``,
``blobs/sha256/…``); :class:`LayoutStore` reads and writes them directly, so a build
from a layout needs no network stack at all.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urljoin

from skilld.digest import open_regular
from skilld.distribution._auth import Credential, find_credential
from skilld.distribution._ref import DIGEST_PATTERN, Reference
from skilld.errors import DigestMismatch, DistributionError

INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"
_CHUNK = 1 << 16


@dataclass(frozen=True, slots=True)
class RegistryOptions:
    """How registries are reached (values only).

    Attributes:
        plain_http: registries (``host[:port]``) named for plain HTTP; a loopback
            registry (``localhost``, ``127.0.0.0/8``, ``[::1]``) that does not speak TLS
            is spoken to in plain HTTP without being named.
        ca_file: a PEM bundle of the CAs that sign registries' certificates (default:
            the system's, or ``/etc/containers/certs.d/HOST/ca.crt`` and
            ``/etc/docker/certs.d/HOST/ca.crt`` where they exist).
        auth_files: where credentials are looked up (default: :func:`._auth.auth_files`).
        timeout: seconds for connecting and for each read.
    """

    plain_http: frozenset[str] = frozenset()
    ca_file: Path | None = None
    auth_files: tuple[Path, ...] | None = None
    timeout: float = 30.0


class Store(Protocol):
    """One repository of artifacts, content-addressed by sha256.

    ``get_manifest`` returns ``(digest, bytes, media type)`` for a tag or digest, the
    bytes checked against the digest; ``fetch_blob`` writes a blob's checked bytes to
    ``dest`` (a download cut short resumes from ``dest.partial``); ``put_blob`` and
    ``put_manifest`` store bytes (a manifest under a tag when one is given) and return
    their digest. ``referrers`` lists the descriptors of the manifests whose ``subject`` is
    ``digest`` (signatures, SBOMs, attestations); ``put_referrer`` stores one. Both use the
    registry's referrers API where it has one, and the image spec's tag-schema fallback
    (an index tagged ``sha256-HEX``) where it does not, as in a layout directory.
    """

    def get_manifest(
        self, ref: Reference, accept: Iterable[str], cap: int
    ) -> tuple[str, bytes, str]: ...
    def fetch_blob(self, digest: str, size: int, dest: Path) -> None: ...
    def put_blob(self, data: bytes) -> str: ...
    def put_manifest(self, data: bytes, media_type: str, tag: str | None) -> str: ...
    def referrers(self, digest: str) -> list[dict[str, Any]]: ...
    def put_referrer(self, data: bytes, media_type: str, subject: str) -> str: ...


class NotFound(DistributionError):
    """The store has no such tag, manifest or blob (a registry's 404)."""


def check_digest(digest: object, where: str) -> str:
    """``digest`` when it is ``sha256:`` and 64 lowercase hex digits (it names a file in a
    layout and a path on a registry: nothing else may reach either).

    Raises:
        DistributionError: anything else.
    """
    if not isinstance(digest, str) or not DIGEST_PATTERN.fullmatch(digest):
        raise DistributionError(f"not a sha256 digest: {str(digest)[:80]!r}", location=where)
    return digest


def sha256_digest(data: bytes) -> str:
    """``sha256:<hex>`` of ``data``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


class _Sink:
    """A blob being written to ``dest.partial``: counts, hashes and caps what arrives."""

    def __init__(self, where: str, digest: str, size: int, dest: Path, resume: bool) -> None:
        self.where, self.digest, self.size, self.dest = where, digest, size, dest
        self.partial = dest.with_name(dest.name + ".partial")
        self.hash = hashlib.sha256()
        self.have = 0
        dest.parent.mkdir(parents=True, exist_ok=True)
        if resume and self.partial.is_file() and self.partial.stat().st_size <= size:
            with self.partial.open("rb") as f:
                for chunk in iter(functools.partial(f.read, 1 << 20), b""):
                    self.hash.update(chunk)
                    self.have += len(chunk)
        else:
            self.partial.unlink(missing_ok=True)

    def restart(self) -> None:
        self.hash, self.have = hashlib.sha256(), 0
        self.partial.unlink(missing_ok=True)

    def write(self, chunks: Iterable[bytes]) -> None:
        with self.partial.open("ab") as f:
            for chunk in chunks:
                if self.have + len(chunk) > self.size:
                    self.restart()
                    raise DistributionError(
                        f"blob {self.digest} is larger than the {self.size} bytes its "
                        "manifest declares",
                        location=self.where,
                    )
                f.write(chunk)
                self.hash.update(chunk)
                self.have += len(chunk)

    def finish(self) -> None:
        if self.have < self.size:
            raise DistributionError(
                f"blob {self.digest} stopped at {self.have} of {self.size} bytes",
                location=self.where,
                hint="run again: the download resumes where it stopped",
            )
        got = "sha256:" + self.hash.hexdigest()
        if got != self.digest:
            self.restart()
            raise DigestMismatch(
                f"layer {self.digest} arrived with digest {got}: the registry's copy was "
                "changed or corrupted; refused",
                location=self.where,
            )
        self.partial.replace(self.dest)


def _read_capped(chunks: Iterable[bytes], cap: int, what: str, where: str) -> bytes:
    out = bytearray()
    for chunk in chunks:
        out += chunk
        if len(out) > cap:
            raise DistributionError(f"{what} is larger than {cap} bytes; refused", location=where)
    return bytes(out)


# --- registries -------------------------------------------------------------------------


class RegistryStore:
    """A repository on a registry, through oras-py (see the module's docstring)."""

    def __init__(self, ref: Reference, options: RegistryOptions) -> None:
        """Reach ``ref``'s registry and authenticate as its challenge asks.

        Raises:
            DistributionError: the registry cannot be reached, its certificate does not
                verify, or it requires credentials that no auth file holds.
        """
        import oras.provider
        import requests
        import urllib3

        self._ref = ref
        self._where = str(ref)
        self._requests = requests
        # A connection that drops mid-body: urllib3's errors reach read1's caller unwrapped.
        self._cut = (requests.exceptions.RequestException, urllib3.exceptions.HTTPError)
        host = ref.registry
        self._plain = host in options.plain_http
        self._base = f"{'http' if self._plain else 'https'}://{host}"
        self._verify: bool | str = True
        ca = options.ca_file or next(
            (
                p
                for p in (
                    Path(f"/etc/containers/certs.d/{host}/ca.crt"),
                    Path(f"/etc/docker/certs.d/{host}/ca.crt"),
                )
                if p.is_file()
            ),
            None,
        )
        if ca is not None:
            self._verify = str(ca)
        self._timeout = options.timeout
        files = list(options.auth_files) if options.auth_files is not None else None
        self.credential: Credential | None = find_credential(host, ref.repository, files)
        probe = self._probe(loopback=ref.loopback and not self._plain)
        challenge = probe.headers.get("Www-Authenticate", "")
        scheme = "token" if challenge.lower().startswith("bearer") else "basic"
        self._bearer = scheme == "token"
        if probe.status_code == 401 and scheme == "basic" and self.credential is None:
            raise self._unauthorized()
        registry = oras.provider.Registry(
            hostname=host, insecure=self._plain, tls_verify=self._verify, auth_backend=scheme
        )
        # The undecorated request: oras's retry sleeps for minutes on a refused connection.
        registry.do_request = functools.partial(
            oras.provider.Registry.do_request.__wrapped__, registry
        )
        registry.session.request = functools.partial(
            registry.session.request, timeout=self._timeout
        )
        if self.credential is not None:
            registry.auth.set_basic_auth(self.credential.username, self.credential.password)
        elif scheme == "basic":
            registry.auth._basic_auth = None  # oras reads ORAS_USER/ORAS_PASS; we do not
        self._registry = registry

    def _probe(self, *, loopback: bool) -> Any:
        """``GET /v2/``: reachable, and how it wants to be authenticated. A loopback
        registry that does not speak TLS at all is spoken to in plain HTTP (as Docker does
        for ``localhost``); one whose certificate does not verify is refused, never
        downgraded."""
        requests = self._requests
        try:
            return self._call(requests.get, f"{self._base}/v2/", verify=self._verify)
        except DistributionError as exc:
            cause = exc.__cause__
            if not (loopback and isinstance(cause, requests.exceptions.SSLError)) or (
                "CERTIFICATE_VERIFY_FAILED" in str(cause)
            ):
                raise
        self._plain, self._base = True, f"http://{self._ref.registry}"
        return self._call(requests.get, f"{self._base}/v2/", verify=self._verify)

    def _unauthorized(self) -> DistributionError:
        if self.credential is None:
            hint = (
                "log in with docker/podman/oras login, or put credentials for "
                f"{self._ref.registry} in an auth file ($REGISTRY_AUTH_FILE, "
                "~/.config/containers/auth.json, ~/.docker/config.json)"
            )
        else:
            hint = (
                f"the credentials for {self._ref.registry} in {self.credential.source} were "
                "refused, or do not give access to this repository"
            )
        return DistributionError("unauthorized", location=self._where, hint=hint)

    def _call(self, fn: Any, url: str, **kw: Any) -> Any:
        requests = self._requests
        try:
            return fn(url, timeout=self._timeout, **kw)
        except requests.exceptions.SSLError as exc:
            raise DistributionError(
                f"TLS with {self._ref.registry} failed: {exc}",
                location=self._where,
                hint="give the CA that signed the registry's certificate (ca_file in "
                "sources.yaml, --ca-file, or /etc/containers/certs.d/HOST/ca.crt); a "
                "registry that speaks plain HTTP must be named (plain_http, --plain-http)",
            ) from exc
        except requests.exceptions.RequestException as exc:
            raise DistributionError(
                f"cannot reach {self._ref.registry}: {type(exc).__name__}: {exc}",
                location=self._where,
            ) from exc

    def _request(self, method: str, url: str, **kw: Any) -> Any:
        response = self._send(method, url, **kw)
        auth = self._registry.auth
        if response.status_code == 401 and self._bearer and auth.token is not None:
            # oras keeps the first token it got (a pull scope, say) and offers it again when
            # a push needs a wider scope; forget it so the new challenge's scope is asked for.
            auth.token = None
            kw["headers"] = {
                k: v for k, v in (kw.get("headers") or {}).items() if k != "Authorization"
            }
            response = self._send(method, url, **kw)
        if response.status_code in (401, 403):
            raise self._unauthorized()
        return response

    def _send(self, method: str, url: str, **kw: Any) -> Any:
        requests = self._requests
        try:
            return self._registry.do_request(url, method, **kw)
        except requests.exceptions.SSLError as exc:
            raise DistributionError(f"TLS failed: {exc}", location=self._where) from exc
        except requests.exceptions.RequestException as exc:
            raise DistributionError(
                f"cannot reach {self._ref.registry}: {type(exc).__name__}: {exc}",
                location=self._where,
            ) from exc
        except ValueError as exc:  # oras: "Cannot respond to request for authentication."
            raise self._unauthorized() from exc

    def _fail(self, response: Any, what: str) -> DistributionError:
        if response.status_code == 404:
            return NotFound(f"not found: {what}", location=self._where)
        try:
            errors = [e.get("message", "") for e in response.json().get("errors", [])]
        except (ValueError, AttributeError):
            errors = []
        detail = "; ".join(e for e in errors if e) or response.reason
        return DistributionError(
            f"the registry answered {response.status_code} for {what}: {detail}",
            location=self._where,
        )

    def _blob_url(self, digest: str) -> str:
        return self._url(f"blobs/{check_digest(digest, self._where)}")

    def _url(self, path: str) -> str:
        return f"{self._base}/v2/{self._ref.repository}/{path}"

    def get_manifest(
        self, ref: Reference, accept: Iterable[str], cap: int
    ) -> tuple[str, bytes, str]:
        """See :class:`Store`.

        Raises:
            DistributionError: unauthorized, not found, over ``cap``, unreachable.
            DigestMismatch: the bytes are not the digest that was asked for.
        """
        response = self._request(
            "GET",
            self._url(f"manifests/{ref.target}"),
            headers={"Accept": ", ".join(accept)},
            stream=True,
        )
        with contextlib.closing(response):
            if response.status_code != 200:
                raise self._fail(response, f"manifest {ref.target}")
            data = _read_capped(
                response.iter_content(_CHUNK), cap, f"manifest {ref.target}", self._where
            )
        digest = sha256_digest(data)
        if ref.digest is not None and digest != ref.digest:
            raise DigestMismatch(
                f"manifest {ref.digest} arrived with digest {digest}; refused",
                location=self._where,
            )
        media = response.headers.get("Content-Type", "").split(";")[0].strip()
        return digest, data, media

    def fetch_blob(self, digest: str, size: int, dest: Path) -> None:
        """See :class:`Store`.

        Raises:
            DistributionError: unauthorized, not found, larger than ``size``, cut short.
            DigestMismatch: the bytes are not ``digest`` (the partial file is removed).
        """
        sink = _Sink(self._where, digest, size, dest, resume=True)
        headers = {"Range": f"bytes={sink.have}-"} if 0 < sink.have < size else {}
        if sink.have < size:
            response = self._request(
                "GET", self._blob_url(digest), headers=headers, stream=True
            )
            with contextlib.closing(response):
                if response.status_code == 200:
                    sink.restart()  # the registry ignored the range: start over
                elif response.status_code != 206 or not response.headers.get(
                    "Content-Range", ""
                ).startswith(f"bytes {sink.have}-"):
                    raise self._fail(response, f"blob {digest}")
                # read1: each chunk as it arrives, so a cut connection keeps every byte
                # that came (iter_content drops the chunk it was filling).
                raw = response.raw
                arriving = iter(functools.partial(raw.read1, _CHUNK, decode_content=True), b"")
                try:
                    sink.write(arriving)
                except self._cut as exc:
                    raise DistributionError(
                        f"blob {digest} stopped at {sink.have} of {size} bytes: {exc}",
                        location=self._where,
                        hint="run again: the download resumes where it stopped",
                    ) from exc
        sink.finish()

    def put_blob(self, data: bytes) -> str:
        """See :class:`Store`.

        Raises:
            DistributionError: unauthorized, refused, unreachable.
        """
        digest = sha256_digest(data)
        head = self._request("HEAD", self._blob_url(digest))
        if head.status_code == 200:
            return digest
        start = self._request("POST", self._url("blobs/uploads/"), headers={"Content-Length": "0"})
        location = start.headers.get("Location")
        if start.status_code != 202 or not location:
            raise self._fail(start, "a blob upload")
        url = urljoin(self._base + "/", location)
        url += ("&" if "?" in url else "?") + f"digest={digest}"
        done = self._request(
            "PUT",
            url,
            data=data,
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(len(data))},
        )
        if done.status_code != 201:
            raise self._fail(done, f"blob {digest}")
        return digest

    def referrers(self, digest: str) -> list[dict[str, Any]]:
        """See :class:`Store`: the referrers API, else the tag-schema fallback.

        Raises:
            DistributionError: unauthorized, unreachable, a malformed answer.
        """
        response = self._request(
            "GET", self._url(f"referrers/{check_digest(digest, self._where)}"),
            headers={"Accept": INDEX_MEDIA_TYPE}, stream=True,
        )
        with contextlib.closing(response):
            if response.status_code == 200:  # a registry that has the API never says 404
                index = _read_capped(response.iter_content(_CHUNK), _INDEX_CAP,
                                     f"referrers of {digest}", self._where)
                return _descriptors(index, self._where)
            if response.status_code != 404:
                raise self._fail(response, f"referrers of {digest}")
        return _fallback_referrers(self, self._tagged, digest)

    def put_referrer(self, data: bytes, media_type: str, subject: str) -> str:
        """See :class:`Store`: the manifest by digest; the fallback index too unless the
        registry says (``OCI-Subject``) that it indexed the subject itself.

        Raises:
            DistributionError: unauthorized, refused, unreachable.
        """
        digest, response = self._put_manifest(data, media_type, None)
        if response.headers.get("OCI-Subject") != subject:
            _fallback_add(self, self._tagged, subject, data, media_type)
        return digest

    def _tagged(self, tag: str) -> Reference:
        return Reference(self._ref.registry, self._ref.repository, None, tag, None)

    def put_manifest(self, data: bytes, media_type: str, tag: str | None) -> str:
        """See :class:`Store`.

        Raises:
            DistributionError: unauthorized, refused (the registry's reason), unreachable.
        """
        return self._put_manifest(data, media_type, tag)[0]

    def _put_manifest(self, data: bytes, media_type: str, tag: str | None) -> tuple[str, Any]:
        digest = sha256_digest(data)
        response = self._request(
            "PUT",
            self._url(f"manifests/{tag or digest}"),
            data=data,
            headers={"Content-Type": media_type},
        )
        if response.status_code != 201:
            raise self._fail(response, f"manifest {tag or digest}")
        said = response.headers.get("Docker-Content-Digest")
        if said and said != digest:
            raise DigestMismatch(
                f"the registry stored manifest {said}, not {digest}", location=self._where
            )
        return digest, response


# --- image layout directories -----------------------------------------------------------


class LayoutStore:
    """An OCI image layout directory (image-spec ``image-layout.md``): a registry on disk."""

    def __init__(self, root: Path, *, create: bool = False) -> None:
        """Open the layout at ``root`` (``create``: make an empty one if absent).

        Raises:
            DistributionError: not a layout (no ``oci-layout`` marker of version 1.0.0).
        """
        self.root = root
        self._depth = 0  # how deep this store holds the layout's lock
        marker = root / "oci-layout"
        if create and not marker.exists():
            root.mkdir(parents=True, exist_ok=True)
        with self._exclusive() if create else contextlib.nullcontext():
            if create and not marker.exists():  # checked again under the lock
                self._create()
        try:
            version = json.loads(self._read(marker, 4096, "oci-layout")).get("imageLayoutVersion")
        except (ValueError, AttributeError):
            version = None
        if version != "1.0.0":
            raise DistributionError(
                "not an OCI image layout (no oci-layout file of version 1.0.0)",
                location=str(root),
                hint="make one with: skilld pull REF -o oci:DIR:TAG",
            )

    def _create(self) -> None:
        """An empty layout: the blobs directory, an empty index, then the marker (last, so
        a layout with a marker is whole)."""
        (self.root / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
        empty = {"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE, "manifests": []}
        _atomic_write(self.root / "index.json", json.dumps(empty).encode())
        _atomic_write(self.root / "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')

    def _read(self, path: Path, cap: int, what: str) -> bytes:
        try:
            fd = open_regular(path)
        except FileNotFoundError as exc:
            raise NotFound(f"not found: {what}", location=str(self.root)) from exc
        except OSError as exc:
            raise DistributionError(f"{what}: {exc.strerror}", location=str(self.root)) from exc
        with os.fdopen(fd, "rb") as f:
            data = f.read(cap + 1)
        if len(data) > cap:
            raise DistributionError(f"{what} is larger than {cap} bytes", location=str(self.root))
        return data

    def _blob(self, digest: str) -> Path:
        return self.root / "blobs" / "sha256" / check_digest(digest, str(self.root))[7:]

    def _index(self) -> dict[str, Any]:
        try:
            index = json.loads(self._read(self.root / "index.json", 16 << 20, "index.json"))
        except ValueError as exc:
            raise DistributionError("index.json is not JSON", location=str(self.root)) from exc
        if not isinstance(index, dict) or not isinstance(index.get("manifests"), list):
            raise DistributionError("index.json has no manifests list", location=str(self.root))
        return index

    def tags(self) -> dict[str, str]:
        """Tag → manifest digest, from ``index.json``'s ``ref.name`` annotations."""
        out: dict[str, str] = {}
        for d in self._index()["manifests"]:
            name = (d.get("annotations") or {}).get(REF_NAME) if isinstance(d, dict) else None
            if isinstance(name, str) and isinstance(d.get("digest"), str):
                out[name] = d["digest"]
        return out

    def get_manifest(
        self, ref: Reference, accept: Iterable[str], cap: int
    ) -> tuple[str, bytes, str]:
        """See :class:`Store`.

        Raises:
            DistributionError: the tag or digest is not in the layout, over ``cap``.
            DigestMismatch: the blob's bytes are not its digest.
        """
        digest = ref.digest
        if digest is None:
            digest = self.tags().get(ref.target)
            if digest is None:
                raise NotFound(
                    f"not found: tag {ref.target} (the layout has "
                    f"{', '.join(sorted(self.tags())) or 'no tags'})",
                    location=str(ref),
                )
        data = self._read(self._blob(digest), cap, f"manifest {digest}")
        if sha256_digest(data) != digest:
            raise DigestMismatch(
                f"manifest {digest} has digest {sha256_digest(data)}: the layout was "
                "changed; refused",
                location=str(ref),
            )
        try:
            media = str(json.loads(data).get("mediaType", ""))
        except (ValueError, AttributeError):
            media = ""
        return digest, data, media

    def fetch_blob(self, digest: str, size: int, dest: Path) -> None:
        """See :class:`Store`.

        Raises:
            DistributionError: missing, larger than ``size``.
            DigestMismatch: the bytes are not ``digest``.
        """
        sink = _Sink(str(self.root), digest, size, dest, resume=False)
        path = self._blob(digest)
        try:
            fd = open_regular(path)
        except OSError as exc:
            raise DistributionError(f"not found: blob {digest}", location=str(self.root)) from exc
        with os.fdopen(fd, "rb") as f:
            sink.write(iter(functools.partial(f.read, 1 << 20), b""))
        sink.finish()

    def put_blob(self, data: bytes) -> str:
        """See :class:`Store`."""
        digest = sha256_digest(data)
        path = self._blob(digest)
        if not path.is_file() or sha256_digest(path.read_bytes()) != digest:
            _atomic_write(path, data)
        return digest

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Hold the layout's lock (``flock`` on its directory) while ``index.json`` is read,
        changed and replaced, so two skilld processes writing one layout lose no entry.
        Re-entrant within this store (a referrer's index is written under its own lock)."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise DistributionError(
                f"cannot open the layout: {exc.strerror}", location=str(self.root)
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._depth = 1
            try:
                yield
            finally:
                self._depth = 0
        finally:
            os.close(fd)  # releases the lock

    def put_manifest(self, data: bytes, media_type: str, tag: str | None) -> str:
        """See :class:`Store`: the manifest is a blob; a tag is an ``index.json`` entry."""
        digest = self.put_blob(data)
        with self._exclusive():
            self._index_entry(digest, data, media_type, tag)
        return digest

    def _index_entry(self, digest: str, data: bytes, media_type: str, tag: str | None) -> None:
        index = self._index()
        keep = [
            d
            for d in index["manifests"]
            if isinstance(d, dict)
            and not (tag is not None and (d.get("annotations") or {}).get(REF_NAME) == tag)
        ]
        entry: dict[str, Any] = {"mediaType": media_type, "digest": digest, "size": len(data)}
        with contextlib.suppress(ValueError, AttributeError):
            if artifact := json.loads(data).get("artifactType"):
                entry["artifactType"] = artifact
        if tag is not None:
            entry["annotations"] = {REF_NAME: tag}
        if tag is not None or not any(d.get("digest") == digest for d in keep):
            keep.append(entry)
        index["manifests"] = keep
        _atomic_write(self.root / "index.json", json.dumps(index, indent=2).encode() + b"\n")

    def referrers(self, digest: str) -> list[dict[str, Any]]:
        """See :class:`Store`: a layout has no API; the tag-schema fallback index."""
        return _fallback_referrers(self, self._tagged, digest)

    def put_referrer(self, data: bytes, media_type: str, subject: str) -> str:
        """See :class:`Store`: the manifest as a blob, listed in the fallback index."""
        digest = self.put_blob(data)
        with self._exclusive():
            _fallback_add(self, self._tagged, subject, data, media_type)
        return digest

    def _tagged(self, tag: str) -> Reference:
        return Reference(layout=self.root, tag=tag)


_INDEX_CAP = 4 << 20


def _descriptors(index: bytes, where: str) -> list[dict[str, Any]]:
    try:
        manifests = json.loads(index).get("manifests", [])
    except (ValueError, AttributeError) as exc:
        raise DistributionError("a referrers index is not JSON", location=where) from exc
    if not isinstance(manifests, list) or not all(
        isinstance(d, dict) and isinstance(d.get("digest"), str) for d in manifests
    ):
        raise DistributionError("a referrers index lists malformed descriptors", location=where)
    return manifests


def _fallback_tag(digest: str) -> str:
    """The image spec's referrers tag schema: ``<alg>-<hex>``."""
    return digest.replace(":", "-", 1)


def _fallback_referrers(
    store: Store, tagged: Callable[[str], Reference], digest: str
) -> list[dict[str, Any]]:
    try:
        _d, index, _m = store.get_manifest(tagged(_fallback_tag(digest)), [INDEX_MEDIA_TYPE],
                                           _INDEX_CAP)
    except NotFound:
        return []
    return _descriptors(index, str(tagged(_fallback_tag(digest))))


def _fallback_add(
    store: Store, tagged: Callable[[str], Reference], subject: str, data: bytes, media: str
) -> None:
    """Add the referrer ``data`` to ``subject``'s fallback index (read, extend, write back:
    the spec's procedure; two writers at once can lose one entry, as with any client)."""
    body = json.loads(data)
    entry: dict[str, Any] = {"mediaType": media, "digest": sha256_digest(data), "size": len(data)}
    if artifact := body.get("artifactType") or (body.get("config") or {}).get("mediaType"):
        entry["artifactType"] = artifact
    if body.get("annotations"):
        entry["annotations"] = body["annotations"]
    listed = [d for d in _fallback_referrers(store, tagged, subject)
              if d.get("digest") != entry["digest"]]
    index = {"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE, "manifests": [*listed, entry]}
    store.put_manifest(
        json.dumps(index, sort_keys=True, separators=(",", ":")).encode(),
        INDEX_MEDIA_TYPE,
        _fallback_tag(subject),
    )


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        tmp.chmod(0o644)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def open_store(ref: Reference, options: RegistryOptions, *, create: bool = False) -> Store:
    """The store ``ref`` names (``create``: a layout directory may be made).

    Raises:
        DistributionError: see :class:`RegistryStore` and :class:`LayoutStore`.
    """
    if ref.layout is not None:
        return LayoutStore(ref.layout, create=create)
    return RegistryStore(ref, options)
