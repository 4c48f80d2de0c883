"""Errors of the node agent.

Hierarchy::

    AgentError                 root of everything the agent raises on purpose
    ├── ConfigError            bad configuration (flags, file, state directory)
    ├── EnrollError            the controller refused enrollment (never retried)
    ├── IdentityError          key, certificate or CA pin missing or wrong
    ├── StateError             the state database cannot be opened (corrupt, unreadable)
    │   └── CorruptRecord      one stored record (an event, facts, a plan) cannot be read back
    ├── TaskFailed             a long-lived task failed: the agent exits, systemd restarts it
    └── ControllerUnavailable  the controller could not be reached (retryable)
"""

from __future__ import annotations


class AgentError(Exception):
    """Root of the agent's errors. ``retryable`` says whether trying again can help."""

    retryable = False


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


class ControllerUnavailable(AgentError):
    """The controller did not answer; the agent backs off and retries."""

    retryable = True
