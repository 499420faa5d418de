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


CERT_DAYS = 365  # a server certificate's life unless --cert-days says otherwise
CA_DAYS = 3650  # the private CA outlives the server certificates it signs: a renewal keeps every device's ca.crt
WARN_DAYS = 14  # from then on, every check says the server certificate is about to expire


def make_certificates(folder: Path, *, host: str = "127.0.0.1", days: int = CERT_DAYS) -> Certificates:
    """A server certificate for ``host`` and 127.0.0.1 (IP or DNS ``subjectAltName``), signed by the folder's CA.

    The SuperLink serves with the server certificate; SuperNodes and the ``flwr``
    CLI verify it against the CA (``--root-certificates`` / ``root-certificates``).
    127.0.0.1 is always named: on a LAN the SuperLink itself listens there, where the
    operator submits runs and the Fleet gate (``app/local/fleet_gate.py``) reaches it.

    The CA (``ca.crt``, and ``ca.key`` written 0600) is made once per folder, valid
    ``CA_DAYS``, and kept: a later call on the same folder (a deployment restarted with the
    same ``--workdir``) issues a fresh server key and certificate under it, valid ``days``
    (at most until the CA expires), so devices keep the ``ca.crt`` they hold: that is the
    renewal (docs/deployment.md#certificates).

    Raises
    ------
    ValueError
        For ``days`` below 1, a kept ``ca.crt`` without its ``ca.key``, or a kept CA that
        expires within a day (a new CA then means a new ``ca.crt`` on every device).

    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    if days < 1:
        raise ValueError(f"cert-days must be a whole number of days >= 1, got {days}")
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, ca_cert = _kept_ca(folder, now) or _new_ca(folder, now)
    alt_names: list[x509.GeneralName] = []
    for name in dict.fromkeys([host, "127.0.0.1"]):
        try:
            alt_names.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt_names.append(x509.DNSName(name))
    server_key = ec.generate_private_key(ec.SECP384R1())
    until = min(now + datetime.timedelta(days=days), ca_cert.not_valid_after_utc)
    server_cert = (
        x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(ca_cert.subject).public_key(server_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(until)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    paths = Certificates(folder / "ca.crt", folder / "server.pem", folder / "server.key")
    paths.server_cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    write_private(paths.server_key, _private_pem(server_key))
    return paths


def _private_pem(key) -> bytes:  # noqa: ANN001 - a cryptography private key
    from cryptography.hazmat.primitives import serialization

    # the SuperLink reads it unattended; its mode 0600 guards it
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())  # fmt: skip


def _kept_ca(folder: Path, now: datetime.datetime):  # noqa: ANN202 - (key, certificate) or None
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    if not (folder / "ca.crt").is_file():
        return None
    if not (folder / "ca.key").is_file():  # a new CA here would cut off every device holding the old ca.crt
        raise ValueError(f"{folder / 'ca.crt'} is there without its ca.key: put the key back to renew under that CA, "
                         "or move ca.crt away to make a new CA (then every device needs the new ca.crt)")  # fmt: skip
    ca_cert = x509.load_pem_x509_certificate((folder / "ca.crt").read_bytes())
    if ca_cert.not_valid_after_utc < now + datetime.timedelta(days=1):
        raise ValueError(f"the CA in {folder} expired or expires on {ca_cert.not_valid_after_utc:%Y-%m-%d}: move the "
                         "folder away to make a new CA, and give every device the new ca.crt")  # fmt: skip
    return serialization.load_pem_private_key((folder / "ca.key").read_bytes(), password=None), ca_cert


def _new_ca(folder: Path, now: datetime.datetime):  # noqa: ANN202 - (key, certificate)
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "stamen local CA")])
    ca_cert = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    write_private(folder / "ca.key", _private_pem(ca_key))
    (folder / "ca.crt").write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    return ca_key, ca_cert


def certificate_notes(certificates: Certificates, now: datetime.datetime | None = None) -> list[tuple[bool, str]]:
    """What a deployment says of its certificates at start and each day: ``(is_warning, line)`` pairs.

    One line with the server certificate's and the CA's expiry dates; from ``WARN_DAYS``
    before the server certificate expires, a warning with the renewal recipe too.
    """
    from cryptography import x509

    now = now or datetime.datetime.now(datetime.timezone.utc)
    server = x509.load_pem_x509_certificate(certificates.server_cert.read_bytes()).not_valid_after_utc
    ca = x509.load_pem_x509_certificate(certificates.ca_cert.read_bytes()).not_valid_after_utc
    left = (server - now).days
    notes = [(False, f"TLS: the server certificate is valid until {server:%Y-%m-%d %H:%M} UTC ({left} days), the CA "
                     f"until {ca:%Y-%m-%d}")]  # fmt: skip
    if left < WARN_DAYS:
        notes.append((True, f"TLS: the server certificate expires in {max(left, 0)} days ({server:%Y-%m-%d}); devices "
                            "cannot connect after that: restart the deployment with the same --workdir to renew it "
                            "under the same CA (docs/deployment.md#certificates)"))  # fmt: skip
    return notes


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
