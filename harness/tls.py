"""Self-signed certificates made at test time: TLS for the gateway's HTTP and gRPC and for Redis,
on loopback, without a certificate ever being committed."""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import os


@dataclasses.dataclass(frozen=True)
class Certificate:
    cert_file: str  # PEM; also the CA that verifies it (self-signed)
    key_file: str  # PEM, unencrypted, mode 0600

    @property
    def ca_file(self) -> str:
        return self.cert_file


def self_signed(directory: str, name: str = "localhost", days: int = 2) -> Certificate:
    """A key and a self-signed certificate for ``localhost`` and 127.0.0.1 in ``directory``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    os.makedirs(directory, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(name), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = os.path.join(directory, f"{name}.crt"), os.path.join(directory, f"{name}.key")
    with open(cert_file, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    return Certificate(cert_file, key_file)
