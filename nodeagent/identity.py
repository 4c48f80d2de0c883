"""The node's identity: its private key, certificate and the pinned controller CA.

The key is generated on the node and never leaves it. The controller CA is
learned once over TLS and trusted only if the SHA-256 of its public key
matches the pin given at bootstrap (like kubeadm's
``--discovery-token-ca-cert-hash``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tether.nodeagent.errors import ControllerUnavailable, IdentityError

if TYPE_CHECKING:
    import ssl

    from cryptography import x509

# ``cryptography`` is imported where it is used (enrolling, renewing): an enrolled agent that
# only streams never loads it (about 10 MB resident on a node). ``ssl`` too: only
# ``fetch_controller_ca`` needs it, before enrolling; gRPC carries its own TLS (and see
# ``tether.nodeagent.noopenssl``).

# Every controller certificate carries this DNS name; clients verify it instead
# of whatever address they dialled, so one CA pin works from every network.
CONTROLLER_SERVER_NAME = "tether-controller"
_PORT_RE = re.compile(r"[0-9]{1,5}")


def generate_key() -> bytes:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_csr(key_pem: bytes, common_name: str) -> bytes:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = serialization.load_pem_private_key(key_pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise IdentityError("the node key must be an EC key")
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM)


def spki_hash(cert: x509.Certificate) -> str:
    """``sha256:<hex>`` of a certificate's SubjectPublicKeyInfo (kubeadm's CA hash)."""
    from cryptography.hazmat.primitives import serialization

    der = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return "sha256:" + hashlib.sha256(der).hexdigest()


def ca_hash_of_pem(pem: bytes) -> str:
    from cryptography import x509

    return spki_hash(x509.load_pem_x509_certificate(pem))


def normalize_ca_hash(value: str) -> str:
    value = value.strip().lower()
    if not value.startswith("sha256:"):
        value = "sha256:" + value
    digest = value.removeprefix("sha256:")
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise IdentityError(f"invalid CA hash {value!r}: expected sha256:<64 hex digits>")
    return value


def _chain_from_socket(sock: ssl.SSLSocket) -> list[x509.Certificate]:
    from cryptography import x509

    getter = getattr(sock, "get_unverified_chain", None)
    raw: list[Any] = getter() if getter else sock._sslobj.get_unverified_chain()  # type: ignore[attr-defined]
    certs: list[x509.Certificate] = []
    for item in raw or []:
        if isinstance(item, (bytes, bytearray)):
            certs.append(x509.load_der_x509_certificate(bytes(item)))
        elif hasattr(item, "public_bytes"):
            pem = item.public_bytes()
            certs.append(x509.load_pem_x509_certificate(pem.encode() if isinstance(pem, str) else pem))
    return certs


def fetch_controller_ca(address: str, expected_hash: str, *, timeout: float = 10.0) -> bytes:
    """Learn the controller's CA over TLS and return its PEM if it matches the pin.

    The TLS session is not trusted for anything else: only the CA certificate
    whose public key hashes to ``expected_hash`` (and which signed the
    presented server certificate) is kept.
    """
    import ssl

    from cryptography.hazmat.primitives import serialization

    from tether.nodeagent import anonymous

    host, port = split_address(address)
    pin = normalize_ca_hash(expected_hash)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the pin below is the verification
    ctx.set_alpn_protocols(["h2"])
    with tempfile.TemporaryDirectory(prefix="tether-anon-") as tmp:
        cert_file, key_file = Path(tmp, "anon.crt"), Path(tmp, "anon.key")
        cert_file.write_bytes(anonymous.CERT_PEM)
        key_file.write_bytes(anonymous.key_pem())
        ctx.load_cert_chain(str(cert_file), str(key_file))
    try:
        with (
            socket.create_connection((host, port), timeout=timeout) as raw,
            ctx.wrap_socket(raw, server_hostname=CONTROLLER_SERVER_NAME) as tls,
        ):
            chain = _chain_from_socket(tls)
    except OSError as exc:
        raise ControllerUnavailable(f"cannot reach controller at {address}: {exc}") from exc
    if not chain:
        raise IdentityError(f"controller at {address} presented no certificate")
    leaf = chain[0]
    for cert in chain[1:]:
        if spki_hash(cert) != pin:
            continue
        try:
            leaf.verify_directly_issued_by(cert)
        except Exception as exc:
            raise IdentityError(
                f"controller at {address}: server certificate not signed by the pinned CA"
            ) from exc
        check_server_leaf(leaf, address)
        return cert.public_bytes(serialization.Encoding.PEM)
    seen = ", ".join(spki_hash(c) for c in chain[1:]) or "none"
    raise IdentityError(
        f"controller at {address} does not present the pinned CA {pin} (it presents {seen}); check --ca-hash"
    )


def check_server_leaf(leaf: x509.Certificate, address: str) -> None:
    """The certificate presented must be a controller's (serverAuth, named tether-controller), not a
    client certificate the same CA issued to a node or an admin."""
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    try:
        eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = sans.get_values_for_type(x509.DNSName)
    except x509.ExtensionNotFound:
        raise IdentityError(
            f"{address} presented a certificate of the pinned CA that is not a controller's"
        ) from None
    if ExtendedKeyUsageOID.SERVER_AUTH not in eku or CONTROLLER_SERVER_NAME not in names:
        raise IdentityError(f"{address} presented a certificate of the pinned CA that is not a controller's")


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not _PORT_RE.fullmatch(port) or int(port) > 65535:
        raise IdentityError(f"invalid address {address!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def write_private(path: Path, data: bytes) -> None:
    """Write a file readable by its owner only, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def read_private(path: Path) -> bytes:
    """Read a secret file, refusing one that others can read or that someone else owns."""
    st = path.stat()
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise IdentityError(
            f"{path} is accessible by group or others (mode {stat.S_IMODE(st.st_mode):o}); want 0600"
        )
    if st.st_uid != os.getuid():
        raise IdentityError(f"{path} is owned by uid {st.st_uid}, not by this process (uid {os.getuid()})")
    return path.read_bytes()


@dataclass(frozen=True)
class Identity:
    node_name: str
    environment: str
    role: str
    key_pem: bytes
    cert_pem: bytes
    ca_pem: bytes

    def __repr__(self) -> str:
        return f"Identity(node_name={self.node_name!r}, environment={self.environment!r}, role={self.role!r})"

    @property
    def certificate(self) -> x509.Certificate:
        from cryptography import x509

        return x509.load_pem_x509_certificate(self.cert_pem)


class IdentityStore:
    """Files under the agent's state directory: key.pem (0600), cert.pem, ca.pem, node.json."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir
        self.key_path = state_dir / "key.pem"
        self.cert_path = state_dir / "cert.pem"
        self.ca_path = state_dir / "ca.pem"
        self.meta_path = state_dir / "node.json"

    def exists(self) -> bool:
        return all(p.exists() for p in (self.key_path, self.cert_path, self.ca_path, self.meta_path))

    def load_or_create_key(self) -> bytes:
        if self.key_path.exists():
            return read_private(self.key_path)
        key = generate_key()
        write_private(self.key_path, key)
        return key

    def save(
        self,
        node_name: str,
        environment: str,
        role: str,
        cert_pem: bytes,
        ca_pem: bytes,
        controllers: tuple[str, ...] = (),
    ) -> Identity:
        """Keep what enrollment gave, and the controller address(es) it used: an enrolled agent
        started with nothing but its state directory carries on with them."""
        write_private(self.ca_path, ca_pem)
        write_private(self.cert_path, cert_pem)
        meta = {"node_name": node_name, "environment": environment, "role": role}
        self._write_meta({**meta, "controllers": list(controllers)})
        return self.load()

    def controllers(self) -> tuple[str, ...]:
        """The controller address(es) this node last reached; () before enrolling (or unreadable)."""
        try:
            meta = json.loads(read_private(self.meta_path))
        except (OSError, ValueError, IdentityError):
            return ()
        listed = meta.get("controllers") if isinstance(meta, dict) else None
        return tuple(str(a) for a in listed) if isinstance(listed, list) else ()

    def remember_controller(self, address: str) -> None:
        """Put ``address`` first among the remembered controllers (it answered this node)."""
        meta = json.loads(read_private(self.meta_path))
        current = [str(a) for a in meta.get("controllers") or []]
        if current[:1] == [address]:
            return
        meta["controllers"] = [address, *(a for a in current if a != address)]
        self._write_meta(meta)

    def set_controllers(self, addresses: tuple[str, ...]) -> bool:
        """Replace the remembered controllers (a Welcome's list of live replicas); atomic, like
        every write of node.json. False when they were these already (nothing written)."""
        meta = json.loads(read_private(self.meta_path))
        if [str(a) for a in meta.get("controllers") or []] == list(addresses):
            return False
        meta["controllers"] = list(addresses)
        self._write_meta(meta)
        return True

    def _write_meta(self, meta: dict[str, Any]) -> None:
        write_private(self.meta_path, json.dumps(meta, indent=2).encode())

    def save_certificate(self, cert_pem: bytes) -> None:
        write_private(self.cert_path, cert_pem)

    def load(self) -> Identity:
        try:
            meta = json.loads(read_private(self.meta_path))
            return Identity(
                node_name=meta["node_name"],
                environment=meta.get("environment", ""),
                role=meta.get("role", ""),
                key_pem=read_private(self.key_path),
                cert_pem=read_private(self.cert_path),
                ca_pem=read_private(self.ca_path),
            )
        except (OSError, ValueError, KeyError) as exc:
            raise IdentityError(f"cannot load the node identity from {self.dir}: {exc}") from exc
