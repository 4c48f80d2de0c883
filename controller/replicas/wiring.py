"""This replica's part among the replicas: its registry entry, the lease, and the singleton work.

``start`` registers the replica and starts the leader; the singleton work is the rollouts driver,
the reset deadlines (overdue resets are given up) and the sweep of stale registry entries. The
cluster's choices that must happen once (the init control plane, the join slot, a new
environment's DNS name) are atomic in the store instead (``kv_put_if_absent``, ``chain``): they
are taken by whichever replica an agent or admin talks to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tether.controller import __version__, wire
from tether.controller.replicas.leader import Leader, Work, every
from tether.controller.replicas.registry import Registry
from tether.controller.replicas.rollout_relay import RolloutRelay
from tether.controller.store import Store

if TYPE_CHECKING:
    from tether.controller.app import App
    from tether.controller.resets import Resets

RESET_REARM_SECONDS = 2.0
SWEEP_SECONDS = 3600.0
SETTLE_SECONDS = 1.0  # a new leader's view takes in the last changes of the one before


@dataclass
class Replicas:
    store: Store
    registry: Registry
    leader: Leader

    @property
    def shared(self) -> bool:
        """Other replicas may share the store (PostgreSQL; SQLite has one process)."""
        return self.store.kind != "sqlite"

    def welcome_controllers(self) -> list[str]:
        """What an agent's welcome lists: the live replicas (none with SQLite: the agent keeps the
        address it was given, which may be a name or a load balancer, not this advertise address)."""
        return self.registry.live_addresses() if self.shared else []

    def list_pb(self) -> wire.admin.ListControllersResponse:
        return wire.admin.ListControllersResponse(
            controllers=[
                wire.admin.ControllerReplica(
                    id=r.id,
                    address=r.address,
                    version=r.version,
                    last_seen_ms=r.last_seen_ms,
                    leader=self.registry.leading(r),
                    live=self.registry.live(r),
                    started_ms=r.started_ms,
                )
                for r in self.registry.replicas()
            ]
        )

    async def stop(self) -> None:
        """A clean stop: the singleton work stops and the lease goes (another replica takes it at
        once), then this replica's registry entry."""
        await self.leader.stop()
        await self.registry.stop()


async def _nothing() -> None:
    return None


def singleton_work(app: App, resets: Resets, registry: Registry, relay: RolloutRelay) -> list[Work]:
    rearm = every("reset-deadlines", RESET_REARM_SECONDS, resets.rearm)

    async def stop_resets() -> None:
        await rearm.stop()
        await resets.unlead()

    return [
        Work("rollouts", app.rollouts.lead, app.rollouts.stop),
        Work("rollout-commands", _nothing, relay.unlead),  # others' commands answered while leading
        Work("reset-deadlines", rearm.start, stop_resets),
        every("replica-sweep", SWEEP_SECONDS, registry.sweep),
    ]


async def start(store: Store, app: App, resets: Resets, advertise: str) -> Replicas:
    """Register this replica and take the lead when it can (SQLite: at once, before serving)."""
    leader = Leader(store, settle_s=SETTLE_SECONDS if store.kind != "sqlite" else 0.0)
    registry = Registry(store, advertise, __version__, leading=lambda: leader.held)
    relay = RolloutRelay(store, app.rollouts, lambda: leader.held)
    leader.work = singleton_work(app, resets, registry, relay)
    leader.on_change = lambda held: registry.report_soon()
    if store.kind != "sqlite":
        await resets.unlead()  # until this replica leads
        app.rollouts.relay = relay
        store.subscribe(app.rollouts.on_store_change)
        store.subscribe(relay.on_store_change)
        await registry.start()  # reported every few seconds, for the other replicas
    else:  # the one process on the file: no reports to write (an idle controller writes nothing)
        await registry.sweep(older_than_s=0.0)  # earlier runs' entries go
    await leader.start()
    return Replicas(store, registry, leader)
