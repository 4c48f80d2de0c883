"""Exactly once: the marker on the node plus the controller's record decide what a run may do.

``decide`` is a pure function of what detection found on the machine (marker, identity files,
unit state), the controller's record of the node name, and the request. It never lets a run
enroll a node twice, rewrite the token of an installed node, move a node to another
environment, or take over a name another machine holds.

=========================  =========================  ==========================================
on the machine             at the controller           decision
=========================  =========================  ==========================================
identity                   enrolled                    ALREADY (``--force``: REINSTALL, no token)
identity                   revoked / unknown           conflict: the identity is not usable here
no identity                enrolled                    conflict: the name belongs to a machine
no identity, marker done   unknown, unit active        WAIT: verify only (enrollment pending)
no identity, marker done   unknown, unit not active    conflict unless ``--force`` (INSTALL)
no identity, other         unknown / revoked           INSTALL (revoking the marker's old token)
=========================  =========================  ==========================================
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from tether.bootstrap.detect import InstallState
from tether.bootstrap.errors import InstallConflict
from tether.bootstrap.registry import NodeView

INSTALLING = "installing"
INSTALLED = "installed"


class Action(str, enum.Enum):
    INSTALL = "install"  # fresh: new token, bundle, config, unit
    REINSTALL = "reinstall"  # --force on an enrolled node: bundle, config, unit; identity kept
    WAIT = "wait"  # installed earlier, enrollment still pending: change nothing, verify
    ALREADY = "already"  # installed and enrolled: change nothing


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    stale_token_id: str = ""  # an earlier run's token to revoke before making a new one


def _s(value: object) -> str:
    return value if isinstance(value, str) else ""


def decide(
    state: InstallState,
    node: NodeView | None,
    *,
    node_name: str,
    environment: str,
    role: str,
    force: bool,
) -> Decision:
    marker = state.marker or {}
    marked_name = _s(marker.get("node_name"))
    if marked_name and marked_name != node_name:
        raise InstallConflict(
            f"this machine is already installed as node {marked_name!r} "
            f"(environment {_s(marker.get('environment')) or '?'}); use --node-name {marked_name}"
        )
    enrolled = node is not None and not node.revoked
    if node is not None and enrolled and (node.environment != environment or node.role != role):
        raise InstallConflict(
            f"node {node_name!r} is enrolled in environment {node.environment!r} as {node.role}, "
            f"not {environment!r} as {role}; a node does not change environment by bootstrap"
        )
    if state.identity:
        if enrolled:
            if force:
                return Decision(Action.REINSTALL, "reinstalling the agent (--force); the identity is kept")
            return Decision(
                Action.ALREADY, "already installed: the agent holds an identity and the node is enrolled"
            )
        if node is not None and node.revoked:
            raise InstallConflict(
                f"node {node_name!r} was revoked at the controller but this machine still holds its old "
                "identity; remove the agent's state (/var/lib/tether) on the machine to enroll it again"
            )
        raise InstallConflict(
            f"this machine holds an agent identity, but the controller has no node {node_name!r}: "
            f"it belongs to another controller ({_s(marker.get('controller')) or 'unknown'})"
        )
    if enrolled:
        raise InstallConflict(
            f"node {node_name!r} is already enrolled by another machine (or this one was re-imaged and "
            f"lost its identity); revoke it first: tetherctl node revoke {node_name}"
        )
    stale = _s(marker.get("token_id"))
    if _s(marker.get("state")) == INSTALLED and not force:
        if state.unit_active in ("active", "activating", "reloading"):
            return Decision(Action.WAIT, "installed earlier; the agent is still enrolling")
        raise InstallConflict(
            "installed earlier, but the node never enrolled and the agent is "
            f"{state.unit_active or 'not running'}; "
            "see journalctl -u tether-agent on the machine, or rerun with --force for a new join token"
        )
    reason = (
        "installing the agent" if not marker else "installing the agent again (the last run did not finish)"
    )
    if force and marker:
        reason = "installing the agent again with a new join token (--force; the node never enrolled)"
    return Decision(Action.INSTALL, reason, stale)
