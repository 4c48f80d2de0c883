"""The CA and the mapping from peer certificates to principals."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tether.controller.auth import Authenticator, Kind
from tether.controller.ca import NODE_URI_PREFIX, CertificateAuthority
from tether.controller.errors import InvalidArgument, PermissionDenied, Unauthenticated
from tether.nodeagent import anonymous
from tether.nodeagent.identity import ca_hash_of_pem, generate_key, make_csr


class Ctx:
    def __init__(self, pem: bytes | None) -> None:
        self._pem = pem

    def auth_context(self) -> dict[str, Any]:
        return {"x509_pem_cert": [self._pem]} if self._pem else {}


@pytest.fixture
def ca(tmp_path: Path) -> CertificateAuthority:
    return CertificateAuthority.load_or_create(tmp_path / "pki")


def test_ca_is_created_once_and_reloaded(tmp_path: Path) -> None:
    first = CertificateAuthority.load_or_create(tmp_path / "pki")
    again = CertificateAuthority.load_or_create(tmp_path / "pki")
    assert first.ca_hash == again.ca_hash == ca_hash_of_pem(first.cert_pem)
    assert (tmp_path / "pki" / "ca.key").stat().st_mode & 0o077 == 0


def test_node_certificate_binds_the_name_and_keeps_the_node_key(ca: CertificateAuthority) -> None:
    key = generate_key()
    issued = ca.sign_node_csr(make_csr(key, "whatever-the-csr-says"), "node-7", days=1)
    cert = x509.load_pem_x509_certificate(issued.cert_pem)
    uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.UniformResourceIdentifier
    )
    assert uris == [NODE_URI_PREFIX + "node-7"]
    node_pub = (
        serialization.load_pem_private_key(key, None)
        .public_key()
        .public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    assert (
        cert.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        == node_pub
    )
    assert Authenticator(ca).principal(Ctx(issued.cert_pem)).kind is Kind.NODE


def test_bad_csr_is_refused(ca: CertificateAuthority) -> None:
    with pytest.raises(InvalidArgument):
        ca.sign_node_csr(
            b"-----BEGIN CERTIFICATE REQUEST-----\nnope\n-----END CERTIFICATE REQUEST-----\n", "n", 1
        )


def test_anonymous_identity_maps_to_anonymous(ca: CertificateAuthority) -> None:
    p = Authenticator(ca).principal(Ctx(anonymous.CERT_PEM))
    assert p.kind is Kind.ANONYMOUS
    with pytest.raises(PermissionDenied):
        p.require_admin(write=False)


def test_anonymous_key_matches_its_certificate() -> None:
    key = serialization.load_pem_private_key(anonymous.key_pem(), None)
    cert = x509.load_pem_x509_certificate(anonymous.CERT_PEM)
    assert key.public_key() == cert.public_key()
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False


def test_a_certificate_signed_with_the_public_anonymous_key_is_refused(ca: CertificateAuthority) -> None:
    anon_key = serialization.load_pem_private_key(anonymous.key_pem(), None)
    assert isinstance(anon_key, ec.EllipticCurvePrivateKey)
    anon_cert = x509.load_pem_x509_certificate(anonymous.CERT_PEM)
    now = dt.datetime.now(dt.timezone.utc)
    forged = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "evil")]))
        .issuer_name(anon_cert.subject)
        .public_key(ec.generate_private_key(ec.SECP256R1()).public_key())
        .serial_number(5)
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier("spiffe://tether/admin/admin/x")]),
            critical=False,
        )
        .sign(anon_key, hashes.SHA256())
    )
    with pytest.raises(Unauthenticated):
        Authenticator(ca).principal(Ctx(forged.public_bytes(serialization.Encoding.PEM)))


def test_a_certificate_from_another_ca_is_refused(ca: CertificateAuthority, tmp_path: Path) -> None:
    other = CertificateAuthority.load_or_create(tmp_path / "other")
    _, issued = other.issue_admin("mallory", "admin")
    with pytest.raises(Unauthenticated):
        Authenticator(ca).principal(Ctx(issued.cert_pem))


def test_admin_roles(ca: CertificateAuthority) -> None:
    auth = Authenticator(ca)
    _, admin = ca.issue_admin("alice", "admin")
    _, ro = ca.issue_admin("bob", "read-only")
    a, r = auth.principal(Ctx(admin.cert_pem)), auth.principal(Ctx(ro.cert_pem))
    a.require_admin(write=True)
    r.require_admin(write=False)
    with pytest.raises(PermissionDenied):
        r.require_admin(write=True)
    with pytest.raises(InvalidArgument):
        ca.issue_admin("eve", "root")


def test_no_client_certificate_is_unauthenticated(ca: CertificateAuthority) -> None:
    with pytest.raises(Unauthenticated):
        Authenticator(ca).principal(Ctx(None))


def test_only_a_controller_certificate_passes_the_server_check(ca: CertificateAuthority) -> None:
    from tether.nodeagent.errors import IdentityError
    from tether.nodeagent.identity import check_server_leaf

    _, chain = ca.server_credentials(["10.0.0.1"])
    check_server_leaf(x509.load_pem_x509_certificate(chain), "x:1")  # the first PEM block is the leaf
    node_cert = ca.sign_node_csr(make_csr(generate_key(), "n"), "n", days=1)
    _, admin = ca.issue_admin("a", "admin")
    for pem in (node_cert.cert_pem, admin.cert_pem):
        with pytest.raises(IdentityError):
            check_server_leaf(x509.load_pem_x509_certificate(pem), "x:1")
