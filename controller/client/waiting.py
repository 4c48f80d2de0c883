"""Waiting until an environment's nodes are provisioned: the check ``tetherctl wait --env`` makes."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from tether.controller.client.errors import FailedPreconditionError
from tether.v1 import admin_pb2

POLL_SECONDS = 1.0  # between two checks
DEFAULT_WAIT_SECONDS = 600.0


class Reader(Protocol):
    """What the wait reads (a ``Client``)."""

    def get_environment(self, name: str) -> admin_pb2.Environment: ...
    def get_node(self, name: str) -> admin_pb2.Node: ...
    def iter_nodes(self, environment: str = "", page_size: int = 0) -> Iterator[admin_pb2.Node]: ...
    def get_rollout(self, environment: str) -> admin_pb2.Rollout | None: ...


@dataclass(frozen=True)
class Progress:
    """One check: ``done``; else ``failure`` (a node failed a step of the current generation, is
    revoked, or the rollout halted) or still waiting (``failure`` ""), with the counts."""

    done: bool
    failure: str
    nodes: int
    provisioned: int
    waiting: str  # what is left, one line ("" once done)

    @property
    def timed_out(self) -> bool:
        return not self.done and not self.failure


def check(client: Reader, environment: str, min_nodes: int = 1) -> Progress:
    """How far ``environment``'s nodes are (revoked nodes left out, ``min_nodes`` at least)."""
    env = client.get_environment(environment)
    rollout = client.get_rollout(environment)
    if rollout is not None and rollout.state == "halted":
        reason = f"the rollout of {environment} (generation {rollout.generation}) halted: {rollout.reason}"
        return Progress(False, reason, 0, 0, "")
    nodes = [n for n in client.iter_nodes(environment) if n.state != "revoked"]
    behind, provisioning = 0, []
    for n in nodes:
        current = n.plan_generation == env.generation
        if n.state == "failed" and current:
            return Progress(False, _failed(client, n.name), len(nodes), 0, "")
        if not current or (env.agent_version and n.agent_version != env.agent_version):
            behind += 1
        elif n.state != "provisioned":
            provisioning.append(f"{n.name} ({n.state})")
    done = len(nodes) - behind - len(provisioning)
    if len(nodes) < min_nodes:
        return Progress(False, "", len(nodes), done, f"{len(nodes)}/{min_nodes} node(s) enrolled")
    if not behind and not provisioning:
        return Progress(True, "", len(nodes), done, "")
    parts = [f"{done}/{len(nodes)} provisioned"]
    if provisioning:
        parts.append(
            "provisioning: " + ", ".join(provisioning[:5]) + (" ..." if len(provisioning) > 5 else "")
        )
    if behind:
        parts.append(f"{behind} not yet on the current generation")
    return Progress(False, "", len(nodes), done, "; ".join(parts))


def _failed(client: Reader, name: str) -> str:
    step = next((s for s in client.get_node(name).steps if s.state == "failed"), None)
    if step is None:
        return f"node {name} failed"
    return f"node {name}: step {step.name} failed ({step.message or f'exit {step.exit_code}'})"


def wait_for_nodes(
    client: Reader,
    environment: str,
    *,
    timeout: float = DEFAULT_WAIT_SECONDS,
    min_nodes: int = 1,
    poll_seconds: float = POLL_SECONDS,
    on_progress: Callable[[Progress], None] | None = None,
) -> Progress:
    """Check until done, failed or ``timeout`` seconds; ``on_progress`` sees each check whose
    ``waiting`` line changed. The last check is returned (``timed_out`` if neither)."""
    deadline = time.monotonic() + timeout
    shown = None
    while True:
        progress = check(client, environment, min_nodes)
        if on_progress is not None and progress.waiting != shown:
            on_progress(progress)
            shown = progress.waiting
        if progress.done or progress.failure or time.monotonic() >= deadline:
            return progress
        time.sleep(min(poll_seconds, max(0.0, deadline - time.monotonic())))


def rollout_or_none(fetch: Callable[[], admin_pb2.Rollout]) -> admin_pb2.Rollout | None:
    """The rollout ``fetch`` returns, or None while the environment has had none."""
    try:
        return fetch()
    except FailedPreconditionError:
        return None
