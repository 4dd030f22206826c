"""The control plane's certificates and keys, made with ``cryptography``.

Two authorities, as a cluster has them: the cluster CA signs kube-apiserver's serving
certificate and every client certificate (the user is the common name, the groups are the
organizations, which is how kube-apiserver reads a client certificate), and the front-proxy
CA signs only the certificate kube-apiserver's aggregator shows to an aggregated API server.
The service-account key pair signs and checks service-account tokens. Keys are ECDSA P-256:
quick to make, and every part here accepts them.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_FOR = datetime.timedelta(days=7)  # a test plane lives minutes; a week survives a skewed clock
CLOCK_SKEW = datetime.timedelta(hours=1)


@dataclass(frozen=True)
class Pair:
    """A certificate and its key, as PEM files."""

    cert: Path
    key: Path

    def pem(self) -> tuple[bytes, bytes]:
        return self.cert.read_bytes(), self.key.read_bytes()


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str, organizations: Iterable[str] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    return x509.Name([*attributes, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _alternative_names(hosts: Iterable[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


class Authority:
    """A self-signed CA whose certificate is ``DIR/NAME.crt``."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory = directory
        self.name = name
        self._key = _key()
        now = datetime.datetime.now(datetime.UTC)
        subject = _name(f"sandboxctl-test-{name}")
        self._subject = subject
        certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW)
            .not_valid_after(now + VALID_FOR)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.cert = directory / f"{name}.crt"
        self.cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))

    def issue(
        self,
        filename: str,
        common_name: str,
        *,
        organizations: Iterable[str] = (),
        hosts: Iterable[str] = (),
    ) -> Pair:
        """A leaf certificate: for serving when ``hosts`` are given, else for a client."""
        key = _key()
        now = datetime.datetime.now(datetime.UTC)
        hosts = list(hosts)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if hosts else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, organizations))
            .issuer_name(self._subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW)
            .not_valid_after(now + VALID_FOR)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if hosts:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(_alternative_names(hosts)), critical=False
            )
        certificate = builder.sign(self._key, hashes.SHA256())
        pair = Pair(self.directory / f"{filename}.crt", self.directory / f"{filename}.key")
        pair.cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        pair.key.write_bytes(_key_pem(key))
        pair.key.chmod(0o600)
        return pair


def service_account_keys(directory: Path) -> Pair:
    """The key pair that signs service-account tokens: ``sa.key`` and its public ``sa.pub``
    (in the Pair's ``cert`` slot, which is what kube-apiserver's key-file flag reads)."""
    key = _key()
    pair = Pair(directory / "sa.pub", directory / "sa.key")
    pair.key.write_bytes(_key_pem(key))
    pair.key.chmod(0o600)
    pair.cert.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pair
