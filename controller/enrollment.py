"""Enrollment: each check an ``Enroll`` call must pass, on its own, and the node record it writes.

Every path checks the join token's secret (in constant time) and its state (revoked, expired),
the same key's retry included: a retry only skips the use count (its use is already counted)
and the "already enrolled" refusal (the node it enrolled is itself).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import hmac
import re
from dataclasses import dataclass, field, replace
from typing import Any

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes

from tether.controller import tokens, wire
from tether.controller.ca import IssuedCert
from tether.controller.errors import AlreadyExists, FailedPrecondition, InvalidArgument, TokenRejected
from tether.controller.store.base import Store
from tether.controller.store.records import NodeRecord
from tether.controller.tokens import TokenRecord
from tether.nodeagent.identity import CONTROLLER_SERVER_NAME
from tether.nodeagent.model import now_ms
from tether.nodeagent.secrets import Secret

NODE_NAME_RE = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?")
# Names a node certificate must never carry (they name the controller in TLS).
RESERVED_NAMES = frozenset({CONTROLLER_SERVER_NAME, "localhost"})


def same(a: str, b: str) -> bool:
    """Constant-time equality of two secrets, hashes or fingerprints; an empty value matches nothing."""
    return bool(a) and bool(b) and hmac.compare_digest(a.encode(), b.encode())


@dataclass(frozen=True)
class EnrollAsk:
    """An ``EnrollRequest``, parsed and checked for form (not yet against the store)."""

    node_name: str
    token_id: str
    secret_part: str = field(repr=False)
    key_hash: str
    expect_environment: str
    expect_role: str
    facts: dict[str, Any]
    # The CSR and its key, read once: the key hashed here, the signature checked where it is signed.
    csr: ReadCsr = field(repr=False, compare=False)


@dataclass(frozen=True)
class ReadCsr:
    """A CSR read once, with its public key and that key's hash (reading the key costs as much as
    signing's own work on the request, and it is needed twice: for the hash and the certificate)."""

    csr: x509.CertificateSigningRequest
    public_key: CertificatePublicKeyTypes
    key_hash: str  # SHA-256 of the public key (SubjectPublicKeyInfo DER): the node's identity key


def read_csr(csr_pem: bytes) -> ReadCsr:
    """The CSR, its public key and the key's hash; InvalidArgument when it cannot be read."""
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
        key = csr.public_key()
        der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    except (ValueError, UnsupportedAlgorithm) as exc:  # the key is read only here: a bad one too
        raise InvalidArgument(f"invalid CSR: {exc}") from None
    return ReadCsr(csr, key, hashlib.sha256(der).hexdigest())


def csr_key_hash(csr_pem: bytes) -> str:
    """SHA-256 of the CSR's public key (SubjectPublicKeyInfo DER): the node's identity key."""
    return read_csr(csr_pem).key_hash


# Leaves ``copy.deepcopy`` returns as they are (``dataclasses.asdict`` deep-copies every leaf).
_ATOMIC = (str, int, float, bool, bytes, type(None))


def as_dict(value: Any) -> Any:
    """``dataclasses.asdict``, the same result (nested records as dicts, tuples kept tuples,
    containers copied) without deep-copying the strings and numbers it is made of."""
    if type(value) in _ATOMIC:
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: as_dict(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple, as asdict does
        return type(value)(*[as_dict(v) for v in value])
    if isinstance(value, (list, tuple)):
        return type(value)(as_dict(v) for v in value)
    if isinstance(value, dict):
        return type(value)((as_dict(k), as_dict(v)) for k, v in value.items())
    return copy.deepcopy(value)


def node_name(raw: str) -> str:
    """The requested name, normalised, or InvalidArgument."""
    name = raw.strip().lower()
    if not NODE_NAME_RE.fullmatch(name):
        raise InvalidArgument(f"invalid node name {raw!r}: use lowercase letters, digits, '-' and '.'")
    if name in RESERVED_NAMES:
        raise InvalidArgument(f"the node name {name!r} is reserved")
    return name


def parse(request: wire.agent.EnrollRequest) -> EnrollAsk:
    """Form checks only: the name, the token's shape (TokenRejected), the CSR (InvalidArgument)."""
    name = node_name(request.node_name)
    token_id, secret_part = tokens.parse(Secret(request.token))
    csr = read_csr(request.csr_pem)
    return EnrollAsk(
        node_name=name,
        token_id=token_id,
        secret_part=secret_part,
        key_hash=csr.key_hash,
        expect_environment=request.expect_environment,
        expect_role=request.expect_role,
        facts=as_dict(wire.facts_from_pb(request.facts)),
        csr=csr,
    )


def is_retry(ask: EnrollAsk, token: TokenRecord | None, existing: NodeRecord | None) -> bool:
    """The same key asking again with the token it enrolled with (the reply was lost)."""
    return (
        token is not None
        and existing is not None
        and not existing.revoked
        and same(existing.key_hash, ask.key_hash)
        and existing.token_id == token.id
    )


def check_environment(store: Store, token: TokenRecord) -> None:
    """The environment the token enrolls into still exists."""
    if store.get_environment(token.environment) is None:
        raise TokenRejected(
            "scope",
            f"join token {token.id} is scoped to environment {token.environment!r}, which no longer exists",
        )


def check_not_enrolled(ask: EnrollAsk, existing: NodeRecord | None) -> None:
    """A live node of this name is not taken over (a re-imaged machine is revoked first)."""
    if existing is not None and not existing.revoked:
        raise AlreadyExists(
            f"node {ask.node_name!r} is already enrolled; revoke it first "
            f"(tetherctl node revoke {ask.node_name}) to enroll a re-imaged machine"
        )


def elsewhere(token: TokenRecord | None, existing: NodeRecord | None) -> NodeRecord | None:
    """The existing record when this enrollment takes its name into another environment: that
    node is forgotten first (events, steps and all), so none of its history moves along."""
    if token is None or existing is None or existing.environment == token.environment:
        return None
    return existing


def check_token_name(store: Store, environment: str, name: str) -> None:
    """A token bound to ``name`` for ``environment``: refused while another environment holds a
    node of that name (its environment is not named: the caller may not be allowed to see it)."""
    node = store.get_node(name.strip().lower()) if name else None
    if node is not None and node.environment != environment:
        raise FailedPrecondition(f"node {node.name!r} is enrolled in another environment: delete it first")


def check(store: Store, ask: EnrollAsk, token: TokenRecord | None, existing: NodeRecord | None) -> None:
    """Raise unless this call may enroll (or re-enroll, for a retry) now."""
    now = now_ms()
    if is_retry(ask, token, existing):
        tokens.check_state(token, ask.secret_part, now_ms=now)
        return
    tokens.check(
        token,
        ask.secret_part,
        now_ms=now,
        node_name=ask.node_name,
        expect_environment=ask.expect_environment,
        expect_role=ask.expect_role,
    )
    assert token is not None
    check_environment(store, token)
    check_not_enrolled(ask, existing)


def decide(
    store: Store, ask: EnrollAsk, issued: IssuedCert, token: TokenRecord | None, existing: NodeRecord | None
) -> tuple[NodeRecord, bool]:
    """The record to write and whether the token's use is counted (run atomically by the store)."""
    check(store, ask, token, existing)  # again, atomically with the use count
    assert token is not None
    if is_retry(ask, token, existing):
        assert existing is not None
        retried = replace(
            existing, cert_fingerprint=issued.fingerprint, prev_fingerprint=existing.cert_fingerprint
        )
        return retried, False
    fresh = NodeRecord(
        name=ask.node_name,
        environment=token.environment,
        role=token.role,
        cert_fingerprint=issued.fingerprint,
        key_hash=ask.key_hash,
        token_id=token.id,
        enrolled_ms=now_ms(),
        facts=ask.facts,
        # A name taken over from another environment starts its sequence afresh (its history is gone).
        stored_seq=existing.stored_seq if existing and elsewhere(token, existing) is None else 0,
    )
    return fresh, True
