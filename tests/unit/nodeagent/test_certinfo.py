"""The agent reads its certificate's serial and validity without the crypto library."""

from __future__ import annotations

import datetime as dt

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tether.nodeagent.certinfo import read_certinfo
from tether.nodeagent.errors import IdentityError


def make_cert(not_before: dt.datetime, not_after: dt.datetime, serial: int) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, "n" * 64),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "o" * 64),  # long names: multi-byte lengths
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (dt.datetime(2026, 11, 30, 5, 4, 3), dt.datetime(2027, 2, 28, 5, 4, 3)),  # UTCTime
        (dt.datetime(2025, 1, 1), dt.datetime(2125, 1, 1)),  # GeneralizedTime after 2049
    ],
)
def test_matches_the_crypto_library(before: dt.datetime, after: dt.datetime) -> None:
    serial = x509.random_serial_number()
    pem = make_cert(before, after, serial)
    info = read_certinfo(pem)
    cert = x509.load_pem_x509_certificate(pem)
    assert info.serial_number == cert.serial_number == serial
    assert info.not_valid_before == cert.not_valid_before_utc
    assert info.not_valid_after == cert.not_valid_after_utc


@pytest.mark.parametrize("pem", [b"", b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"])
def test_garbage_is_an_identity_error(pem: bytes) -> None:
    with pytest.raises(IdentityError):
        read_certinfo(pem)
