"""Join tokens: ``id.secret``, only the secret's hash stored, TTL, uses, scope, revocable.

The secret has 160 bits of entropy, so a plain SHA-256 is a safe verifier
(no need for a slow password hash). Checks run in a fixed order so that a
caller who does not know the secret learns nothing about the token.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

from tether.controller.errors import TokenRejected
from tether.nodeagent.model import now_ms
from tether.nodeagent.secrets import Secret

ID_LEN = 6
SECRET_LEN = 32
_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
TOKEN_RE = re.compile(rf"([a-z0-9]{{{ID_LEN}}})\.([a-z0-9]{{{SECRET_LEN}}})")
DEFAULT_TTL_SECONDS = 24 * 3600
MAX_TTL_SECONDS = 365 * 24 * 3600
DEFAULT_USES = 1


@dataclass(frozen=True)
class TokenRecord:
    id: str
    secret_hash: str
    environment: str
    role: str
    node_name: str
    expires_ms: int
    max_uses: int
    uses: int
    revoked: bool
    created_ms: int
    description: str = ""


def _random(n: int) -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(n))


def generate() -> tuple[str, Secret]:
    """A new token: its public id and the full ``id.secret`` (a Secret)."""
    token_id = _random(ID_LEN)
    return token_id, Secret(f"{token_id}.{_random(SECRET_LEN)}")


def hash_secret(secret_part: str) -> str:
    return hashlib.sha256(b"tether-join-token:" + secret_part.encode()).hexdigest()


def parse(token: Secret) -> tuple[str, str]:
    """Split a token into (id, secret), refusing anything malformed."""
    m = TOKEN_RE.fullmatch(token.reveal().strip())
    if not m:
        raise TokenRejected("invalid", "join token is malformed (expected id.secret)")
    return m.group(1), m.group(2)


def check(
    record: TokenRecord | None,
    secret_part: str,
    *,
    now_ms: int,
    node_name: str,
    expect_environment: str = "",
    expect_role: str = "",
) -> None:
    """Raise TokenRejected unless this token may enroll ``node_name`` now."""
    check_state(record, secret_part, now_ms=now_ms)
    assert record is not None
    if record.uses >= record.max_uses:
        raise TokenRejected(
            "used", f"join token {record.id} was already used ({record.uses} of {record.max_uses} uses)"
        )
    check_scope(record, node_name, expect_environment, expect_role)


def check_state(record: TokenRecord | None, secret_part: str, *, now_ms: int) -> None:
    """The secret matches (constant time) and the token is neither revoked nor expired.

    Every enrollment checks this, a retry by the same key included (its use is already counted).
    """
    if record is None or not hmac.compare_digest(record.secret_hash, hash_secret(secret_part)):
        raise TokenRejected("invalid", "join token is invalid (unknown id or wrong secret)")
    if record.revoked:
        raise TokenRejected("revoked", f"join token {record.id} has been revoked")
    if now_ms >= record.expires_ms:
        raise TokenRejected("expired", f"join token {record.id} has expired")


def check_scope(record: TokenRecord, node_name: str, expect_environment: str, expect_role: str) -> None:
    """The token is for this node name and the environment and role the agent expects."""
    if record.node_name and record.node_name != node_name:
        raise TokenRejected(
            "scope", f"join token {record.id} is scoped to node {record.node_name!r}, not {node_name!r}"
        )
    if expect_environment and expect_environment != record.environment:
        raise TokenRejected(
            "scope",
            f"join token {record.id} is scoped to environment {record.environment!r}, "
            f"not {expect_environment!r}",
        )
    if expect_role and expect_role != record.role:
        raise TokenRejected(
            "scope", f"join token {record.id} is scoped to role {record.role!r}, not {expect_role!r}"
        )


def parse_duration(text: str) -> int:
    """``90s``, ``15m``, ``2h``, ``7d`` or plain seconds -> seconds."""
    m = re.fullmatch(r"\s*(\d+)\s*([smhd]?)\s*", text)
    if not m:
        raise ValueError(f"invalid duration {text!r} (examples: 90s, 15m, 2h, 7d)")
    value = int(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    if value <= 0:
        raise ValueError(f"duration must be positive: {text!r}")
    return value


def status(record: TokenRecord, now: int | None = None) -> str:
    """active, expired, used up or revoked (the first that applies, revoked first)."""
    if record.revoked:
        return "revoked"
    if record.max_uses and record.uses >= record.max_uses:
        return "used up"
    if record.expires_ms <= (now_ms() if now is None else now):
        return "expired"
    return "active"
