"""How long steps take across the fleet: each provisioning node's ETA, and stragglers.

**History.** The durations of finished runs (``SUCCEEDED`` events), keyed by (environment, step
name, step digest): the same digest is the same script. Kept in memory, bounded: the latest run of
each node, at most ``MAX_RUNS`` nodes per step (the node that finished it longest ago goes first),
and at most ``MAX_STEPS`` steps (the one that finished longest ago goes first). The agent service
feeds every stored batch of events to ``Progress.observe``; a node forgotten (deleted, reset, moved
to another environment) leaves no trace here either.

**After a controller restart the history is empty**, and nothing is rebuilt from the store (its
step records keep no duration, and reading back every node's events would cost more than the
estimate is worth): until the steps ahead of a node have finished again on some node of its
environment, it gets no ETA and is never flagged a straggler. No ETA rather than a made-up one.
What each node runs *now* is known without history: its step records (a ``running`` step and
when it started) are in the store, and the tracker seeds its own view from them when a node's
stream opens (``Progress.seen``), so a step started before the restart is still watched.

**Rules** (the pure functions below, each a unit test away):

- *ETA* of a provisioning node = now + what is left of its current step (the median of that step
  minus how long it has run, never less than ``OVERRUN_FLOOR`` of the median, never negative) +
  the median of every step after it not yet done (succeeded, skipped, or failed with
  continue-on-error). One of them without any finished run: no ETA (0).
- *Straggler*: its current step has run more than ``STRAGGLER_FACTOR`` (3) times the median of the
  same step (same digest) on **other** nodes, **and** at least ``STRAGGLER_MARGIN_SECONDS`` (10 s)
  longer than that median. Without a finished run on another node, never.
- *Rollout ETA*: the latest finish among its running nodes (their ETA, plus ``minHealthySeconds``)
  and its pending nodes, placed in the free batch slots (``maxParallel``; control planes one at a
  time, first) as the running ones finish, each taking what a node of this rollout takes (the
  medians of the steps a running node ran or has left in this rollout). 0 when that cannot be
  told: a running node without an ETA (offline, no history), pending nodes and no node to measure
  the work by, a canary pause ahead, or a rollout not progressing (paused, halted, complete).

Times are the agents' event times (``time_ms``) against the controller's clock; with the 10 s
margin a small skew does not matter.

A periodic sweep (``Progress.run``, every ``SWEEP_SECONDS``) flags stragglers even when no event
arrives (a step running long sends none): once per run of a step it sends the node a ``Notice``,
which its agent records as an INFO event, and it sets the ``tether_stragglers`` gauge. Before a
notice goes out it reads the node's record (``node_of``, the store's ``get_node``): a revoked or
deleted node, whose stream may still be open, gets none and is no longer watched.

**Forgetting** a node costs what it left: an index (node -> the steps whose history holds a run of
it) is kept alongside the history, so deleting an environment of many nodes does not scan every
step's history once per node.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import statistics
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tether.controller import metrics, wire
from tether.controller.store.records import NodeRecord, StepRecord
from tether.nodeagent import logs
from tether.nodeagent.model import Event, EventKind, now_ms

if TYPE_CHECKING:
    from tether.controller.hub import Hub

log = logs.get_logger("tether.controller.progress")

MAX_RUNS = 64  # finished runs kept per step: the latest of each node, this many nodes
MAX_STEPS = 4096  # steps (environment, name, digest) with a history
STRAGGLER_FACTOR = 3.0
STRAGGLER_MARGIN_SECONDS = 10.0
OVERRUN_FLOOR = 0.1  # a step past its median still has this share of the median left
SWEEP_SECONDS = 2.0
DONE = frozenset({"succeeded", "skipped"})
TASK_PREFIX = "task:"  # a command's task runs beside the plan: not a step of it

StepKey = tuple[str, str, str]  # (environment, step name, step digest)


# -- the rules, pure ----------------------------------------------------------------------------


def median(values: Iterable[float]) -> float | None:
    """The median of ``values``; None when there are none (no history: no estimate)."""
    ordered = sorted(values)
    return statistics.median(ordered) if ordered else None


def remaining_seconds(median_s: float, elapsed_s: float) -> float:
    """What is left of a step that usually takes ``median_s`` and has run ``elapsed_s``: the
    difference, but never below ``OVERRUN_FLOOR`` of the median (a step past its median is not
    done yet), and never negative."""
    return max(median_s - max(elapsed_s, 0.0), OVERRUN_FLOOR * median_s, 0.0)


def straggling(elapsed_s: float, others_median_s: float | None) -> bool:
    """More than 3x the median of the same step on other nodes, and at least 10 s longer."""
    if others_median_s is None:
        return False
    return (
        elapsed_s > STRAGGLER_FACTOR * others_median_s
        and elapsed_s >= others_median_s + STRAGGLER_MARGIN_SECONDS
    )


def is_done(step: StepRecord) -> bool:
    return step.state in DONE or (step.state == "failed" and step.continue_on_error)


def current_step(steps: Sequence[StepRecord]) -> StepRecord | None:
    """The step running now (its record's ``updated_ms`` is when its attempt started)."""
    return next((s for s in steps if s.state == "running"), None)


def node_eta(now: int, steps: Sequence[StepRecord], median_of: Callable[[StepRecord], float | None]) -> int:
    """When a node with these steps should be done (ms since the epoch); 0: no estimate (a step
    left without history, or none left)."""
    total = 0.0
    left = False
    for s in steps:
        if is_done(s):
            continue
        m = median_of(s)
        if m is None:
            return 0
        left = True
        total += remaining_seconds(m, (now - s.updated_ms) / 1000) if s.state == "running" else m
    return now + round(total * 1000) if left else 0


def rollout_eta(
    now: int,
    *,
    running: Sequence[int],
    plane_running: int | None = None,
    pending_workers: int = 0,
    pending_planes: int = 0,
    work_ms: int | None = None,
    slots: int = 1,
    healthy_ms: int = 0,
) -> int:
    """When a rollout should be complete (ms since the epoch; 0: cannot tell, or nothing left).

    ``running``: when each running worker is done (its ETA plus ``healthy_ms``; 0: unknown);
    ``plane_running``: the same for a running control plane (None: none runs); ``work_ms``: what
    one more node takes (None: unknown); ``slots``: nodes at once (maxParallel). Control planes
    move one at a time, before any pending worker; a worker slot is refilled as soon as it frees,
    as the rollout driver does.
    """
    pending = pending_workers + pending_planes
    if any(t <= 0 for t in running) or plane_running == 0 or (pending and work_ms is None):
        return 0
    if not running and plane_running is None and not pending:
        return 0
    per_node = (work_ms or 0) + healthy_ms
    planes = plane_running is not None or pending_planes > 0
    planes_end = max(now, plane_running or 0) + pending_planes * per_node
    workers_from = planes_end if planes else now
    free = [*running, *([now] * max(slots - len(running), 0))]  # when each worker slot frees
    heapq.heapify(free)
    last = max(planes_end, *running) if running else planes_end
    for _ in range(pending_workers):
        t = max(heapq.heappop(free) if free else workers_from, workers_from) + per_node
        heapq.heappush(free, t)
        last = max(last, t)
    return last


# -- the tracker --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Running:
    """The step a node runs now, as the tracker knows it."""

    environment: str
    step: str
    digest: str
    since_ms: int


@dataclass(frozen=True)
class Estimate:
    eta_ms: int = 0  # 0: none
    straggler: bool = False


NO_ESTIMATE = Estimate()


@dataclass(frozen=True)
class Flag:
    """A node that has just become a straggler on ``run`` (the notice to send)."""

    node: str
    run: Running
    elapsed_s: float
    median_s: float
    others: int

    @property
    def message(self) -> str:
        times = f"{self.elapsed_s / self.median_s:.0f}x" if self.median_s > 0 else "far more than"
        return (
            f"straggler: step {self.run.step} has run {self.elapsed_s:.0f}s, {times} the median of "
            f"{self.median_s:.1f}s on {self.others} other node{'s' if self.others != 1 else ''}"
        )


class Progress:
    """Step durations across the fleet, what each node runs now, and who straggles (in memory)."""

    def __init__(self, max_runs: int = MAX_RUNS, max_steps: int = MAX_STEPS) -> None:
        self.max_runs, self.max_steps = max_runs, max_steps
        self._runs: OrderedDict[StepKey, OrderedDict[str, float]] = OrderedDict()
        self._medians: dict[StepKey, float] = {}
        self._keys: dict[str, set[StepKey]] = {}  # node -> the steps whose history holds a run of it
        self._running: dict[str, Running] = {}
        self._flagged: dict[str, Running] = {}  # node -> the run its notice went out for
        self._straggling: dict[str, str] = {}  # node -> environment, as of the last sweep
        self._task: asyncio.Task[None] | None = None
        # Where the sweep reads a node's record before a notice (the store's get_node; run sets it)
        self.node_of: Callable[[str], NodeRecord | None] | None = None

    # -- feeding ----------------------------------------------------------------------------

    def observe(self, node: str, environment: str, events: Iterable[Event]) -> None:
        """A stored batch of ``node``'s events: starts, finished runs and ends of its steps."""
        for e in events:
            if not e.step or e.step.startswith(TASK_PREFIX):
                continue
            run = self._running.get(node)
            same = run is not None and run.step == e.step and run.digest == e.digest
            if e.kind is EventKind.STARTED:
                self._running[node] = Running(environment, e.step, e.digest, e.time_ms)
            elif e.kind is EventKind.SUCCEEDED:
                # Wall time from its start: a step that rebooted reports its script's time before
                # the reboot and 0 after it.
                wall = (e.time_ms - run.since_ms) / 1000 if same and run is not None else 0.0
                self.record(environment, e.step, e.digest, node, max(e.duration_seconds, wall))
                if same:
                    del self._running[node]
            elif (same and e.kind in (EventKind.FAILED, EventKind.SKIPPED)) or e.kind is EventKind.WAITING:
                self._running.pop(node, None)  # ended, or waits at a gate (not running)

    def record(self, environment: str, step: str, digest: str, node: str, seconds: float) -> None:
        """One finished run of a step on ``node`` (its latest: an earlier one is replaced)."""
        key = (environment, step, digest)
        runs = self._runs.get(key)
        if runs is None:
            runs = self._runs[key] = OrderedDict()
        self._runs.move_to_end(key)
        runs.pop(node, None)
        runs[node] = max(seconds, 0.0)
        self._keys.setdefault(node, set()).add(key)
        while len(runs) > self.max_runs:
            gone, _ = runs.popitem(last=False)
            self._unindex(gone, key)
        while len(self._runs) > self.max_steps:
            old, dropped = self._runs.popitem(last=False)
            self._medians.pop(old, None)
            for gone in dropped:
                self._unindex(gone, old)
        self._medians[key] = statistics.median(sorted(runs.values()))

    def _unindex(self, node: str, key: StepKey) -> None:
        keys = self._keys.get(node)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._keys[node]

    def seen(self, node: str, environment: str, steps: Sequence[StepRecord]) -> None:
        """``node``'s step records (its stream opened): what it runs now, for the sweep."""
        s = current_step(steps)
        if s is None:
            self._running.pop(node, None)
            return
        run = self._running.get(node)
        if run is None or (run.step, run.digest) != (s.name, s.digest):
            self._running[node] = Running(environment, s.name, s.digest, s.updated_ms)

    def forget(self, node: str) -> None:
        """No trace of ``node`` (deleted, reset, or enrolled again elsewhere)."""
        self._running.pop(node, None)
        self._flagged.pop(node, None)
        self._straggling.pop(node, None)
        for key in self._keys.pop(node, ()):  # the steps it ran, not every step's history
            runs = self._runs[key]
            del runs[node]
            if runs:
                self._medians[key] = statistics.median(sorted(runs.values()))
            else:
                del self._runs[key]
                self._medians.pop(key, None)

    # -- asking -----------------------------------------------------------------------------

    def median(self, environment: str, step: str, digest: str, *, excluding: str = "") -> float | None:
        """The median duration of the step's finished runs (those of ``excluding`` left out)."""
        key = (environment, step, digest)
        runs = self._runs.get(key)
        if not runs:
            return None
        if excluding and excluding in runs:
            return median(d for n, d in runs.items() if n != excluding)
        return self._medians[key]

    def others(self, environment: str, step: str, digest: str, node: str) -> int:
        """How many other nodes the step's history holds a run of."""
        runs = self._runs.get((environment, step, digest))
        return len(runs) - (1 if node in runs else 0) if runs else 0

    def estimate(self, node: str, environment: str, steps: Sequence[StepRecord], now: int) -> Estimate:
        """A provisioning node's ETA and whether it straggles, from its step records."""

        def median_of(s: StepRecord) -> float | None:
            return self.median(environment, s.name, s.digest)

        eta = node_eta(now, steps, median_of)
        s = current_step(steps)
        straggler = s is not None and straggling(
            (now - s.updated_ms) / 1000, self.median(environment, s.name, s.digest, excluding=node)
        )
        return Estimate(eta, straggler)

    def stragglers(self) -> dict[str, int]:
        """Nodes flagged as stragglers at the last sweep, by environment."""
        counts: dict[str, int] = {}
        for environment in self._straggling.values():
            counts[environment] = counts.get(environment, 0) + 1
        return counts

    # -- the sweep --------------------------------------------------------------------------

    def sweep(self, now: int, connected: Callable[[str], bool]) -> list[Flag]:
        """Who straggles now (among connected nodes); returns those not flagged for this run yet."""
        flags: list[Flag] = []
        straggling_now: dict[str, str] = {}
        for node, run in self._running.items():
            if not connected(node):
                continue
            m = self.median(run.environment, run.step, run.digest, excluding=node)
            elapsed = max(now - run.since_ms, 0) / 1000
            if m is None or not straggling(elapsed, m):
                continue
            straggling_now[node] = run.environment
            if self._flagged.get(node) != run:
                others = self.others(run.environment, run.step, run.digest, node)
                flags.append(Flag(node, run, elapsed, m, others))
        self._straggling = straggling_now
        for node in [n for n, run in self._flagged.items() if self._running.get(n) != run]:
            del self._flagged[node]  # that run ended: a later run may be flagged again
        return flags

    def flagged(self, flag: Flag) -> None:
        """``flag``'s notice went out: not again for the same run."""
        self._flagged[flag.node] = flag.run

    def gauge_counts(self) -> dict[str, int]:
        """The straggler gauge: every environment with a node running a step or straggling, 0
        or more (the others have no series)."""
        counts = dict.fromkeys((run.environment for run in self._running.values()), 0)
        counts.update(self.stragglers())
        return counts

    def tick(self, hub: Hub, now: int | None = None) -> list[Flag]:
        """One sweep: a notice to each new straggler (one that cannot be sent now is tried again
        at the next sweep), and the gauge. A revoked node (its stream may still be open) gets no
        notice and is no longer watched (a store read per notice about to go out, not per sweep)."""
        flags = []
        for flag in self.sweep(now_ms() if now is None else now, hub.connected):
            if self._revoked(flag.node):
                self._running.pop(flag.node, None)
                self._flagged.pop(flag.node, None)
                self._straggling.pop(flag.node, None)
                continue
            flags.append(flag)
            notice = wire.agent.Notice(step=flag.run.step, digest=flag.run.digest, message=flag.message)
            if hub.send(flag.node, wire.agent.ControllerMessage(notice=notice)):
                self.flagged(flag)
                log.warning(
                    "straggler",
                    node=flag.node,
                    environment=flag.run.environment,
                    step=flag.run.step,
                    elapsed_seconds=round(flag.elapsed_s),
                    median_seconds=round(flag.median_s, 1),
                )
        metrics.stragglers(self.gauge_counts())
        return flags

    def _revoked(self, node: str) -> bool:
        if self.node_of is None:
            return False
        record = self.node_of(node)
        return record is None or record.revoked

    def run(self, hub: Hub, node_of: Callable[[str], NodeRecord | None] | None = None) -> None:
        """The periodic sweep; ``node_of``: the store's ``get_node`` (no notice to a revoked node)."""
        if node_of is not None:
            self.node_of = node_of
        if self._task is None:
            self._task = asyncio.create_task(self._loop(hub), name="stragglers")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self, hub: Hub) -> None:
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            try:
                self.tick(hub)
            except Exception:  # a bad sweep must not end the next ones
                log.exception("straggler sweep failed")
