"""kubeadm join material: what joining nodes need, when it expires, how it is stored.

The first control plane's agent produces it (kubeadm init, or a refresh task)
and sends it over its mTLS stream; the controller keeps it sealed at rest and
hands it to joining nodes just in time, as secret environment values of their
join step. Nothing here is ever logged: ``JoinMaterial`` masks itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

# What the init / refresh scripts write to $TETHER_SECRETS_OUT.
TOKEN = "JOIN_TOKEN"  # noqa: S105 (a variable name, not a value)
CA_HASH = "JOIN_CA_HASH"
CERT_KEY = "JOIN_CERT_KEY"
TOKEN_TTL = "JOIN_TOKEN_TTL_SECONDS"  # noqa: S105
ENDPOINT = "JOIN_ENDPOINT"  # host:port joining nodes use (the HA endpoint, or the init node's address)
KUBECONFIG = "ADMIN_KUBECONFIG_B64"

# kubeadm's defaults: bootstrap tokens live 24 h, uploaded certificates 2 h.
DEFAULT_TOKEN_TTL_S = 24 * 3600
CERT_KEY_TTL_S = 2 * 3600
# Hand out material only with this much life left (a join takes minutes).
MARGIN_S = 10 * 60

# What each value must look like: a node cannot plant anything else (and nothing unchecked reaches a script).
FORMATS = {
    TOKEN: re.compile(r"[a-z0-9]{6}\.[a-z0-9]{16}"),
    CA_HASH: re.compile(r"sha256:[0-9a-f]{64}"),
    CERT_KEY: re.compile(r"[0-9a-f]{64}"),
    ENDPOINT: re.compile(r"(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]+):[0-9]{1,5}"),
    TOKEN_TTL: re.compile(r"[0-9]{2,8}"),
    KUBECONFIG: re.compile(r"[A-Za-z0-9+/=]{1,1000000}"),
}


def check_outputs(values: Mapping[str, str]) -> None:
    """Raise ValueError naming (never showing) every value that is not in its expected form."""
    bad = sorted(
        k for k, pattern in FORMATS.items() if k in values and values[k] and not pattern.fullmatch(values[k])
    )
    if bad:
        raise ValueError(f"malformed join material: {', '.join(bad)}")


@dataclass(frozen=True)
class JoinMaterial:
    token: str
    ca_hash: str
    cert_key: str
    issued_ms: int
    token_expires_ms: int
    cert_key_expires_ms: int
    endpoint: str = ""

    def __repr__(self) -> str:
        return (
            f"JoinMaterial(ca_hash={self.ca_hash!r}, token=***, cert_key={'***' if self.cert_key else None}, "
            f"token_expires_ms={self.token_expires_ms}, cert_key_expires_ms={self.cert_key_expires_ms})"
        )

    __str__ = __repr__

    @staticmethod
    def from_outputs(
        values: Mapping[str, str], now_ms: int, previous: JoinMaterial | None = None
    ) -> JoinMaterial:
        """Build from a step's outputs; fields it did not produce are kept from ``previous``."""
        check_outputs(values)
        token = values.get(TOKEN, "") or (previous.token if previous else "")
        ttl = int(values.get(TOKEN_TTL, "") or DEFAULT_TOKEN_TTL_S)
        cert_key = values.get(CERT_KEY, "")
        return JoinMaterial(
            token=token,
            ca_hash=values.get(CA_HASH, "") or (previous.ca_hash if previous else ""),
            cert_key=cert_key or (previous.cert_key if previous else ""),
            issued_ms=now_ms,
            token_expires_ms=(now_ms + ttl * 1000)
            if values.get(TOKEN)
            else (previous.token_expires_ms if previous else 0),
            cert_key_expires_ms=(now_ms + CERT_KEY_TTL_S * 1000)
            if cert_key
            else (previous.cert_key_expires_ms if previous else 0),
            endpoint=values.get(ENDPOINT, "") or (previous.endpoint if previous else ""),
        )

    def usable_for(self, control_plane: bool, now_ms: int) -> bool:
        """Enough life left for a join of this kind."""
        horizon = now_ms + MARGIN_S * 1000
        if not self.token or not self.ca_hash or not self.endpoint or self.token_expires_ms <= horizon:
            return False
        return not control_plane or (bool(self.cert_key) and self.cert_key_expires_ms > horizon)

    def release_env(self, control_plane: bool) -> tuple[dict[str, str], dict[str, str]]:
        """(secret values, plain values) a joining node gets just in time."""
        secret = {TOKEN: self.token}
        if control_plane:
            secret[CERT_KEY] = self.cert_key
        return secret, {CA_HASH: self.ca_hash, ENDPOINT: self.endpoint}

    def secrets(self) -> list[str]:
        return [s for s in (self.token, self.cert_key) if s]

    def to_bytes(self) -> bytes:
        return json.dumps(self.__dict__, sort_keys=True).encode()

    @staticmethod
    def from_bytes(raw: bytes) -> JoinMaterial:
        return JoinMaterial(**json.loads(raw))
