"""Turns a node (environment, role, facts) into its plan, with caching.

Rendering is pure and depends only on ``NodeContext``; fleets of identical
nodes share one rendered plan. The cache is keyed by environment, generation and context (facts
a node chooses among them), so it is bounded: the ``PLAN_CACHE_ENTRIES`` most recently used.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

from controller.cluster.context import ClusterContext
from controller.limits import PLAN_CACHE_ENTRIES
from controller.render import NodeContext, render
from controller.spec import LoadedSpec, load_document
from controller.store import EnvironmentRecord, Store
from nodeagent.model import HostFacts, Plan

# Facts that change without changing what a node needs (render never sees them).
_VOLATILE = {"hostname": "", "boot_id": "", "machine_id": "", "addresses": (), "gpus": ()}


def stable_facts(facts: HostFacts) -> HostFacts:
    return replace(facts, **_VOLATILE)  # type: ignore[arg-type]


class Planner:
    def __init__(self, store: Store, cache_size: int = PLAN_CACHE_ENTRIES) -> None:
        self._store = store
        self._specs: dict[tuple[str, int], LoadedSpec] = {}
        self._plans: OrderedDict[tuple[object, ...], Plan] = OrderedDict()
        self._cache_size = cache_size

    def spec(self, env: EnvironmentRecord) -> LoadedSpec:
        loaded = self._specs.get((env.name, env.generation))
        if loaded is None:
            loaded = load_document(env.document)
            self.remember(env, loaded)
        return loaded

    def remember(self, env: EnvironmentRecord, loaded: LoadedSpec) -> None:
        """Keep ``loaded`` (parsed from ``env.document``) as the environment's current spec."""
        self._specs = {k: v for k, v in self._specs.items() if k[0] != env.name}
        self._specs[(env.name, env.generation)] = loaded

    def plan(
        self, environment: str, role: str, facts: HostFacts, cluster: ClusterContext | None = None
    ) -> Plan:
        env = self._store.get_environment(environment)
        if env is None:
            return Plan.build([], environment=environment, role=role)
        ctx = NodeContext(role=role, facts=stable_facts(facts), cluster=cluster)
        key = (env.name, env.generation, ctx)
        plan = self._plans.get(key)
        if plan is not None:
            self._plans.move_to_end(key)
        else:
            rendered = render(self.spec(env).spec, ctx)
            plan = Plan.build(rendered.steps, generation=env.generation, environment=env.name, role=role)
            self._plans[key] = plan
            while len(self._plans) > self._cache_size:
                self._plans.popitem(last=False)
        return plan
