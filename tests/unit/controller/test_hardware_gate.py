"""The hardware gate: quarantine before any step and before the join, release once, diagnostics."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tether.controller.cluster.context import JOIN_GATE, JOIN_STEP
from tether.controller.errors import FailedPrecondition
from tether.controller.hardware.gate import HardwareGate
from tether.controller.hardware.names import CHECK_STEP, DIAGNOSTICS_STEP, HARDWARE_GATE, VERIFY_STEP
from tether.controller.hub import Hub, Session
from tether.controller.nodestate import NodeState, node_state
from tether.controller.spec.model import DriverSpec, EnvironmentSpec, GpuExpectation, HardwareSpec
from tether.controller.store import NodeRecord, SqliteStore
from tether.controller.store import sqlite as sqlite_store
from tether.controller.tokens import TokenRecord
from tether.nodeagent.model import Event, EventKind, Gpu, HostFacts, PciGpu, Plan, Step

SPEC = EnvironmentSpec(
    name="e",
    driver=DriverSpec(install=True),
    hardware=HardwareSpec(
        gpus=GpuExpectation(count=2, product="H200", driver_version="570.", diagnostics="short")
    ),
)
GOOD = HostFacts(gpus=tuple(Gpu(i, "NVIDIA H200", f"GPU-{i}", "570.124.06", 143771) for i in range(2)))
OLD_DRIVER = HostFacts(gpus=tuple(Gpu(i, "NVIDIA H200", f"GPU-{i}", "550.54.15", 143771) for i in range(2)))


class Inner:
    """The cluster's gate keeper: records what reaches it."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def gate_requested(self, node: NodeRecord, step: str, digest: str, attempt: int = 1) -> None:
        self.asked.append(step)

    async def secrets_received(
        self, node: NodeRecord, step: str, values: Mapping[str, str], command_id: str, outputs: Any = None
    ) -> bool:
        return True


class Lab:
    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        self.hub = Hub()
        self.inner = Inner()
        self.spec: EnvironmentSpec | None = SPEC
        self.gate = HardwareGate(store, self.hub, self.inner, spec_of=lambda node: self.spec)
        self.session: Session | None = None
        self.seq = 0

    async def node(self, name: str = "gpu-1", connect: bool = True) -> NodeRecord:
        await self.store.put_token(TokenRecord(f"t-{name}", "h", "e", "worker", "", 10**15, 1, 0, False, 1))
        rec = NodeRecord(name, "e", "worker", "f", "k", f"t-{name}", 1)
        await self.store.enroll_node(f"t-{name}", name, lambda t, e: (rec, True))
        plan = Plan.build(
            [
                Step(name=CHECK_STEP, script="check", gate=HARDWARE_GATE),
                Step(name="containerd", script="install"),
                Step(name=VERIFY_STEP, script="verify", gate=HARDWARE_GATE),
                Step(name=DIAGNOSTICS_STEP, script="dcgmi diag", gate=HARDWARE_GATE),
                Step(name=JOIN_STEP, script="kubeadm join", gate=JOIN_GATE),
            ]
        )
        await self.store.set_node_plan(name, plan)
        if connect:
            self.session = self.hub.attach(name, "e")
        return self.record(name)

    def record(self, name: str = "gpu-1") -> NodeRecord:
        rec = self.store.get_node(name)
        assert rec is not None
        return rec

    def digest(self, step: str, name: str = "gpu-1") -> str:
        return next(s.digest for s in self.store.node_steps(name) if s.name == step)

    async def ask(self, step: str, facts: HostFacts | None = None) -> None:
        await self.gate.gate_requested(self.record(), step, self.digest(step), facts=facts)

    def sent(self) -> list[Any]:
        assert self.session is not None
        out = []
        while not self.session.outbox.empty():
            out.append(self.session.outbox.get_nowait())
        return out

    def releases(self, msgs: list[Any]) -> list[tuple[str, str]]:
        return [
            (m.release.step, m.release.env["TETHER_HARDWARE_RESULT"]) for m in msgs if m.HasField("release")
        ]

    def notices(self, msgs: list[Any]) -> list[str]:
        return [m.notice.message for m in msgs if m.HasField("notice")]

    async def succeed(self, step: str, kind: EventKind = EventKind.SUCCEEDED) -> None:
        """The node reports ``step`` done; the store and the gate hear of it (as the service does)."""
        self.seq += 1
        e = Event(kind=kind, step=step, digest=self.digest(step), seq=self.seq, time_ms=self.seq)
        await self.store.append_events("gpu-1", [e])
        await self.gate.on_events(self.record(), [e])


@pytest.fixture
async def lab(tmp_path: Path) -> AsyncIterator[Lab]:
    store = SqliteStore(tmp_path / "t.db")
    yield Lab(store)
    await store.close()


async def test_matching_hardware_opens_the_gate_without_a_quarantine(lab: Lab) -> None:
    await lab.node()
    await lab.ask(CHECK_STEP, GOOD)
    msgs = lab.sent()
    assert lab.releases(msgs) == [(CHECK_STEP, "ok")]
    assert lab.notices(msgs) == []
    assert "quarantine" not in lab.record().hardware


async def test_a_mismatch_quarantines_says_why_once_and_keeps_the_gate_shut(lab: Lab) -> None:
    await lab.node()
    await lab.ask(CHECK_STEP, HostFacts())  # no GPU at all
    msgs = lab.sent()
    assert lab.releases(msgs) == []
    (notice,) = lab.notices(msgs)
    assert (
        "quarantined before any step (hardware-check): gpus.count: expected 2, found 0 on the PCI bus"
        in notice
    )
    q = lab.record().hardware["quarantine"]
    assert q["stage"] == "before-steps" and q["expected"]["gpus.count"] == "2"
    assert node_state(lab.record(), lab.store.node_steps("gpu-1"), True) is NodeState.QUARANTINED
    await lab.ask(CHECK_STEP, HostFacts())  # asked again (a reconnect): no second notice
    assert lab.sent() == []


async def test_release_opens_that_gate_once_and_records_who(lab: Lab) -> None:
    await lab.node()
    await lab.ask(CHECK_STEP, HostFacts())
    lab.sent()
    await lab.gate.release(lab.record(), "alice")
    msgs = lab.sent()
    assert lab.releases(msgs) == [(CHECK_STEP, "overridden")]
    assert any("released by alice despite: gpus.count: expected 2" in n for n in lab.notices(msgs))
    assert "quarantine" not in lab.record().hardware
    accepted = lab.record().hardware["accepted"]
    assert accepted["keys"] == ["gpus.count"] and accepted["by"] == "alice"  # for the drift watch
    await lab.ask(CHECK_STEP, HostFacts())  # the same step again (reconnect): still released
    assert lab.releases(lab.sent()) == [(CHECK_STEP, "overridden")]
    await lab.ask(VERIFY_STEP, HostFacts())  # the next check is not covered by that release
    assert lab.releases(lab.sent()) == []
    assert lab.record().hardware["quarantine"]["stage"] == "before-join"


async def test_release_of_a_node_that_is_not_quarantined_is_refused(lab: Lab) -> None:
    await lab.node()
    with pytest.raises(FailedPrecondition, match="not quarantined"):
        await lab.gate.release(lab.record(), "alice")


async def test_before_the_join_the_driver_is_checked_and_the_join_waits(lab: Lab) -> None:
    await lab.node()
    await lab.ask(CHECK_STEP, OLD_DRIVER)  # the driver version is not checked before any step
    assert lab.releases(lab.sent()) == [(CHECK_STEP, "ok")]
    await lab.ask(VERIFY_STEP, OLD_DRIVER)
    msgs = lab.sent()
    assert lab.releases(msgs) == []
    assert "gpus.driverVersion: expected 570.*, found 550.54.15" in lab.notices(msgs)[0]
    await lab.ask(JOIN_STEP)  # quarantined: the cluster's gate keeper never hears of it
    assert lab.inner.asked == []


async def test_an_early_join_request_is_held_until_the_hardware_steps_are_done(lab: Lab) -> None:
    await lab.node()
    await lab.ask(JOIN_STEP)  # a reconnect sends gate requests before the events that finish them
    assert lab.inner.asked == []
    await lab.succeed(VERIFY_STEP)
    assert lab.inner.asked == []  # diagnostics still to come
    await lab.succeed(DIAGNOSTICS_STEP)
    assert lab.inner.asked == [JOIN_STEP]  # handed on by itself: the agent does not ask again


async def test_hardware_steps_skipped_by_a_new_generation_count_as_done(lab: Lab) -> None:
    await lab.node()
    await lab.succeed(VERIFY_STEP, EventKind.SKIPPED)
    await lab.succeed(DIAGNOSTICS_STEP, EventKind.SKIPPED)
    await lab.ask(JOIN_STEP)
    assert lab.inner.asked == [JOIN_STEP]


async def test_a_release_is_used_up_once_its_step_is_done(lab: Lab) -> None:
    await lab.node()
    await lab.ask(CHECK_STEP, HostFacts())
    await lab.gate.release(lab.record(), "alice")
    lab.sent()
    await lab.succeed(CHECK_STEP)
    assert "released" not in lab.record().hardware
    await lab.ask(CHECK_STEP, HostFacts())  # the same step runs again (a rerun): checked again
    assert lab.releases(lab.sent()) == []
    assert lab.record().hardware["quarantine"]["step"] == CHECK_STEP


async def test_a_new_plan_without_the_quarantined_step_lifts_the_quarantine(lab: Lab) -> None:
    await lab.node()
    await lab.ask(CHECK_STEP, HostFacts())
    assert lab.record().hardware["quarantine"]
    plan = Plan.build([Step(name="containerd", script="install")])  # spec.hardware was removed
    await lab.store.set_node_plan("gpu-1", plan)
    await lab.gate.on_plan(lab.record(), plan)
    assert "quarantine" not in lab.record().hardware
    assert node_state(lab.record(), lab.store.node_steps("gpu-1"), True) is not NodeState.QUARANTINED


async def test_without_a_driver_to_install_the_join_check_counts_the_pci_bus(lab: Lab) -> None:
    lab.spec = EnvironmentSpec(name="e", hardware=HardwareSpec(gpus=GpuExpectation(count=2, product="H200")))
    await lab.node()
    bus = HostFacts(
        pci_gpus=tuple(PciGpu(f"0000:{i}b:00.0", "0x2335", "GH100 [H200 SXM 141GB]") for i in (3, 5))
    )
    await lab.ask(VERIFY_STEP, bus)  # the GPU operator brings the driver later, in a container
    assert lab.releases(lab.sent()) == [(VERIFY_STEP, "ok")]


async def test_no_release_reaches_a_revoked_node(lab: Lab) -> None:
    await lab.node()
    await lab.ask(CHECK_STEP, HostFacts())
    lab.sent()
    await lab.store.update_node("gpu-1", revoked=True)
    await lab.ask(CHECK_STEP, GOOD)
    assert lab.sent() == []


async def test_failed_diagnostics_quarantine_and_release_reruns_them_unchecked(lab: Lab) -> None:
    await lab.node()
    await lab.ask(DIAGNOSTICS_STEP)
    assert lab.releases(lab.sent()) == [(DIAGNOSTICS_STEP, "run")]
    failed = Event(
        kind=EventKind.FAILED,
        step=DIAGNOSTICS_STEP,
        digest=lab.digest(DIAGNOSTICS_STEP),
        seq=1,
        exit_code=1,
        observed={"diagnostics.result": "dcgmi is not installed"},
    )
    await lab.gate.on_events(lab.record(), [failed])
    q = lab.record().hardware["quarantine"]
    assert q["stage"] == "diagnostics" and q["found"] == {"diagnostics": "dcgmi is not installed"}
    assert "quarantined by GPU diagnostics" in lab.notices(lab.sent())[0]
    await lab.gate.release(lab.record(), "bob")
    msgs = lab.sent()
    assert [m.command.rerun.steps for m in msgs if m.HasField("command")] == [[DIAGNOSTICS_STEP]]
    await lab.ask(DIAGNOSTICS_STEP)
    assert lab.releases(lab.sent()) == [(DIAGNOSTICS_STEP, "overridden")]


async def test_failed_diagnostics_of_an_offline_node_cannot_be_released(lab: Lab) -> None:
    await lab.node(connect=False)
    digest = lab.digest(DIAGNOSTICS_STEP)
    failed = Event(kind=EventKind.FAILED, step=DIAGNOSTICS_STEP, digest=digest, seq=1, exit_code=1)
    await lab.gate.on_events(lab.record(), [failed])
    with pytest.raises(FailedPrecondition, match="not connected"):
        await lab.gate.release(lab.record(), "bob")


async def test_hardware_that_matches_later_lifts_the_quarantine(lab: Lab) -> None:
    await lab.node()
    await lab.ask(CHECK_STEP, HostFacts())
    lab.sent()
    await lab.ask(CHECK_STEP, GOOD)  # the operator fixed the machine; the agent asked again
    msgs = lab.sent()
    assert lab.releases(msgs) == [(CHECK_STEP, "ok")]
    assert "quarantine" not in lab.record().hardware


async def test_a_schema_4_database_gains_the_hardware_column(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    await SqliteStore(path).close()
    with sqlite3.connect(path) as conn:  # what a schema 4 controller wrote: no hardware column
        conn.execute("ALTER TABLE nodes DROP COLUMN hardware")
        conn.execute("UPDATE meta SET value='4' WHERE key='schema_version'")
    store = SqliteStore(path)
    try:
        await store.put_token(TokenRecord("t", "h", "e", "worker", "", 10**15, 1, 0, False, 1))
        await store.enroll_node(
            "t", "n", lambda t, e: (NodeRecord("n", "e", "worker", "f", "k", "t", 1), True)
        )
        await store.update_node("n", hardware={"quarantine": {"stage": "before-steps"}})
        rec = store.get_node("n")
        assert rec is not None and rec.hardware == {"quarantine": {"stage": "before-steps"}}
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        version = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    assert version == (str(sqlite_store.SCHEMA_VERSION),)


async def test_the_gate_and_the_drift_watch_never_overwrite_each_others_keys(lab: Lab) -> None:
    await lab.node()
    # Both read-modify-write the record; interleaved they must not lose a key.
    await asyncio.gather(
        lab.store.patch_node_hardware("gpu-1", {"quarantine": {"stage": "before-steps"}}),
        lab.store.patch_node_hardware("gpu-1", {"conditions": {"GPUErrors": {"reason": "XidErrors"}}}),
    )
    assert set(lab.record().hardware) == {"quarantine", "conditions"}
    await lab.store.patch_node_hardware("gpu-1", {"quarantine": None})
    assert set(lab.record().hardware) == {"conditions"}


async def test_failed_diagnostics_never_judged_before_a_restart_can_still_be_released(lab: Lab) -> None:
    await lab.node()
    digest = lab.digest(DIAGNOSTICS_STEP)
    failed = Event(kind=EventKind.FAILED, step=DIAGNOSTICS_STEP, digest=digest, seq=1, exit_code=1)
    await lab.store.append_events("gpu-1", [failed])  # stored and acked; the controller died then
    assert "quarantine" not in lab.record().hardware
    await lab.gate.release(lab.record(), "carol")
    msgs = lab.sent()
    assert [m.command.rerun.steps for m in msgs if m.HasField("command")] == [[DIAGNOSTICS_STEP]]
    assert lab.record().hardware["released"]["by"] == "carol"
