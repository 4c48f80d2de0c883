"""Who is calling: the principal behind a gRPC peer's client certificate.

The TLS handshake already verified the certificate chain; here the
certificate is mapped to a principal (node, admin, read-only admin, or the
anonymous enrollment identity) and checked again against our CA.

An admin may be limited to some environments (its scope). The certificate names them and the
controller's admin registry (``tether.controller.admins``) records them when it is issued; on every
call the registry's record is looked up by the certificate's fingerprint, and a certificate
whose scope differs from its record is refused. The registry is authoritative: a certificate
it never recorded (issued before it existed) keeps the scope the certificate names, unless the
registry records every certificate (``recorded_only``: the identity kept in the store), where
one without a record is refused (its record deleted in the database, say, to undo a revocation).
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from tether.controller.ca import (
    ADMIN_SCOPE_URI_PREFIX,
    ADMIN_URI_PREFIX,
    NODE_URI_PREFIX,
    CertificateAuthority,
    fingerprint,
)
from tether.controller.errors import PermissionDenied, Unauthenticated
from tether.nodeagent import anonymous


class Kind(str, enum.Enum):
    ANONYMOUS = "anonymous"
    NODE = "node"
    ADMIN = "admin"


@dataclass(frozen=True)
class Principal:
    kind: Kind
    name: str
    role: str = ""  # admin | read-only for admins
    fingerprint: str = ""
    environments: frozenset[str] = frozenset()  # an admin's scope; empty: every environment

    @property
    def scoped(self) -> bool:
        return bool(self.environments)

    def require_admin(self, *, write: bool) -> None:
        if self.kind is not Kind.ADMIN:
            raise PermissionDenied(f"{self.kind.value} identities may not use the admin API")
        if write and self.role != "admin":
            raise PermissionDenied(f"admin {self.name!r} is read-only")

    def may_see(self, environment: str) -> bool:
        """Whether this admin may read or change ``environment`` (its nodes, tokens, events...)."""
        return not self.environments or environment in self.environments

    def require_environment(self, environment: str) -> None:
        if not self.may_see(environment):
            raise PermissionDenied(f"admin {self.name!r} may not use environment {environment!r}")

    def require_unscoped(self, what: str) -> None:
        """For controller-wide changes: an admin limited to some environments may not make them."""
        if self.environments:
            raise PermissionDenied(f"admin {self.name!r} is limited to some environments: {what} is not")


ANONYMOUS = Principal(Kind.ANONYMOUS, "anonymous")


class Authenticator:
    """Maps peer certificates to principals, with a small cache (streams reconnect a lot)."""

    def __init__(
        self,
        ca: CertificateAuthority,
        cache_size: int = 50_000,
        *,
        revoked: Callable[[str], bool] = lambda fingerprint: False,
        scope: Callable[[str], frozenset[str] | None] = lambda fingerprint: None,
        recorded_only: bool = False,
    ) -> None:
        self._ca = ca
        self._revoked = revoked  # admin certificates (controller.admins); nodes are revoked in the store
        self._scope = scope  # an admin certificate's recorded environments; None: never recorded
        self._recorded_only = recorded_only  # refuse an admin certificate never recorded
        self._cache: OrderedDict[bytes, Principal] = OrderedDict()
        self._cache_size = cache_size
        self._anonymous_der = x509.load_pem_x509_certificate(anonymous.CERT_PEM).public_bytes(Encoding.DER)

    def principal(self, context: Any) -> Principal:
        values = context.auth_context().get("x509_pem_cert")
        if not values:
            raise Unauthenticated("a client certificate is required")
        pem: bytes = values[0]
        principal = self._cache.get(pem)
        if principal is not None:
            self._cache.move_to_end(pem)
        else:
            principal = self._classify(pem)
            self._cache[pem] = principal
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        if principal.kind is Kind.ADMIN:
            self._check_admin(principal)
        return principal

    def _check_admin(self, principal: Principal) -> None:
        """On every call: not revoked, and the scope its certificate names is the one recorded."""
        if self._revoked(principal.fingerprint):
            raise Unauthenticated(f"the admin certificate of {principal.name!r} has been revoked")
        recorded = self._scope(principal.fingerprint)
        if recorded is None and self._recorded_only:
            raise Unauthenticated(
                f"the admin certificate of {principal.name!r} is not in the controller's admin "
                "registry: issue a new one (tether-controller admin issue)"
            )
        if recorded is not None and recorded != principal.environments:
            raise PermissionDenied(
                f"the admin certificate of {principal.name!r} names other environments than the "
                f"controller recorded for it ({_scope_text(principal.environments)} against "
                f"{_scope_text(recorded)}): issue a new one (tether-controller admin issue)"
            )

    def _classify(self, pem: bytes) -> Principal:
        cert = x509.load_pem_x509_certificate(pem)
        if cert.public_bytes(Encoding.DER) == self._anonymous_der:
            return ANONYMOUS
        if not self._ca.verify_issued(cert):
            raise Unauthenticated("client certificate was not issued by this controller")
        try:
            sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            uris = sans.get_values_for_type(x509.UniformResourceIdentifier)
        except x509.ExtensionNotFound:
            uris = []
        fp = fingerprint(cert)
        scope = frozenset(
            u.removeprefix(ADMIN_SCOPE_URI_PREFIX) for u in uris if u.startswith(ADMIN_SCOPE_URI_PREFIX)
        )
        for uri in uris:
            if uri.startswith(NODE_URI_PREFIX):
                return Principal(Kind.NODE, uri.removeprefix(NODE_URI_PREFIX), fingerprint=fp)
            if uri.startswith(ADMIN_URI_PREFIX):
                role, _, name = uri.removeprefix(ADMIN_URI_PREFIX).partition("/")
                return Principal(Kind.ADMIN, name, role=role, fingerprint=fp, environments=scope)
        raise Unauthenticated("client certificate carries no tether identity")


def _scope_text(environments: frozenset[str]) -> str:
    return ", ".join(sorted(environments)) or "every environment"
