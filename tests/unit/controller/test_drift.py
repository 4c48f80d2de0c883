"""GPU drift as health: the rules (pure) and the watch that keeps a node's conditions."""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tether.controller import wire
from tether.controller.cli import describe
from tether.controller.cluster import health
from tether.controller.cluster.context import INIT_STEP, JOIN_STEP
from tether.controller.cluster.orchestrator import Orchestrator
from tether.controller.hardware.drift import (
    DRIVER_MISMATCH,
    GPU_ERRORS,
    GPUS_MISSING,
    Condition,
    DriftWatch,
    bus_id,
    compare,
    evaluate,
    notices,
)
from tether.controller.hub import Hub, Session
from tether.controller.secretbox import SecretBox
from tether.controller.spec import load_document
from tether.controller.spec.model import GpuExpectation
from tether.controller.store import NodeRecord, SqliteStore
from tether.controller.tokens import TokenRecord
from tether.nodeagent.model import Event, EventKind, Gpu, Health, PciGpu, Plan, Step
from tether.nodeagent.secrets import Redactor

EIGHT = GpuExpectation(count=8, product="H200", driver_version="570.")


def bus(i: int) -> str:
    return f"0000:{0x18 + i:02x}:00.0"


def gpus(n: int = 8, **changes: Any) -> tuple[Gpu, ...]:
    plain: dict[str, Any] = {
        "name": "NVIDIA H200",
        "driver_version": "570.124.06",
        "memory_total_mib": 143771,
    }
    return tuple(
        # nvidia-smi writes the bus id as 00000000:18:00.0
        Gpu(index=i, pci_bus_id="0000" + bus(i).upper(), **{**plain, **changes})
        for i in range(n)
    )


def pci(n: int = 8) -> tuple[PciGpu, ...]:
    return tuple(PciGpu(address=bus(i), device_id="0x2335") for i in range(n))


# -- the rules ------------------------------------------------------------------------------------


def test_bus_ids_of_nvidia_smi_and_sysfs_are_the_same() -> None:
    assert bus_id("00000000:3B:00.0") == bus_id("0000:3b:00.0") == "0000:3b:00.0"


def test_a_node_with_everything_expected_holds_no_condition() -> None:
    assert evaluate(EIGHT, Health(gpus=gpus(), pci_gpus=pci())) == {}


def test_a_gpu_on_the_bus_that_nvidia_smi_lost_fell_off_the_bus() -> None:
    lost = tuple(g for g in gpus() if g.index != 3)
    got = evaluate(EIGHT, Health(gpus=lost, pci_gpus=pci()))
    assert got == {
        GPUS_MISSING: Condition(
            "FellOffTheBus", f"expected 8 GPUs, nvidia-smi lists 7, 8 on the PCI bus (missing {bus(3)})"
        )
    }


def test_a_gpu_gone_from_both_views_is_not_detected_and_named_when_it_was_seen() -> None:
    got = evaluate(EIGHT, Health(gpus=gpus(7), pci_gpus=pci(7)), seen={bus(i) for i in range(8)})
    assert got == {
        GPUS_MISSING: Condition("NotDetected", f"expected 8 GPUs, nvidia-smi lists 7 (missing {bus(7)})")
    }
    unnamed = evaluate(EIGHT, Health(gpus=gpus(7), pci_gpus=pci(7)))
    assert unnamed[GPUS_MISSING].message == "expected 8 GPUs, nvidia-smi lists 7"


def test_nvidia_smi_listing_none_while_the_bus_has_them_is_a_driver_not_loaded() -> None:
    got = evaluate(EIGHT, Health(gpus=(), pci_gpus=pci()))
    assert got[GPUS_MISSING].reason == "DriverNotLoaded"
    assert got[GPUS_MISSING].message.startswith("expected 8 GPUs, nvidia-smi lists none, 8 on the PCI bus")


def test_without_a_driver_only_the_pci_bus_counts() -> None:
    no_driver = GpuExpectation(count=8)
    assert evaluate(no_driver, Health(pci_gpus=pci()), driver=False) == {}
    got = evaluate(no_driver, Health(pci_gpus=pci(6)), driver=False)
    assert got == {GPUS_MISSING: Condition("NotDetected", "expected 8 GPUs, 6 on the PCI bus")}


def test_a_pci_scan_that_sees_nothing_does_not_hide_what_nvidia_smi_lists() -> None:
    assert evaluate(EIGHT, Health(gpus=gpus(), pci_gpus=())) == {}  # no /sys in a container


def test_uncorrected_ecc_and_xid_errors_are_gpu_errors_naming_the_gpus() -> None:
    ecc = tuple(g if g.index != 2 else Gpu(**{**g.__dict__, "ecc_uncorrected": 3}) for g in gpus())
    got = evaluate(EIGHT, Health(gpus=ecc, pci_gpus=pci()))
    assert got == {
        GPU_ERRORS: Condition(
            "UncorrectedECC", f"uncorrected ECC errors on GPU 2 ({bus(2)}): 3", (f"ecc {bus(2)}",)
        )
    }
    xid = tuple(g if g.index != 5 else Gpu(**{**g.__dict__, "xid_errors": 2}) for g in gpus())
    assert evaluate(EIGHT, Health(gpus=xid))[GPU_ERRORS] == Condition(
        "XidErrors", f"Xid errors on GPU 5 ({bus(5)}): 2", (f"xid {bus(5)}",)
    )
    both = evaluate(EIGHT, Health(gpus=gpus(10, ecc_uncorrected=1, xid_errors=4)))[GPU_ERRORS]
    assert both.reason == "UncorrectedECC" and "; Xid errors on GPU 0" in both.message
    assert both.message.count("and 2 more") == 2  # eight GPUs named at most


def test_a_driver_not_of_the_expected_version_is_a_mismatch() -> None:
    old = gpus(driver_version="565.57.01")
    got = evaluate(EIGHT, Health(gpus=old[:2] + gpus()[2:], pci_gpus=pci()))
    assert got == {
        DRIVER_MISMATCH: Condition("UnexpectedVersion", "expected driver 570.*, found 565.57.01 on GPU 0, 1")
    }
    assert evaluate(GpuExpectation(count=8), Health(gpus=old)) == {}  # no version expected


def test_several_conditions_hold_at_once() -> None:
    got = evaluate(EIGHT, Health(gpus=gpus(7, driver_version="565.1", xid_errors=1), pci_gpus=pci()))
    assert set(got) == {GPUS_MISSING, GPU_ERRORS, DRIVER_MISMATCH}


# -- changes ------------------------------------------------------------------------------------


def test_compare_says_what_was_raised_changed_and_cleared_and_keeps_since() -> None:
    held = {GPUS_MISSING: {"reason": "NotDetected", "message": "a", "since_ms": 5}}
    assert compare(held, {GPUS_MISSING: Condition("NotDetected", "a")}, 99) is None
    t = compare(
        held, {GPUS_MISSING: Condition("FellOffTheBus", "b"), GPU_ERRORS: Condition("XidErrors", "x")}, 99
    )
    assert t is not None and t.raised == (GPU_ERRORS,) and t.changed == (GPUS_MISSING,) and not t.cleared
    assert t.conditions[GPUS_MISSING]["since_ms"] == 5 and t.conditions[GPU_ERRORS]["since_ms"] == 99
    cleared = compare(t.conditions, {}, 100)
    assert cleared is not None and cleared.cleared == (GPU_ERRORS, GPUS_MISSING) and cleared.conditions == {}
    assert notices(cleared) == ["GPU drift: GPUErrors cleared", "GPU drift: GPUsMissing cleared"]
    assert notices(t) == [
        "GPU drift: GPUErrors (XidErrors): x",
        "GPU drift: GPUsMissing still holds (FellOffTheBus): b",
    ]


def test_more_errors_on_the_same_gpus_are_no_change_other_gpus_are() -> None:
    def errors(ecc: dict[int, int]) -> dict[str, Condition]:
        return evaluate(
            EIGHT,
            Health(gpus=tuple(Gpu(**{**g.__dict__, "ecc_uncorrected": ecc.get(g.index, 0)}) for g in gpus())),
        )

    raised = compare({}, errors({2: 1}), 5)
    assert raised is not None and raised.raised == (GPU_ERRORS,)
    held = raised.conditions
    assert held[GPU_ERRORS]["affected"] == [f"ecc {bus(2)}"]
    assert compare(held, errors({2: 7}), 9) is None  # more errors on the same GPU: nothing to say
    other = compare(held, errors({2: 7, 4: 1}), 9)
    assert other is not None and other.changed == (GPU_ERRORS,)
    assert other.conditions[GPU_ERRORS]["since_ms"] == 5
    assert other.conditions[GPU_ERRORS]["message"].endswith(f"GPU 2 ({bus(2)}): 7, GPU 4 ({bus(4)}): 1")
    # A condition stored before it said what it is about: compared by its message once more.
    old = {GPU_ERRORS: {"reason": "UncorrectedECC", "message": "was", "since_ms": 1}}
    again = compare(old, errors({2: 1}), 9)
    assert again is not None and again.changed == (GPU_ERRORS,)
    assert again.conditions[GPU_ERRORS]["affected"] == [f"ecc {bus(2)}"]


def test_cluster_health_shows_gpu_conditions_as_degraded() -> None:
    cond = health.NodeCondition("GPUsMissing", "FellOffTheBus", "expected 8 GPUs", 1)
    report = health.assess(
        "c1",
        [health.Member("w1", "worker", "provisioned", True, conditions=(cond,))],
        None,
        desired_control_planes=0,
        desired_workers=1,
    )
    degraded = next(c for c in report.conditions if c.type == "Degraded")
    assert degraded.status and "GPU conditions: w1 (GPUsMissing)" in degraded.message
    pb = wire.cluster_health_to_pb(report)
    assert [(c.type, c.reason) for c in pb.nodes[0].conditions] == [("GPUsMissing", "FellOffTheBus")]


# -- the watch ------------------------------------------------------------------------------------

SPEC = """\
apiVersion: holodeck.nvidia.com/v1alpha1
kind: Environment
metadata: {{name: {name}}}
spec:
  kubernetes: {{install: true, installer: kubeadm, release: {{version: v1.31.0}}}}
  cluster:
    controlPlane: {{count: 1}}
    workers: {{count: 1}}
{hardware}"""
HARDWARE = """\
  hardware:
    gpus: {count: 2, driverVersion: "570."}
    onDrift: cordon
"""


class Lab:
    def __init__(self, store: SqliteStore, tmp_path: Path) -> None:
        self.store = store
        self.hub = Hub()
        self.orch = Orchestrator(store, self.hub, SecretBox.load_or_create(tmp_path / "k"), Redactor())
        self.drift = DriftWatch(
            store, self.hub, lambda env: load_document(env.document), cordoner=self.orch, recheck_seconds=0
        )
        self.sessions: dict[str, Session] = {}

    async def node(self, name: str, role: str, env: str = "c1", generation: int = 1) -> NodeRecord:
        await self.store.put_token(TokenRecord(f"t-{name}", "h", env, role, "", 10**15, 1, 0, False, 1))
        rec = NodeRecord(
            name=name,
            environment=env,
            role=role,
            cert_fingerprint="f",
            key_hash="k",
            token_id=f"t-{name}",
            enrolled_ms=1,
        )
        await self.store.enroll_node(f"t-{name}", name, lambda t, e: (rec, True))
        await self.store.set_node_plan(name, self.plan(role, generation))
        self.sessions[name] = self.hub.attach(name, env)
        return rec

    @staticmethod
    def plan(role: str, generation: int) -> Plan:
        step = INIT_STEP if role == "control-plane" else JOIN_STEP
        return Plan.build([Step(name=step, script="kubeadm")], generation=generation)

    async def provisioned(self, rec: NodeRecord) -> None:
        step = self.store.node_steps(rec.name)[0]
        e = Event(kind=EventKind.SUCCEEDED, step=step.name, digest=step.digest, seq=1, time_ms=1)
        await self.store.append_events(rec.name, [e])
        await self.orch.on_events(rec, [e])

    async def report(self, rec: NodeRecord, h: Health) -> None:
        await self.drift.on_health(rec.name, rec.environment, self.sessions[rec.name], wire.health_to_pb(h))

    def conditions(self, name: str) -> dict[str, Any]:
        rec = self.store.get_node(name)
        assert rec is not None
        return dict(rec.hardware.get("conditions", {}))

    def sent(self, name: str) -> list[Any]:
        q = self.sessions[name].outbox
        out = []
        while not q.empty():
            out.append(q.get_nowait())
        return out

    def notices(self, name: str) -> list[str]:
        return [m.notice.message for m in self.sent(name) if m.WhichOneof("kind") == "notice"]


@pytest.fixture
async def lab(tmp_path: Path) -> AsyncIterator[Lab]:
    store = SqliteStore(tmp_path / "t.db")
    await store.put_environment(
        "c1", SPEC.format(name="c1", hardware=HARDWARE), "holodeck.nvidia.com/v1alpha1", {}
    )
    await store.put_environment(
        "plain", SPEC.format(name="plain", hardware=""), "holodeck.nvidia.com/v1alpha1", {}
    )
    yield Lab(store, tmp_path)
    await store.close()


TWO = Health(gpus=gpus(2), pci_gpus=pci(2))


async def test_a_drift_is_raised_once_announced_and_cleared(lab: Lab) -> None:
    w = await lab.node("w1", "worker")
    await lab.provisioned(w)
    await lab.report(w, TWO)
    assert lab.conditions("w1") == {} and lab.notices("w1") == []
    await lab.store.update_node("w1", hardware={"released": {"by": "ops"}})
    one = Health(gpus=gpus(1), pci_gpus=pci(2))
    await lab.report(w, one)  # once is not enough: raised when the next report shows it too
    assert lab.conditions("w1") == {} and lab.notices("w1") == []
    await lab.report(w, one)
    held = lab.conditions("w1")
    assert list(held) == [GPUS_MISSING] and held[GPUS_MISSING]["reason"] == "FellOffTheBus"
    rec = lab.store.get_node("w1")
    assert rec is not None and rec.hardware["released"] == {"by": "ops"}  # other keys are kept
    assert lab.notices("w1") == [
        "GPU drift: GPUsMissing (FellOffTheBus): expected 2 GPUs, nvidia-smi lists 1, 2 on the PCI bus "
        f"(missing {bus(1)})",
        "hardware.onDrift cordon (GPUsMissing): kubectl cordon w1 waits for a joined control plane to "
        "connect to run it",
    ]
    await lab.report(w, one)  # the same view again: nothing written, nothing said
    assert lab.notices("w1") == []
    await lab.report(w, TWO)  # cleared at once
    assert lab.conditions("w1") == {} and lab.notices("w1") == ["GPU drift: GPUsMissing cleared"]


async def test_one_odd_reading_raises_nothing_and_cordons_nothing(lab: Lab) -> None:
    cp = await lab.node("cp1", "control-plane")
    await lab.provisioned(cp)
    w = await lab.node("w1", "worker")
    await lab.provisioned(w)
    await lab.report(w, TWO)
    lab.sent("cp1")
    timed_out = Health(gpus=(), pci_gpus=pci(2))  # nvidia-smi timed out: it listed nothing
    for _ in range(3):
        await lab.report(w, timed_out)
        await lab.report(w, TWO)
    assert lab.conditions("w1") == {} and lab.notices("w1") == []
    assert not [m for m in lab.sent("cp1") if m.WhichOneof("kind") == "command"]  # no cordon
    # Another condition in the next report still counts as the second one in a row of GPUsMissing.
    await lab.report(w, timed_out)
    await lab.report(w, Health(gpus=gpus(1), pci_gpus=pci(2)))
    assert lab.conditions("w1")[GPUS_MISSING]["reason"] == "FellOffTheBus"


async def test_a_mismatch_an_operator_released_is_shown_but_not_cordoned(lab: Lab) -> None:
    cp = await lab.node("cp1", "control-plane")
    await lab.provisioned(cp)
    w = await lab.node("w1", "worker")
    await lab.provisioned(w)
    # `node release w1` at hardware-verify accepted the old driver (tether.controller.hardware.gate).
    await lab.store.patch_node_hardware("w1", {"accepted": {"keys": ["gpus.driverVersion"], "by": "alice"}})
    await lab.report(w, TWO)
    lab.sent("cp1")
    old = Health(gpus=gpus(2, driver_version="550.54.15"), pci_gpus=pci(2))
    await lab.report(w, old)
    await lab.report(w, old)
    assert list(lab.conditions("w1")) == [DRIVER_MISMATCH]  # still shown
    assert not [m for m in lab.sent("cp1") if m.WhichOneof("kind") == "command"]  # not cordoned
    await lab.report(w, Health(gpus=gpus(2, driver_version="550.54.15", ecc_uncorrected=1), pci_gpus=pci(2)))
    await lab.report(w, Health(gpus=gpus(2, driver_version="550.54.15", ecc_uncorrected=1), pci_gpus=pci(2)))
    tasks = [m.command.task.step.name for m in lab.sent("cp1") if m.WhichOneof("kind") == "command"]
    assert tasks == ["cordon-w1"]  # an error it did not accept still cordons


async def test_nothing_is_evaluated_before_the_node_provisioned(lab: Lab) -> None:
    w = await lab.node("w1", "worker")
    await lab.report(w, Health())
    await lab.report(w, Health())
    assert lab.conditions("w1") == {} and lab.notices("w1") == []
    await lab.provisioned(w)
    await lab.report(w, Health())  # the same view, but now provisioned: the first one that counts
    assert lab.conditions("w1") == {}
    await lab.report(w, Health())
    assert list(lab.conditions("w1")) == [GPUS_MISSING]


async def test_a_node_of_an_environment_without_gpu_expectation_holds_none(lab: Lab) -> None:
    w = await lab.node("p1", "worker", env="plain")
    await lab.provisioned(w)
    await lab.report(w, Health())
    assert lab.conditions("p1") == {}
    await lab.store.update_node(
        "p1", hardware={"conditions": {GPUS_MISSING: {"reason": "x", "message": "y"}}}
    )
    lab.drift.forget("p1")
    await lab.report(w, Health())  # one held from before the expectation went: cleared
    assert lab.conditions("p1") == {} and lab.notices("p1") == ["GPU drift: GPUsMissing cleared"]


async def test_on_drift_cordon_has_a_control_plane_cordon_the_node(lab: Lab) -> None:
    cp = await lab.node("cp1", "control-plane")
    await lab.provisioned(cp)
    w = await lab.node("w1", "worker")
    await lab.provisioned(w)
    await lab.report(w, TWO)
    lab.sent("cp1")
    await lab.report(w, Health(gpus=gpus(2, ecc_uncorrected=1), pci_gpus=pci(2)))
    assert not lab.sent("cp1")  # one report: no cordon yet
    await lab.report(w, Health(gpus=gpus(2, ecc_uncorrected=1), pci_gpus=pci(2)))
    tasks = [m.command.task.step for m in lab.sent("cp1") if m.WhichOneof("kind") == "command"]
    cordon = [t for t in tasks if t.name == "cordon-w1"]
    assert len(cordon) == 1 and cordon[0].env["ACTION"] == "cordon" and cordon[0].env["NODE"] == "w1"
    said = lab.notices("w1")
    assert said[0].startswith("GPU drift: GPUErrors (UncorrectedECC)")
    assert said[1] == "hardware.onDrift cordon (GPUErrors): kubectl cordon w1 sent to cp1"
    done = Event(kind=EventKind.SUCCEEDED, step="task:cordon-w1", digest=cordon[0].digest, seq=2, time_ms=2)
    await lab.orch.on_events(cp, [done])
    assert lab.notices("w1") == ["hardware.onDrift cordon: w1: kubectl cordon done (on cp1)"]
    # Held on, with more errors on the same GPUs: no notice, no write, no second cordon.
    await lab.report(w, Health(gpus=gpus(2, ecc_uncorrected=2), pci_gpus=pci(2)))
    assert lab.notices("w1") == []
    assert lab.conditions("w1")[GPU_ERRORS]["message"].endswith(f"GPU 1 ({bus(1)}): 1")  # as raised
    # Cleared: never uncordoned.
    await lab.report(w, TWO)
    tasks = [m.command.task.step.name for m in lab.sent("cp1") if m.WhichOneof("kind") == "command"]
    assert not any(t.startswith(("cordon-", "uncordon-")) for t in tasks)


async def test_a_new_spec_is_held_against_a_node_once_its_rollout_reached_it(lab: Lab) -> None:
    w = await lab.node("w1", "worker", generation=1)
    await lab.provisioned(w)
    await lab.report(w, TWO)
    newer = HARDWARE.replace('"570."', '"575."')
    env, _ = await lab.store.put_environment(
        "c1", SPEC.format(name="c1", hardware=newer), "holodeck.nvidia.com/v1alpha1", {}
    )
    assert env.generation == 2
    for _ in range(3):  # its plan is still of generation 1: its driver is what that one expects
        await lab.report(w, TWO)
    assert lab.conditions("w1") == {} and lab.notices("w1") == []
    await lab.store.set_node_plan("w1", lab.plan("worker", 2))  # the rollout reached it
    await lab.report(w, TWO)
    await lab.report(w, TWO)
    held = lab.conditions("w1")
    assert list(held) == [DRIVER_MISMATCH] and "expected driver 575.*" in held[DRIVER_MISMATCH]["message"]


async def test_a_generation_the_store_no_longer_keeps_is_judged_by_the_current_one(lab: Lab) -> None:
    w = await lab.node("w1", "worker", generation=99)
    await lab.provisioned(w)
    await lab.report(w, Health(gpus=gpus(2, driver_version="565.1"), pci_gpus=pci(2)))
    await lab.report(w, Health(gpus=gpus(2, driver_version="565.1"), pci_gpus=pci(2)))
    assert list(lab.conditions("w1")) == [DRIVER_MISMATCH]


def test_metrics_do_not_import_the_drift_watch() -> None:
    code = "import sys, tether.controller.metrics; print('tether.controller.hardware.drift' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_node_describe_lists_the_conditions() -> None:
    n = wire.admin.Node(name="w1", environment="c1", role="worker", state="provisioned", connected=True)
    n.conditions.add(type=GPUS_MISSING, reason="FellOffTheBus", message="expected 2 GPUs, nvidia-smi lists 1")
    out = io.StringIO()
    describe.node(n, out)
    line = next(x for x in out.getvalue().splitlines() if x.startswith("Conditions:"))
    assert "GPUsMissing (FellOffTheBus) since -: expected 2 GPUs, nvidia-smi lists 1" in line
