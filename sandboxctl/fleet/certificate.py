"""The self-signed certificate ``serve`` serves its Sandbox API with.

kubectl sends a kubeconfig's token only over HTTPS (client-go reads a user's credentials
only for a TLS transport), so the one-host fleet's Sandbox API speaks HTTPS: with a
certificate of its own, made on the first start, that its kubeconfig trusts. It names
the address every API listens on, loopback and ``localhost``; a new one is made when it
lacks the address, has expired or its files are gone.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sandboxctl.secretfiles import write_private
from sandboxctl.serving import Tls

log = logging.getLogger("sandboxctl.serve")

CERT_FILE = "kube-tls.crt"
KEY_FILE = "kube-tls.key"
VALID_DAYS = 825  # what browsers and Go accept for a server certificate
RENEW_BEFORE = datetime.timedelta(days=30)


def fleet_certificate(state_dir: Path, host: str) -> Tls:
    """``DIR/kube-tls.crt`` and ``DIR/kube-tls.key`` (both 0600) for ``host``, made when
    missing, expiring or not naming ``host``; reused otherwise."""
    cert_file, key_file = state_dir / CERT_FILE, state_dir / KEY_FILE
    names = _names(host)
    if not _usable(cert_file, key_file, names):
        cert_pem, key_pem = _self_signed(names)
        write_private(key_file, key_pem)
        write_private(cert_file, cert_pem)
        log.info("created %s for %s", cert_file, ", ".join(str(name.value) for name in names))
    return Tls(cert_file, key_file)


def _names(host: str) -> list[x509.GeneralName]:
    found: list[x509.GeneralName] = [x509.DNSName("localhost")]
    for text in ("127.0.0.1", "::1", host):
        try:
            name: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(text))
        except ValueError:
            name = x509.DNSName(text)
        if name not in found and text not in ("", "0.0.0.0", "::"):
            found.append(name)
    return found


def _usable(cert_file: Path, key_file: Path, names: list[x509.GeneralName]) -> bool:
    try:
        certificate = x509.load_pem_x509_certificate(cert_file.read_bytes())
        key_file.stat()
    except (OSError, ValueError):
        return False
    now = datetime.datetime.now(datetime.UTC)
    if certificate.not_valid_after_utc - RENEW_BEFORE < now:
        return False
    try:
        present = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return False
    return all(name in present.value for name in names)


def _self_signed(names: list[x509.GeneralName]) -> tuple[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sandboxctl serve")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return certificate.public_bytes(serialization.Encoding.PEM).decode(), key_pem.decode()
