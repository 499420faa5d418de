"""A deployment's certificates: their lifetime, the warning before expiry, and a renewal that keeps the CA."""

from __future__ import annotations

import datetime
import shutil
import stat

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from app.local import credentials
from app.local.credentials import CA_DAYS, WARN_DAYS, certificate_notes, make_certificates
from app.local.deployment_cli import main as deployment_main

DAY = datetime.timedelta(days=1)


def load(path):
    return x509.load_pem_x509_certificate(path.read_bytes())


def signed_by(certificate: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        ca.public_key().verify(certificate.signature, certificate.tbs_certificate_bytes,
                               ec.ECDSA(certificate.signature_hash_algorithm))  # fmt: skip
    except Exception:  # noqa: BLE001 - cryptography's InvalidSignature, or a key of another kind
        return False
    return True


def test_the_server_certificate_lives_the_days_asked_and_the_ca_ten_years(tmp_path):
    now = datetime.datetime.now(datetime.timezone.utc)
    certificates = make_certificates(tmp_path / "certs", days=400)
    server, ca = load(certificates.server_cert), load(certificates.ca_cert)
    assert abs(server.not_valid_after_utc - (now + 400 * DAY)) < datetime.timedelta(minutes=1)
    assert abs(ca.not_valid_after_utc - (now + CA_DAYS * DAY)) < datetime.timedelta(minutes=1)
    assert signed_by(server, ca)
    for private in (tmp_path / "certs" / "ca.key", certificates.server_key):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600, private


def test_a_server_certificate_never_outlives_its_ca(tmp_path):
    certificates = make_certificates(tmp_path, days=CA_DAYS + 1000)
    assert load(certificates.server_cert).not_valid_after_utc == load(certificates.ca_cert).not_valid_after_utc


def test_a_renewal_keeps_the_ca_so_a_device_s_old_ca_crt_trusts_the_new_certificate(tmp_path):
    first = make_certificates(tmp_path / "certs", host="192.168.1.10", days=30)
    device_ca = tmp_path / "device-ca.crt"  # what a device was given at enrolment
    shutil.copy(first.ca_cert, device_ca)
    old_server = first.server_cert.read_bytes()
    renewed = make_certificates(tmp_path / "certs", host="192.168.1.10", days=365)
    assert renewed.ca_cert.read_bytes() == device_ca.read_bytes()
    assert renewed.server_cert.read_bytes() != old_server
    new = load(renewed.server_cert)
    assert signed_by(new, load(device_ca))
    assert new.not_valid_after_utc - load(tmp_path / "device-ca.crt").not_valid_before_utc > 300 * DAY
    assert not signed_by(new, load(make_certificates(tmp_path / "elsewhere").ca_cert))  # the check can fail


def test_a_ca_certificate_without_its_key_or_about_to_expire_is_refused_not_replaced(tmp_path, monkeypatch):
    made = make_certificates(tmp_path / "certs")
    (tmp_path / "certs" / "ca.key").unlink()
    kept = made.ca_cert.read_bytes()
    with pytest.raises(ValueError, match="ca.crt is there without its ca.key: put the key back"):
        make_certificates(tmp_path / "certs")
    assert made.ca_cert.read_bytes() == kept
    monkeypatch.setattr(credentials, "CA_DAYS", 1)  # a CA that expires within a day
    make_certificates(tmp_path / "short")
    with pytest.raises(ValueError, match="the CA in .* expired or expires on .*: move the folder away"):
        make_certificates(tmp_path / "short")
    with pytest.raises(ValueError, match="cert-days must be a whole number of days >= 1, got 0"):
        make_certificates(tmp_path / "zero", days=0)


def test_the_notes_give_both_dates_and_warn_from_fourteen_days_before_expiry(tmp_path):
    certificates = make_certificates(tmp_path, days=90)
    expiry = load(certificates.server_cert).not_valid_after_utc
    (warning, line), *rest = certificate_notes(certificates)
    assert not warning and not rest
    assert f"valid until {expiry:%Y-%m-%d}" in line and "(89 days)" in line and "the CA until" in line
    assert len(certificate_notes(certificates, now=expiry - WARN_DAYS * DAY - DAY)) == 1
    notes = certificate_notes(certificates, now=expiry - 5 * DAY + datetime.timedelta(minutes=1))
    assert [warning for warning, _ in notes] == [False, True]
    assert "expires in 4 days" in notes[1][1] and "restart the deployment with the same --workdir" in notes[1][1]


def test_the_helper_refuses_a_certificate_life_below_a_day_before_starting_anything(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        deployment_main(["--tls", "--cert-days", "0", "--workdir", str(tmp_path / "w")])
    assert exit_.value.code == 2
    assert "--cert-days must be a whole number of days >= 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()
