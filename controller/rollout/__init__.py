"""Rollouts: a new generation of an environment moves through its nodes under its policy.

``state`` is the durable record, ``advance`` the pure decision (who moves next, when it halts,
pauses or completes), ``diff`` what a document would change on each node, and ``driver`` the
one task that observes the nodes, applies those decisions and hands out the plans.
"""

from tether.controller.rollout.driver import RolloutDriver, RolloutError
from tether.controller.rollout.state import NodeProgress, Rollout, RolloutStatus

__all__ = ["NodeProgress", "Rollout", "RolloutDriver", "RolloutError", "RolloutStatus"]
