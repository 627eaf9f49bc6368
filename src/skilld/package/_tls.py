"""A private certificate authority and a server certificate, for the cluster's NATS bus.

``skilld cluster nats-config`` writes them next to the nats-server configuration it
generates: the nodes trust the CA (``--nats-tls-ca``), the server presents the
certificate. Keys are ECDSA P-256 (what every TLS stack speaks), written with mode 0600
and never over an existing file; they belong to the operator's deployment and are
never committed.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from skilld.errors import UsageError

_VALID_DAYS = 825


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Where :func:`write_server_tls` put the CA certificate and the server's pair."""

    ca: Path
    cert: Path
    key: Path


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write(path: Path, data: bytes, mode: int) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise UsageError(
            f"{path} exists already", location=str(path), hint="choose an empty --out directory"
        ) from None
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def write_server_tls(out: Path, hosts: list[str]) -> TlsFiles:
    """A fresh CA (``ca.pem``) and a certificate for ``hosts`` it signed
    (``server.pem``, ``server-key.pem``) in ``out``; the CA's key is not kept.

    Raises:
        UsageError: a file exists already, or a host is neither an IP address nor a name.
    """
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("skilld cluster CA")
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=_VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            if not host or any(c.isspace() for c in host):
                raise UsageError(f"{host!r} is not a host name or address") from None
            names.append(x509.DNSName(host))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0] if hosts else "nats"))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=_VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    files = TlsFiles(out / "ca.pem", out / "server.pem", out / "server-key.pem")
    _write(files.ca, ca.public_bytes(serialization.Encoding.PEM), 0o644)
    _write(files.cert, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    _write(
        files.key,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        0o600,
    )
    return files
