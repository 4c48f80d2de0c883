"""What the bootstrap needs from the controller: node records and single-use join tokens.

Two implementations: the admin gRPC API (``tetherctl bootstrap``, in ``tether.controller.cli``) and the
controller's own store (``AdminService.Bootstrap``, in ``tether.controller.bootstrap_service``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tether.nodeagent.secrets import Secret


@dataclass(frozen=True)
class NodeView:
    """The controller's record of a node, as far as the bootstrap cares."""

    name: str
    environment: str
    role: str
    revoked: bool
    connected: bool
    state: str
    cert_fingerprint: str  # sha256 hex of the node's DER certificate


@dataclass(frozen=True)
class JoinToken:
    token: Secret  # id.secret; goes to the node's 0600 token file, nowhere else
    token_id: str  # public
    ca_hash: str  # sha256:... of the controller CA, pinned by the agent


class Registry(Protocol):
    ca_hash: str  # sha256:... of the controller CA: what agents pin

    async def get_node(self, name: str) -> NodeView | None:
        """The node's record, or None when the controller has never enrolled it."""

    async def require_environment(self, name: str) -> None:
        """Raise ``ControllerError`` when the environment does not exist."""

    async def create_token(
        self, *, environment: str, role: str, node_name: str, ttl_seconds: int, description: str
    ) -> JoinToken:
        """A single-use join token scoped to ``environment``, ``role`` and ``node_name``."""

    async def revoke_token(self, token_id: str) -> None:
        """Revoke a token (ignore one that no longer exists)."""
