"""Turns a node (environment, role, facts) into its plan, with caching.

Rendering is pure and depends only on ``NodeContext``; fleets of identical
nodes share one rendered plan. The cache is keyed by environment, generation and context (facts
a node chooses among them), so it is bounded: the ``PLAN_CACHE_ENTRIES`` most recently used.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace
from typing import Protocol

from tether.controller.cluster.context import ClusterContext
from tether.controller.limits import PLAN_CACHE_ENTRIES
from tether.controller.render import NodeContext, render
from tether.controller.spec import LoadedSpec, load_document
from tether.controller.store import EnvironmentRecord, Store
from tether.nodeagent.model import AgentTarget, HostFacts, Plan

SPECS_PER_ENVIRONMENT = 4  # parsed generations kept per environment (a rollout needs two)

# Facts that change without changing what a node needs (render never sees them).
_VOLATILE = {
    "hostname": "",
    "boot_id": "",
    "machine_id": "",
    "addresses": (),
    "gpus": (),
    "cpu_count": 0,
    "memory_total_bytes": 0,
    "pci_gpus": (),
}


def stable_facts(facts: HostFacts) -> HostFacts:
    return replace(facts, **_VOLATILE)  # type: ignore[arg-type]


class Bundles(Protocol):
    """Where the planner learns what an agent version's bundle is (``tether.controller.agentbundles``)."""

    def target(self, version: str) -> AgentTarget | None: ...

    def versions(self) -> list[AgentTarget]: ...


class Planner:
    def __init__(
        self, store: Store, cache_size: int = PLAN_CACHE_ENTRIES, bundles: Bundles | None = None
    ) -> None:
        self._store = store
        self._specs: OrderedDict[tuple[str, int], LoadedSpec] = OrderedDict()
        self._plans: OrderedDict[tuple[object, ...], Plan] = OrderedDict()
        self._cache_size = cache_size
        self.bundles = bundles

    def spec(self, env: EnvironmentRecord) -> LoadedSpec:
        loaded = self._specs.get((env.name, env.generation))
        if loaded is None:
            loaded = load_document(env.document)
            self.remember(env, loaded)
        return loaded

    def remember(self, env: EnvironmentRecord, loaded: LoadedSpec) -> None:
        """Keep ``loaded`` (parsed from ``env.document``); the newest few generations stay."""
        self._specs[(env.name, env.generation)] = loaded
        mine = sorted(k for k in self._specs if k[0] == env.name)
        for key in mine[:-SPECS_PER_ENVIRONMENT]:
            del self._specs[key]

    def revision(self, environment: str, generation: int = 0) -> EnvironmentRecord | None:
        """The environment as of ``generation`` (0: the current one), if the store still has it."""
        env = self._store.get_environment(environment)
        if env is None or not generation or generation == env.generation:
            return env
        return self._store.get_revision(environment, generation)

    def plan(
        self,
        environment: str,
        role: str,
        facts: HostFacts,
        cluster: ClusterContext | None = None,
        generation: int = 0,
    ) -> Plan:
        """The plan of a node of ``environment`` at ``generation`` (0 or unknown: the current one)."""
        env = self.revision(environment, generation) or self._store.get_environment(environment)
        if env is None:
            return Plan.build([], environment=environment, role=role)
        ctx = NodeContext(role=role, facts=stable_facts(facts), cluster=cluster)
        key = (env.name, env.generation, ctx)
        plan = self._plans.get(key)
        if plan is not None:
            self._plans.move_to_end(key)
        else:
            rendered = render(self.spec(env).spec, ctx)
            plan = Plan.build(
                rendered.steps,
                generation=env.generation,
                environment=env.name,
                role=role,
                agent=self._agent(env.agent_version),
            )
            self._plans[key] = plan
            while len(self._plans) > self._cache_size:
                self._plans.popitem(last=False)
        return plan

    def _agent(self, version: str) -> AgentTarget | None:
        if not version or self.bundles is None:
            return None
        return self.bundles.target(version)
