"""A real registry per test module: Debian's ``docker-registry`` (the CNCF distribution
server) on a free loopback port, its config and storage in a temp directory."""

from __future__ import annotations

import base64
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
) -> tuple[Registry, subprocess.Popen[bytes]]:
    """Start ``docker-registry`` and wait until ``/v2/`` answers."""
    binary = shutil.which("docker-registry")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("docker-registry is not installed (.ci/run installs it)")
        pytest.skip("docker-registry is not installed (apt-get install docker-registry)")
    root.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    auth = ""
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
