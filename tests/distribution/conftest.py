"""A real registry per test module: Debian's ``docker-registry`` (the CNCF distribution
server) on a free loopback port, its config and storage in a temp directory."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Registry:
    """A running registry: ``host`` (127.0.0.1:PORT), its storage root, its credentials."""

    host: str
    storage: Path
    user: str | None = None
    password: str | None = None

    def blob_file(self, digest: str) -> Path:
        """Where the registry keeps a blob's bytes (what a tamper test changes)."""
        hexd = digest.removeprefix("sha256:")
        return self.storage / "docker/registry/v2/blobs/sha256" / hexd[:2] / hexd / "data"

    def auth_file(self, path: Path) -> Path:
        """A containers auth.json holding this registry's credentials."""
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        path.write_text(json.dumps({"auths": {self.host: {"auth": token}}}))
        path.chmod(0o600)
        return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_registry(
    root: Path,
    *,
    user: str | None = None,
    password: str | None = None,
    tls: tuple[Path, Path] | None = None,
    token: str = "",
) -> tuple[Registry, subprocess.Popen[bytes]]:
    """Start ``docker-registry`` and wait until ``/v2/`` answers (``token``: the YAML of
    an ``auth: token:`` section, for a token server the test runs)."""
    binary = shutil.which("docker-registry")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("docker-registry is not installed (.ci/run installs it)")
        pytest.skip("docker-registry is not installed (apt-get install docker-registry)")
    root.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    auth = token
    if user is not None:
        import bcrypt

        hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=5)).decode()  # type: ignore[union-attr]
        (root / "htpasswd").write_text(f"{user}:{hashed}\n")
        auth = f"auth:\n  htpasswd:\n    realm: skilld-test\n    path: {root / 'htpasswd'}\n"
    config = root / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log:\n  level: error\n  accesslog:\n    disabled: true\n"
        f"storage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
        "  delete:\n    enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
        + (f"  tls:\n    certificate: {tls[0]}\n    key: {tls[1]}\n" if tls else "")
        + auth
    )
    log = (root / "registry.log").open("wb")
    proc = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                pass
            if tls is None:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1)
            break
        except urllib.error.HTTPError:
            break  # 401: it answers
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"docker-registry did not start: {(root / 'registry.log').read_text()}")
            time.sleep(0.05)
    return Registry(f"127.0.0.1:{port}", root / "data", user, password), proc


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """An open registry (no authentication)."""
    reg, proc = start_registry(tmp_path_factory.mktemp("registry"))
    yield reg
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="module")
def private_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A registry that requires basic authentication (htpasswd, bcrypt)."""
    reg, proc = start_registry(
        tmp_path_factory.mktemp("private"), user="ci", password="s3cret-pass"
    )
    yield reg
    proc.terminate()
    proc.wait(10)


@pytest.fixture(autouse=True)
def _no_user_auth(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Keep the user's own registry logins out of the tests."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in ("REGISTRY_AUTH_FILE", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "DOCKER_CONFIG"):
        monkeypatch.delenv(name, raising=False)


@dataclass(frozen=True)
class Signed:
    """Signed echo-wat packages (two versions) and a trust directory for their key."""

    v1: bytes
    v2: bytes
    stranger: bytes  # 0.1.0 signed by a key nobody trusts
    trust: Path


@pytest.fixture(scope="session")
def signed(tmp_path_factory: pytest.TempPathFactory) -> Signed:
    """echo-wat 0.1.0 and 0.2.0 signed by one key, trusted for echo-wat only."""
    from skilld import package
    from skilld.package.build import build_component
    from support.env import SKILLS, cache_dir

    root = tmp_path_factory.mktemp("echo-wat")
    components = {}
    for version in ("0.1.0", "0.2.0"):  # the component describes its own version
        src = root / version
        shutil.copytree(SKILLS["echo-wat"], src)
        wat = src / "skill.wat"
        wat.write_text(wat.read_text().replace('"0.1.0")  ;; version', f'"{version}")  ;; version'))
        yaml_file = src / "skill.yaml"
        yaml_file.write_text(yaml_file.read_text().replace("version: 0.1.0", f"version: {version}"))
        components[version] = build_component(src, cache_dir=cache_dir()).read_bytes()
    key, other = package.SigningKey.generate(), package.SigningKey.generate()

    def pack(version: str, signer: package.SigningKey) -> bytes:
        meta = package.SkillMeta("echo-wat", "Echo", version, "Echo, from a registry.")
        return package.build_package(meta, components[version], keys=[signer], epoch=0)

    trust = tmp_path_factory.mktemp("trust")
    trusted = package.trusted_key("release", key.public_raw, ["echo-wat"])
    (trust / "release.pub.json").write_bytes(package.trust_file_bytes(trusted))
    return Signed(pack("0.1.0", key), pack("0.2.0", key), pack("0.1.0", other), trust)


def make_tls(root: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a certificate it signs for 127.0.0.1: (ca.pem, cert.pem, key.pem)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "skilld test CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(1)
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(2)
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    paths = root / "ca.pem", root / "cert.pem", root / "key.pem"
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(leaf.public_bytes(pem))
    paths[2].write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


@pytest.fixture(scope="module")
def tls_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Registry, Path]]:
    """A registry serving HTTPS with a certificate from a CA of its own: (registry, ca.pem)."""
    root = tmp_path_factory.mktemp("tls")
    ca, cert, key = make_tls(root)
    reg, proc = start_registry(root / "registry", tls=(cert, key))
    yield reg, ca
    proc.terminate()
    proc.wait(10)


class TokenServer:
    """A bearer-token server as registries use (distribution's token auth): it checks the
    basic credentials sent to its realm and answers a JWT, signed ES256 by a key whose
    certificate (``x5c``) the registry trusts, granting pull and push on the scope asked."""

    def __init__(self, root: Path, user: str, password: str) -> None:
        import datetime
        import http.server
        import threading

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "skilld test token issuer")])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(self.key.public_key()).serial_number(7)
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .sign(self.key, hashes.SHA256())
        )
        self.bundle = root / "token-ca.pem"
        self.bundle.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        self.expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.issued: list[str] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                from urllib.parse import parse_qs, urlparse

                query = parse_qs(urlparse(self.path).query)
                if self.headers.get("Authorization") != server.expected:
                    self.send_response(401)
                    self.end_headers()
                    return
                scope = query.get("scope", [""])[0]
                body = json.dumps({"token": server.token(query["service"][0], scope)}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.realm = f"http://127.0.0.1:{self.httpd.server_address[1]}/token"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def token(self, service: str, scope: str) -> str:
        """A JWT for ``scope`` (``repository:NAME:pull,push``), as distribution checks it."""
        import time as _time

        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

        def b64(data: bytes) -> str:
            return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

        der = self.cert.public_bytes(serialization.Encoding.DER)
        header = {"typ": "JWT", "alg": "ES256", "x5c": [base64.b64encode(der).decode()]}
        now = int(_time.time())
        access = []
        if scope.startswith("repository:"):
            _kind, name, actions = scope.split(":", 2)
            access = [{"type": "repository", "name": name, "actions": actions.split(",")}]
        claims = {"iss": "skilld-test", "sub": "ci", "aud": service, "exp": now + 300,
                  "nbf": now - 10, "iat": now, "jti": f"t{len(self.issued)}", "access": access}
        signing = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
        r, s = decode_dss_signature(self.key.sign(signing.encode(), ec.ECDSA(hashes.SHA256())))
        token = f"{signing}.{b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"
        self.issued.append(scope)
        return token

    def close(self) -> None:
        """Stop serving."""
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def token_registry(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Registry, TokenServer]]:
    """A registry that requires bearer tokens from a token server (as GHCR, Harbor, GitLab do)."""
    root = tmp_path_factory.mktemp("token")
    tokens = TokenServer(root, "ci", "t0ken-pass")
    section = (
        f"auth:\n  token:\n    realm: {tokens.realm}\n    service: skilld-test-registry\n"
        f"    issuer: skilld-test\n    rootcertbundle: {tokens.bundle}\n"
    )
    reg, proc = start_registry(root / "registry", token=section)
    yield Registry(reg.host, reg.storage, "ci", "t0ken-pass"), tokens
    proc.terminate()
    proc.wait(10)
    tokens.close()


class CuttingProxy:
    """A TCP proxy to a registry that drops the connection ``after`` bytes into the first
    blob download it forwards (a network cut mid-download), and forwards all else whole."""

    def __init__(self, target: str, after: int) -> None:
        import threading

        self.target = target
        self.after = after
        self.cut = threading.Event()
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.host = f"127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            host, port = self.target.split(":")
            upstream = socket.create_connection((host, int(port)))
            blob = threading.Event()
            threading.Thread(target=self._up, args=(client, upstream, blob), daemon=True).start()
            threading.Thread(
                target=self._down, args=(upstream, client, blob), daemon=True
            ).start()

    def _up(self, client: socket.socket, upstream: socket.socket, blob: object) -> None:
        import threading

        assert isinstance(blob, threading.Event)
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                if b"GET /v2/" in data and b"/blobs/sha256:" in data and not self.cut.is_set():
                    blob.set()
                upstream.sendall(data)

    def _down(self, upstream: socket.socket, client: socket.socket, blob: object) -> None:
        import threading

        assert isinstance(blob, threading.Event)
        sent = 0
        with contextlib.suppress(OSError):
            while data := upstream.recv(1024):
                if blob.is_set():
                    if sent + len(data) > self.after:
                        client.sendall(data[: self.after - sent])
                        self.cut.set()
                        break
                    sent += len(data)
                client.sendall(data)
        for s in (client, upstream):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        """Stop accepting connections."""
        self.listener.close()
