"""The one task that moves rollouts along: it observes the nodes of every active rollout, applies
``advance``'s decisions, keeps the record durable (a restart resumes it) and hands the new plan
to each node it admits. The agent service asks ``generation_for`` which plan a node gets.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from tether.controller.cluster.orchestrator import Orchestrator
from tether.controller.errors import FailedPrecondition, NotFound
from tether.controller.hub import Hub
from tether.controller.nodestate import failing_step, failure_text, node_state
from tether.controller.planner import Planner
from tether.controller.rollout.advance import Observed, advance
from tether.controller.rollout.state import NodeProgress, NodeStage, Rollout, RolloutStatus
from tether.controller.spec.model import RolloutPolicy
from tether.controller.store import EnvironmentRecord, NodeRecord, Store
from tether.controller.store.records import StoreChange
from tether.nodeagent import logs
from tether.nodeagent.model import Role, facts_from_dict, now_ms

log = logs.get_logger("tether.controller.rollouts")
KEY_PREFIX = "rollout/"
TICK_SECONDS = 1.0  # how often rollouts look at their nodes without being poked
MIN_TICK_GAP_SECONDS = 0.2  # at most 5 looks a second, however many events poke them
ROSTER_SECONDS = 5.0  # how often a rollout lists all its nodes (to drop revoked or deleted ones)

Deliver = Callable[[str], Awaitable[None]]


class Relay(Protocol):
    """Carries a rollout command to the replica that leads (``tether.controller.replicas``)."""

    async def ask(self, action: str, environment: str, **fields: Any) -> Rollout: ...


class RolloutError(FailedPrecondition):
    """A rollout command that does not apply now (nothing to undo, nothing to resume ...)."""


class RolloutDriver:
    def __init__(self, store: Store, hub: Hub, planner: Planner, cluster: Orchestrator) -> None:
        self._store, self._hub, self._planner, self._cluster = store, hub, planner, cluster
        self._rollouts: dict[str, Rollout] = {}
        self._load()
        self.deliver: Deliver | None = None  # set by the agent service: hand a node its plan now
        # Replicas: only the leader runs the loop; a command taken while another replica leads
        # goes to it through the relay (None: this process is the only one).
        self.relay: Relay | None = None
        self._poke = asyncio.Event()
        self._lock = asyncio.Lock()
        # environment -> (when listed, the names of its live nodes): pending and updated nodes are
        # only checked for still being there, so a large fleet is listed every few seconds, not
        # on every look; running nodes are read on every look.
        self._rosters: dict[str, tuple[float, frozenset[str]]] = {}
        self._task: asyncio.Task[None] | None = None

    def _load(self) -> None:
        """Every rollout the store holds (a restart, or this replica taking the lead, resumes them)."""
        self._rollouts = {}
        for key in self._store.kv_keys(KEY_PREFIX):
            self.reload(key.removeprefix(KEY_PREFIX))

    def reload(self, environment: str) -> None:
        """Read ``environment``'s rollout from the store again (another replica changed it)."""
        raw = self._store.kv_get(KEY_PREFIX + environment)
        if raw:
            self._rollouts[environment] = Rollout.loads(raw)
        else:
            self._rollouts.pop(environment, None)

    def on_store_change(self, change: StoreChange) -> None:
        """A store listener: a rollout another replica wrote (the leader's turns, a forget)."""
        if change.kind == "kv" and change.key.startswith(KEY_PREFIX):
            self.reload(change.key.removeprefix(KEY_PREFIX))

    @property
    def running(self) -> bool:
        """This replica drives the rollouts (it leads)."""
        return self._task is not None

    def _relayed(self) -> Relay | None:
        return self.relay if self.relay is not None and self._task is None else None

    # -- what the rest of the controller asks -------------------------------------------------

    def get(self, environment: str) -> Rollout | None:
        return self._rollouts.get(environment)

    def generation_for(self, node: NodeRecord) -> int:
        """The generation ``node`` should run: its old one while a rollout holds it back, else 0
        (the environment's current generation)."""
        r = self._rollouts.get(node.environment)
        if r is None or not r.active or node.name not in r.nodes:
            return 0
        return r.generation_for(node.name)

    def poke(self, environment: str) -> None:
        """Something happened on a node of ``environment``: look again soon."""
        r = self._rollouts.get(environment)
        if r is not None and r.active:
            self._poke.set()

    # -- starting and steering ----------------------------------------------------------------

    async def start(
        self, env: EnvironmentRecord, from_generation: int, policy: RolloutPolicy | None = None
    ) -> Rollout:
        """Roll out ``env`` (just stored as a new generation, replacing ``from_generation``) to the
        nodes on older ones, under ``policy`` (default: the document's own)."""
        relay = self._relayed()
        if relay is not None:
            return await relay.ask(
                "start", env.name, generation=env.generation, from_generation=from_generation, policy=policy
            )
        async with self._lock:
            if policy is None:
                policy = self._planner.spec(env).spec.rollout
            members = self._members(env)
            nodes = {n.name: self._enter(env, n) for n in members}
            self._rosters.pop(env.name, None)  # list again: every member is there now
            r = Rollout(
                environment=env.name,
                generation=env.generation,
                from_generation=from_generation,
                policy=policy,
                started_ms=now_ms(),
                updated_ms=now_ms(),
                agent_version=env.agent_version,
                from_agent_version=_most_common(n.agent_version for n in members),
                nodes=nodes,
            )
            moved = sum(1 for p in nodes.values() if not p.unchanged)
            log.info(
                "rollout started",
                environment=env.name,
                generation=env.generation,
                nodes=len(nodes),
                changed=moved,
                max_parallel=policy.max_parallel or "all",
                max_failures=policy.max_failures,
                canary=policy.canary,
            )
            r = await self._step(r, deliver=[n for n, p in nodes.items() if p.unchanged])
        self._poke.set()
        return r

    def _members(self, env: EnvironmentRecord) -> list[NodeRecord]:
        """The nodes that move: enrolled, not revoked, holding a plan of an older generation."""
        return [
            n
            for n in self._store.list_nodes(env.name)
            if not n.revoked and 0 < n.plan_generation < env.generation
        ]

    def _enter(self, env: EnvironmentRecord, node: NodeRecord) -> NodeProgress:
        new = self._planner.plan(
            env.name, node.role, facts_from_dict(node.facts), self._cluster.peek(node), env.generation
        )
        unchanged = new.digest == node.plan_digest
        return NodeProgress(
            stage=NodeStage.UPDATED if unchanged else NodeStage.PENDING,
            from_generation=node.plan_generation,
            control_plane=node.role == Role.CONTROL_PLANE.value,
            since_ms=now_ms(),
            unchanged=unchanged,
        )

    async def pause(self, environment: str, who: str) -> Rollout:
        return await self._steer(
            environment, RolloutStatus.PAUSED, f"paused by {who}", (RolloutStatus.PROGRESSING,)
        )

    async def resume(self, environment: str, who: str) -> Rollout:
        r = await self._steer(
            environment, RolloutStatus.PROGRESSING, "", (RolloutStatus.PAUSED, RolloutStatus.HALTED)
        )
        log.info("rollout resumed", environment=environment, by=who)
        return r

    async def abort(self, environment: str, who: str) -> Rollout:
        return await self._steer(
            environment,
            RolloutStatus.HALTED,
            f"aborted by {who}: nodes not yet moved stay on their generation",
            (RolloutStatus.PROGRESSING, RolloutStatus.PAUSED, RolloutStatus.HALTED),
        )

    async def _steer(
        self, environment: str, to: RolloutStatus, reason: str, allowed: tuple[RolloutStatus, ...]
    ) -> Rollout:
        relay = self._relayed()
        if relay is not None:
            return await relay.ask(
                "steer", environment, to=to.value, reason=reason, allowed=[a.value for a in allowed]
            )
        return await self.steer(environment, to, reason, allowed)

    async def steer(
        self, environment: str, to: RolloutStatus, reason: str, allowed: tuple[RolloutStatus, ...]
    ) -> Rollout:
        """Move the rollout to ``to`` if it is in one of ``allowed`` (on the replica that leads)."""
        async with self._lock:
            r = self.existing(environment)
            if r.status not in allowed:
                raise RolloutError(
                    f"the rollout of {environment!r} (generation {r.generation}) is {r.status.value}: "
                    f"it cannot become {to.value}"
                )
            r = await self._step(r.with_status(to, reason, now_ms()))
        self._poke.set()
        return r

    def previous(self, environment: str) -> EnvironmentRecord:
        """The document an undo re-applies: the generation the current rollout came from."""
        r = self.existing(environment)
        prev = self._store.get_revision(environment, r.from_generation)
        if prev is None or r.from_generation == r.generation:
            raise RolloutError(
                f"generation {r.from_generation} of {environment!r} is no longer kept: nothing to undo to"
            )
        return prev

    def existing(self, environment: str) -> Rollout:
        r = self._rollouts.get(environment)
        if r is None:
            if self._store.get_environment(environment) is None:
                raise NotFound(f"environment {environment!r} not found")
            raise RolloutError(f"environment {environment!r} has had no rollout yet (apply a change first)")
        return r

    async def forget(self, environment: str) -> None:
        async with self._lock:
            self._rollouts.pop(environment, None)
            await self._store.kv_delete(KEY_PREFIX + environment)

    # -- the loop -----------------------------------------------------------------------------

    def run(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="rollouts")

    async def lead(self) -> None:
        """This replica took the lead: resume every rollout from the store and drive them."""
        async with self._lock:
            self._load()
            self._rosters.clear()
            self.run()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._poke.wait(), TICK_SECONDS)
            await asyncio.sleep(MIN_TICK_GAP_SECONDS)
            self._poke.clear()
            try:
                await self.tick()
            except Exception:  # a bad tick must not end the rollouts; the next one tries again
                log.exception("rollout tick failed")

    async def tick(self) -> None:
        async with self._lock:
            for r in [r for r in self._rollouts.values() if r.active]:
                if self._store.get_environment(r.environment) is None:
                    self._rollouts.pop(r.environment, None)  # deleted through another replica
                    continue
                await self._step(r)

    async def _step(self, r: Rollout, deliver: Iterable[str] = ()) -> Rollout:
        """Observe, decide, persist, hand out: one turn of one rollout."""
        new, admitted = advance(
            r, self._observe(r), now_ms(), control_planes_healthy=self._planes_healthy(r.environment)
        )
        if new != self._rollouts.get(r.environment):
            self._rollouts[r.environment] = new
            await self._store.kv_put(KEY_PREFIX + r.environment, new.dumps())
            if new.status is not r.status:
                log.info(
                    "rollout state changed",
                    state=new.status.value,
                    environment=new.environment,
                    generation=new.generation,
                    reason=new.reason,
                )
        for name in admitted:
            log.info("node admitted to the rollout", environment=new.environment, node=name)
        for name in (*deliver, *admitted):
            if self.deliver is not None:
                await self.deliver(name)
        return new

    def _observe(self, r: Rollout) -> dict[str, Observed]:
        live = self._roster(r.environment)
        observed: dict[str, Observed] = {}
        for name, progress in r.nodes.items():
            if name not in live:
                observed[name] = Observed(generation=0, state="gone")
            elif progress.stage in (NodeStage.PENDING, NodeStage.UPDATED):
                observed[name] = Observed(generation=progress.from_generation, state="settled")
            else:
                node = self._store.get_node(name)
                if node is None or node.revoked:
                    observed[name] = Observed(generation=0, state="gone")
                elif node.plan_generation != r.generation:
                    observed[name] = Observed(generation=node.plan_generation, state="pending")
                else:
                    observed[name] = self._look(r, node)
        return observed

    def _roster(self, environment: str) -> frozenset[str]:
        listed = self._rosters.get(environment)
        now = time.monotonic()
        if listed is None or now - listed[0] >= ROSTER_SECONDS:
            names = frozenset(n.name for n in self._store.list_nodes(environment) if not n.revoked)
            listed = self._rosters[environment] = (now, names)
        return listed[1]

    def _look(self, r: Rollout, node: NodeRecord) -> Observed:
        steps = self._store.node_steps(node.name)
        state = node_state(node, steps, self._hub.connected(node.name)).value
        failed = failing_step(steps)
        step, message = (failed.name, failure_text(failed)) if failed else ("", "")
        quarantine = node.hardware.get("quarantine")
        if quarantine:  # its hardware does not match the new generation's spec.hardware: a failure
            state, step = "failed", str(quarantine.get("step", ""))
            message = "quarantined: " + "; ".join(str(p) for p in quarantine.get("problems", ()))
        return Observed(
            generation=node.plan_generation,
            state=state,
            failed_step=step,
            failed_message=message,
            agent_ok=not r.agent_version or node.agent_version == r.agent_version,
            rolled_back=bool(r.agent_version) and node.agent_rolled_back_from == r.agent_version,
        )

    def _planes_healthy(self, environment: str) -> bool:
        """Every control plane of the cluster is ready and provisioned (True without a cluster, and
        with one control plane: there is no other to keep serving, and a failed one must be able to
        get the generation that fixes it, e.g. a single-node kubeadm environment)."""
        if self._cluster.cluster_spec(environment) is None:
            return True
        report = self._cluster.health(environment)
        planes = [n for n in report.nodes if n.role == Role.CONTROL_PLANE.value]
        if len(planes) == 1:
            return True
        return bool(planes) and all(n.ready and n.agent_state == "provisioned" for n in planes)


def _most_common(values: Iterable[str]) -> str:
    counts = Counter(v for v in values if v)
    return counts.most_common(1)[0][0] if counts else ""
