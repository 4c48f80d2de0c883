"""Waiting until nodes are provisioned on their environment's current generation: the one check
behind ``tetherctl wait`` (``--env``: ``check``; ``--node``: ``check_nodes``) and ``wait_for_nodes``."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from tether.controller.client.errors import FailedPreconditionError, NotFoundError
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
    halted = _halted(client, env.name)
    if halted:
        return Progress(False, halted, 0, 0, "")
    nodes = [n for n in client.iter_nodes(environment) if n.state != "revoked"]
    progress = _judge(client, nodes, {env.name: env})
    if progress.failure or len(nodes) >= min_nodes:
        return progress
    return Progress(False, "", len(nodes), progress.provisioned, f"{len(nodes)}/{min_nodes} node(s) enrolled")


def check_nodes(client: Reader, names: Sequence[str]) -> Progress:
    """How far the nodes ``names`` are (a revoked one fails; one not enrolled yet is waited for)."""
    found: list[admin_pb2.Node] = []
    missing: list[str] = []
    for name in names:
        try:
            found.append(client.get_node(name))
        except NotFoundError:
            missing.append(name)
    envs: dict[str, admin_pb2.Environment] = {}
    for n in found:
        if n.environment not in envs:
            envs[n.environment] = client.get_environment(n.environment)
            halted = _halted(client, n.environment)
            if halted:
                return Progress(False, halted, len(found), 0, "")
    progress = _judge(client, found, envs)
    if missing and not progress.failure:
        waiting = f"waiting for {', '.join(missing)} to enroll"
        return Progress(False, "", len(found), progress.provisioned, waiting)
    return progress


def _judge(
    client: Reader, nodes: Sequence[admin_pb2.Node], envs: Mapping[str, admin_pb2.Environment]
) -> Progress:
    """Done when every node is provisioned on its environment's current generation (and agent
    version); failed at the first node that failed a step there (or is revoked or quarantined);
    else what is left."""
    behind, provisioning = 0, []
    for n in nodes:
        env = envs[n.environment]
        current = n.plan_generation == env.generation
        if n.state == "revoked":
            return Progress(False, f"node {n.name} is revoked", len(nodes), 0, "")
        if n.state == "failed" and current:
            return Progress(False, _failed(client, n), len(nodes), 0, "")
        if n.state == "quarantined":  # waits for an operator: nothing more happens by itself
            why = "; ".join(n.quarantine.problems) or n.quarantine.stage
            return Progress(False, f"node {n.name}: quarantined ({why})", len(nodes), 0, "")
        if not current or (env.agent_version and n.agent_version != env.agent_version):
            behind += 1
        elif n.state != "provisioned":
            provisioning.append(f"{n.name} ({n.state})")
    done = len(nodes) - behind - len(provisioning)
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


def _failed(client: Reader, node: admin_pb2.Node) -> str:
    """The failure of a failed node: its failed step (a list's nodes have no steps: read it)."""
    steps = list(node.steps)
    if not steps:
        with contextlib.suppress(NotFoundError):  # deleted since it was listed
            steps = list(client.get_node(node.name).steps)
    step = next((s for s in steps if s.state == "failed"), None)
    what = f"step {step.name} failed ({step.message or f'exit {step.exit_code}'})" if step else "failed"
    return f"node {node.name}: {what}"


def _halted(client: Reader, environment: str) -> str:
    """Why the environment's rollout halted ("" unless it did)."""
    rollout = client.get_rollout(environment)
    if rollout is None or rollout.state != "halted":
        return ""
    return f"the rollout of {environment} (generation {rollout.generation}) halted: {rollout.reason}"


def wait_until(
    check_once: Callable[[], Progress],
    *,
    timeout: float = DEFAULT_WAIT_SECONDS,
    poll_seconds: float = POLL_SECONDS,
    on_progress: Callable[[Progress], None] | None = None,
) -> Progress:
    """``check_once`` until done, failed or ``timeout`` seconds; ``on_progress`` sees each check
    whose ``waiting`` line changed. The last check is returned (``timed_out`` if neither)."""
    deadline = time.monotonic() + timeout
    shown = None
    while True:
        progress = check_once()
        if on_progress is not None and progress.waiting != shown:
            on_progress(progress)
            shown = progress.waiting
        if progress.done or progress.failure or time.monotonic() >= deadline:
            return progress
        time.sleep(min(poll_seconds, max(0.0, deadline - time.monotonic())))


def wait_for_nodes(
    client: Reader,
    environment: str,
    *,
    timeout: float = DEFAULT_WAIT_SECONDS,
    min_nodes: int = 1,
    poll_seconds: float = POLL_SECONDS,
    on_progress: Callable[[Progress], None] | None = None,
) -> Progress:
    """Check ``environment`` until done, failed or ``timeout`` seconds (see ``wait_until``)."""
    return wait_until(
        lambda: check(client, environment, min_nodes),
        timeout=timeout,
        poll_seconds=poll_seconds,
        on_progress=on_progress,
    )


def rollout_or_none(fetch: Callable[[], admin_pb2.Rollout]) -> admin_pb2.Rollout | None:
    """The rollout ``fetch`` returns, or None while the environment has had none."""
    try:
        return fetch()
    except FailedPreconditionError:
        return None
