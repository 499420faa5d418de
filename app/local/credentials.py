"""Credentials for a deployment: a private CA and server certificate (TLS), SuperNode key pairs (authentication).

Private keys are written readable by their owner only, from the moment they exist (:func:`write_private`).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Certificates:
    """A private CA and a server certificate it signed (PEM files)."""

    ca_cert: Path
    server_cert: Path
    server_key: Path


def write_private(path: Path, data: bytes) -> None:
    """Write a private key readable by its owner only, from the moment it exists.

    The key goes into a new file created with mode 0600 (``O_EXCL``: never one somebody
    else created), which then replaces ``path``; a key written first and chmod'ed after
    would be readable by others in between, or for good if the process died there.
    """
    spare = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}")
    descriptor = os.open(spare, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
        os.replace(spare, path)
    except BaseException:
        spare.unlink(missing_ok=True)
        raise


def make_certificates(folder: Path, *, host: str = "127.0.0.1", days: int = 30) -> Certificates:
    """A CA and a server certificate for ``host`` and 127.0.0.1 (IP or DNS ``subjectAltName``), PEM files in ``folder``.

    The SuperLink serves with the server certificate; SuperNodes and the ``flwr``
    CLI verify it against the CA (``--root-certificates`` / ``root-certificates``).
    127.0.0.1 is always named: on a LAN the SuperLink itself listens there, where the
    operator submits runs and the Fleet gate (``app/local/fleet_gate.py``) reaches it.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "stamen local CA")])
    ca_cert = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    alt_names: list[x509.GeneralName] = []
    for name in dict.fromkeys([host, "127.0.0.1"]):
        try:
            alt_names.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt_names.append(x509.DNSName(name))
    server_key = ec.generate_private_key(ec.SECP384R1())
    server_cert = (
        x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(ca_name).public_key(server_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    paths = Certificates(folder / "ca.crt", folder / "server.pem", folder / "server.key")
    paths.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths.server_cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    unencrypted = serialization.NoEncryption()  # the SuperLink reads it unattended; its mode 0600 guards it
    pem = server_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, unencrypted)
    write_private(paths.server_key, pem)
    return paths


@dataclass(frozen=True)
class NodeKey:
    """A SuperNode's authentication key pair (OpenSSH format, NIST P-384, as Flower expects)."""

    private: Path
    public: Path


def make_node_key(folder: Path, name: str) -> NodeKey:
    """A fresh EC key pair ``<name>`` / ``<name>.pub`` in ``folder`` (what ``ssh-keygen -t ecdsa -b 384`` makes)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    paths = NodeKey(folder / name, folder / f"{name}.pub")
    unencrypted = serialization.NoEncryption()  # flower-supernode reads it unattended; its mode 0600 guards it
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, unencrypted)
    write_private(paths.private, pem)
    paths.public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    )
    return paths
