"""The controller's certificate authority.

One CA (EC P-256) created on first start under ``DATA_DIR/pki`` (or, with ``--store-key-file``,
sealed in the store: ``tether.controller.identity``). It signs the
controller's serving certificate (regenerated at every start), node
certificates from CSRs (the node keeps its key) and admin client
certificates. Identities are URI SANs: ``spiffe://tether/node/NAME`` and
``spiffe://tether/admin/ROLE/NAME``; an admin limited to some environments carries one more
URI SAN per environment, ``spiffe://tether/admin-environment/ENV`` (none: every environment).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tether.controller.errors import InvalidArgument
from tether.nodeagent.identity import (
    CONTROLLER_SERVER_NAME,
    generate_key,
    read_private,
    spki_hash,
    write_private,
)

NODE_URI_PREFIX = "spiffe://tether/node/"
ADMIN_URI_PREFIX = "spiffe://tether/admin/"
ADMIN_SCOPE_URI_PREFIX = "spiffe://tether/admin-environment/"
ADMIN_ROLES = ("admin", "read-only")


# Certificates start a little in the past, for clocks that lag ours; at most a tenth of a short
# lifetime, so that a certificate is never mostly backdate (an agent renews with a third left).
BACKDATE = dt.timedelta(minutes=5)


def backdate(days: float) -> dt.timedelta:
    return min(BACKDATE, dt.timedelta(days=days) / 10)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _pem_of_der(der: bytes) -> bytes:
    """What ``_pem`` gives, from the DER already at hand (a certificate is encoded anew on
    every ``public_bytes``): base64 in lines of 64 between the CERTIFICATE armour lines."""
    b64 = base64.b64encode(der)
    lines = [b64[i : i + 64] for i in range(0, len(b64), 64)]
    return b"-----BEGIN CERTIFICATE-----\n" + b"\n".join(lines) + b"\n-----END CERTIFICATE-----\n"


def _key_usage(*, cert_sign: bool = False) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


# The extensions every leaf certificate carries, made once (they are immutable).
_LEAF = x509.BasicConstraints(ca=False, path_length=None)
_LEAF_USAGE = _key_usage()
_CLIENT_AUTH = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH])


@dataclass(frozen=True)
class IssuedCert:
    cert_pem: bytes
    serial: int
    fingerprint: str  # sha256 hex of the DER certificate
    not_after_ms: int


def fingerprint(cert: x509.Certificate) -> str:
    return cert.fingerprint(hashes.SHA256()).hex()


class CertificateAuthority:
    def __init__(self, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
        self._key = key
        self.cert = cert
        self.cert_pem = _pem(cert)
        self.ca_hash = spki_hash(cert)
        # What every certificate it signs says of it, and the extensions every one carries first
        # (in this order), set once: a builder is immutable, each call below starts from this one.
        self._leaf = (
            x509.CertificateBuilder()
            .issuer_name(cert.subject)
            .add_extension(_LEAF, critical=True)
            .add_extension(_LEAF_USAGE, critical=True)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), critical=False
            )
        )

    def __repr__(self) -> str:
        return f"CertificateAuthority(ca_hash={self.ca_hash!r})"

    @classmethod
    def load_or_create(cls, pki_dir: Path) -> CertificateAuthority:
        """The CA of ``pki_dir`` (``ca.key``, ``ca.crt``), created there on first use."""
        key_path, cert_path = pki_dir / "ca.key", pki_dir / "ca.crt"
        if key_path.exists() and cert_path.exists():
            try:
                return cls.from_pem(read_private(key_path), cert_path.read_bytes())
            except InvalidArgument:
                raise InvalidArgument(f"{key_path} is not an EC key") from None
        ca = cls.create()
        write_private(key_path, ca.private_key_pem())
        write_private(cert_path, ca.cert_pem)
        return ca

    @classmethod
    def from_pem(cls, key_pem: bytes, cert_pem: bytes) -> CertificateAuthority:
        key = serialization.load_pem_private_key(key_pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise InvalidArgument("the CA key is not an EC key")
        return cls(key, x509.load_pem_x509_certificate(cert_pem))

    @classmethod
    def create(cls) -> CertificateAuthority:
        """A new CA, in memory only (``load_or_create`` and the stored identity keep it)."""
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "tether"),
                x509.NameAttribute(NameOID.COMMON_NAME, f"tether-ca-{socket.gethostname()}"),
            ]
        )
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(cert_sign=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(key, cert)

    def private_key_pem(self) -> bytes:
        """The CA key (PKCS#8 PEM), for whoever keeps it: a 0600 file, or sealed in the store."""
        return self._key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    def _builder(self, subject: str, public_key: object, days: float) -> x509.CertificateBuilder:
        now = _now()
        return (
            self._leaf.subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .public_key(public_key)  # type: ignore[arg-type]
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - backdate(days))
            .not_valid_after(now + dt.timedelta(days=days))
        )

    def _issue(self, builder: x509.CertificateBuilder) -> IssuedCert:
        cert = builder.sign(self._key, hashes.SHA256())
        der = cert.public_bytes(serialization.Encoding.DER)  # once, for the PEM and the fingerprint
        return IssuedCert(
            cert_pem=_pem_of_der(der),
            serial=cert.serial_number,
            fingerprint=hashlib.sha256(der).hexdigest(),  # as fingerprint(cert)
            not_after_ms=int(cert.not_valid_after_utc.timestamp() * 1000),
        )

    def server_credentials(self, hosts: list[str]) -> tuple[bytes, bytes]:
        """A fresh serving key and certificate chain (leaf + CA) for these names."""
        key_pem = generate_key()
        key = serialization.load_pem_private_key(key_pem, password=None)
        names: list[x509.GeneralName] = [x509.DNSName(CONTROLLER_SERVER_NAME), x509.DNSName("localhost")]
        seen = {CONTROLLER_SERVER_NAME, "localhost"}
        for host in [*hosts, "127.0.0.1", "::1", socket.gethostname()]:
            if not host or host in seen or host in ("0.0.0.0", "::"):  # noqa: S104 (a wildcard is no name)
                continue
            seen.add(host)
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = (
            self._builder("tether-controller", key.public_key(), 365)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        )
        issued = self._issue(builder)
        return key_pem, issued.cert_pem + self.cert_pem

    def sign_node_csr(
        self,
        csr_pem: bytes | x509.CertificateSigningRequest,
        node_name: str,
        days: float,
        *,
        public_key: CertificatePublicKeyTypes | None = None,
    ) -> IssuedCert:
        """A node certificate for the CSR's key, after its signature is checked (the node holds
        the key). ``Enroll`` reads the CSR once: it passes it parsed, with its ``public_key()``."""
        if isinstance(csr_pem, x509.CertificateSigningRequest):
            csr = csr_pem
        else:
            try:
                csr = x509.load_pem_x509_csr(csr_pem)
            except ValueError as exc:
                raise InvalidArgument(f"invalid CSR: {exc}") from exc
        if not csr.is_signature_valid:
            raise InvalidArgument("invalid CSR: bad signature")
        if public_key is None:
            public_key = csr.public_key()
        if isinstance(public_key, rsa.RSAPublicKey) and public_key.key_size < 2048:
            raise InvalidArgument("invalid CSR: RSA keys must have at least 2048 bits")
        if not isinstance(public_key, (ec.EllipticCurvePublicKey, rsa.RSAPublicKey)):
            raise InvalidArgument("invalid CSR: only EC and RSA keys are accepted")
        builder = (
            self._builder(node_name, public_key, days)
            .add_extension(
                x509.SubjectAlternativeName([x509.UniformResourceIdentifier(NODE_URI_PREFIX + node_name)]),
                critical=False,
            )
            .add_extension(_CLIENT_AUTH, critical=False)
        )
        return self._issue(builder)

    def issue_admin(
        self, name: str, role: str, days: float = 365, environments: Sequence[str] = ()
    ) -> tuple[bytes, IssuedCert]:
        """An admin client certificate; ``environments`` limits it to those (empty: every one)."""
        if role not in ADMIN_ROLES:
            raise InvalidArgument(f"unknown admin role {role!r} (expected one of {', '.join(ADMIN_ROLES)})")
        bad = [e for e in environments if not e or "/" in e or any(c.isspace() for c in e)]
        if bad:
            raise InvalidArgument(f"not an environment name: {bad[0]!r}")
        key_pem = generate_key()
        key = serialization.load_pem_private_key(key_pem, password=None)
        uris = [f"{ADMIN_URI_PREFIX}{role}/{name}"]
        uris += [f"{ADMIN_SCOPE_URI_PREFIX}{e}" for e in sorted(set(environments))]
        builder = (
            self._builder(f"admin:{name}", key.public_key(), days)
            .add_extension(
                x509.SubjectAlternativeName([x509.UniformResourceIdentifier(u) for u in uris]),
                critical=False,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        )
        return key_pem, self._issue(builder)

    def verify_issued(self, cert: x509.Certificate) -> bool:
        """True when this CA signed ``cert`` (defence in depth on top of the TLS handshake)."""
        try:
            cert.verify_directly_issued_by(self.cert)
        except (ValueError, TypeError, Exception):
            return False
        return True
