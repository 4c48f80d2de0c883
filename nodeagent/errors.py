"""Errors of the node agent.

Hierarchy::

    AgentError                 root of everything the agent raises on purpose
    ├── ConfigError            bad configuration (flags, file, state directory)
    ├── EnrollError            the controller refused enrollment (never retried)
    ├── IdentityError          key, certificate or CA pin missing or wrong
    ├── StateError             the state database cannot be opened (corrupt, unreadable)
    │   └── CorruptRecord      one stored record (an event, facts, a plan) cannot be read back
    ├── TaskFailed             a long-lived task failed: the agent exits, systemd restarts it
    ├── NodeRevoked            the controller revoked (or deleted) this node: the agent stops for good
    ├── NodeReset              the node was reset: the agent removed itself and stays down
    └── ControllerUnavailable  the controller could not be reached (retryable)
"""

from __future__ import annotations

# What ``tether-agent run`` exits with when the controller ended this node for good; the unit lists
# both in RestartPreventExitStatus= and SuccessExitStatus= (systemd neither restarts nor fails it).
REVOKED_EXIT_CODE = 77
RESET_EXIT_CODE = 78


class AgentError(Exception):
    """Root of the agent's errors. ``retryable`` says whether trying again can help; ``exit_code``
    is what ``tether-agent run`` exits with."""

    retryable = False
    exit_code = 2


class ConfigError(AgentError):
    """The configuration is invalid; the message lists every problem."""


class EnrollError(AgentError):
    """The controller refused the join token or the enrollment request."""


class IdentityError(AgentError):
    """The stored identity or the pinned controller CA is unusable."""


class StateError(AgentError):
    """The state database is unusable; the message names the file and what to do."""


class CorruptRecord(StateError):
    """A stored record (event, facts, health, plan) is damaged: it cannot be decoded."""


class TaskFailed(AgentError):
    """A long-lived task of the agent failed (one line); the agent exits non-zero."""


class NodeRevoked(AgentError):
    """The controller refuses this node's identity for good (revoked or deleted): exit and stay down."""

    exit_code = REVOKED_EXIT_CODE

    def __init__(self, node: str) -> None:
        super().__init__(f"node {node} was revoked by the controller; enroll again with a new token")
        self.node = node


class NodeReset(AgentError):
    """The node was reset (``tetherctl node reset``): the agent removed its unit, config and state."""

    exit_code = RESET_EXIT_CODE


class ControllerUnavailable(AgentError):
    """The controller did not answer; the agent backs off and retries."""

    retryable = True
