"""What the controller needs of its identity: the CA, the secret box and the admin registry."""

from __future__ import annotations

from dataclasses import dataclass

from tether.controller.ca import CertificateAuthority
from tether.controller.identity.admins import Admins
from tether.controller.secretbox import SecretBox


@dataclass(frozen=True)
class Identity:
    ca: CertificateAuthority
    box: SecretBox  # seals join material and kubeconfigs in the store
    admins: Admins  # admin certificates issued, revoked, and their scopes
    where: str  # for logs: "DIR" or "the store (key file PATH)"

    def __repr__(self) -> str:  # no key: the CA and the box mask theirs too
        return f"Identity(ca_hash={self.ca.ca_hash!r}, where={self.where!r})"
