"""Issue 15 on real systemd nodes: the GPU hardware gate before the cluster join, and GPU drift.

The testbed nodes have no GPU: a fake ``nvidia-smi`` and ``dcgmi`` (TEST FIXTURES,
``tests/e2e/fixtures/fake_gpu``) in their /usr/local/bin report what each test writes into
/etc/tether-fake-gpu. One testbed (4 nodes) and one controller serve the whole module:

* ``gpu``: a kubeadm cluster (stand-in kubeadm), 1 control plane + 1 worker, expecting 2 H200 with
  a 570 driver and short DCGM diagnostics. The control plane (570.124.06) passes and runs
  kubeadm-init; the worker (550.54.15) passes hardware-check and its base steps, then is
  quarantined at hardware-verify: kubeadm-join never starts. ``tetherctl node release`` lets it
  join, and its events name the admin who did it.
* drift on the provisioned control plane: a GPU gone from nvidia-smi raises GPUsMissing (and it
  clears when the GPU is back), an Xid line in the kernel journal GPUErrors, another driver
  DriverMismatch; with ``onDrift: cordon`` the node is cordoned.
* ``diag`` (no cluster): a failing ``dcgmi diag`` and a node without dcgmi are both quarantined
  at stage diagnostics, saying why; a release lets the first one finish.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml
from cryptography import x509

from tests.e2e.fixtures import fake_gpu
from tests.e2e.test_cluster import Lab, environment
from tests.e2e.testbed.testbed import Testbed
from tests.integration.harness import wait_for
from tether.controller.ca import ADMIN_URI_PREFIX

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

DRIVER = "570.124.06"
OLD_DRIVER = "550.54.15"
CP, WORKER, DIAG_FAIL, NO_DCGM = "node1", "node2", "node3", "node4"
TERMINAL = ("succeeded", "failed", "skipped")
DIAG_ENV = """\
apiVersion: holodeck.nvidia.com/v1alpha1
kind: Environment
metadata:
  name: diag
spec:
  hardware:
    gpus: {count: 2, product: H200, diagnostics: short}
  customTemplates:
    - name: hello
      inline: echo "provisioned $(hostname)"
"""


def gpu_environment(bed: Testbed) -> str:
    doc = yaml.safe_load(environment(bed, "gpu", control_planes=1, workers=1))
    doc["spec"]["hardware"] = {
        "gpus": {
            "count": 2,
            "product": "H200",
            "memoryMiB": 140000,
            "driverVersion": "570.",
            "diagnostics": "short",
        },
        "onDrift": "cordon",
    }
    return str(yaml.safe_dump(doc, sort_keys=False))


# -- fixtures -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bed(testbed_factory: Callable[..., Testbed]) -> Iterator[Testbed]:
    made = testbed_factory(4)
    # Before any agent runs: the facts of its first Hello already list the GPUs.
    fake_gpu.install(made, CP, fake_gpu.gpus(2, driver=DRIVER, node=CP))
    fake_gpu.install(made, WORKER, fake_gpu.gpus(2, driver=OLD_DRIVER, node=WORKER))
    fake_gpu.install(made, DIAG_FAIL, fake_gpu.gpus(2, driver=DRIVER, node=DIAG_FAIL), diagnostics="fail")
    fake_gpu.install(made, NO_DCGM, fake_gpu.gpus(2, driver=DRIVER, node=NO_DCGM))
    fake_gpu.remove_tool(made, NO_DCGM, "dcgmi")
    yield made
    problems = made.down()
    assert not problems, f"testbed teardown left: {problems}"


@pytest.fixture(scope="module")
def lab(bed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    made = Lab(bed, tmp_path_factory.mktemp("gpu-gate"))
    yield made
    made.close()


# -- what the controller says ---------------------------------------------------------------------


def describe(lab: Lab, node: str) -> dict[str, Any]:
    return json.loads(lab.ctl("node", "describe", node, "-o", "json").stdout)  # type: ignore[no-any-return]


def states(lab: Lab) -> dict[str, str]:
    return {n["name"]: n["state"] for n in json.loads(lab.ctl("node", "list", "-o", "json").stdout)}


def list_state_column(lab: Lab, node: str) -> str:
    """The STATE column of ``tetherctl node list`` (the table) for ``node``."""
    lines = lab.ctl("node", "list").stdout.splitlines()
    column = lines[0].split().index("STATE")
    row = next(line.split() for line in lines[1:] if line.split()[:1] == [node])
    return re.sub(r"\x1b\[[0-9;]*m", "", row[column])


def text_of(e: dict[str, Any]) -> str:
    return " ".join([e["message"], *e["lines"]])


def kinds(lab: Lab, node: str, step: str) -> list[str]:
    return [e["kind"] for e in lab.step_events(node, step)]


def seconds(rfc3339: str) -> float:
    return dt.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def first_time(lab: Lab, node: str, step: str, kind: str) -> float:
    times = [seconds(e["time"]) for e in lab.step_events(node, step) if e["kind"] == kind]
    assert times, f"{node}: no {kind} event for {step}\n{lab.summary([node])}"
    return times[0]


def admin_name(lab: Lab) -> str:
    """Who the controller takes tetherctl for: the name in its admin certificate's identity URI
    (``spiffe://tether/admin/ROLE/NAME``; admin.conf's ``name:`` need not be the same)."""
    pem = yaml.safe_load(lab.controller.config.read_text())["certificate"].encode()
    sans = x509.load_pem_x509_certificate(pem).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    uris = sans.value.get_values_for_type(x509.UniformResourceIdentifier)
    mine = [u.removeprefix(ADMIN_URI_PREFIX) for u in uris if u.startswith(ADMIN_URI_PREFIX)]
    names = [u.partition("/")[2] for u in mine]
    assert names, uris
    return names[0]


def assert_released_by(lab: Lab, node: str, admin: str) -> None:
    """An event of ``node`` says that ``admin`` released it."""
    events = lab.events(node)
    infos = [f"{e['step'] or '-'}: {text_of(e)}" for e in events if e["kind"] == "info"]
    assert any(f"released by {admin}" in text_of(e) for e in events), (
        f"no event of {node} says 'released by {admin}'; its info events: {infos}"
    )


def wait_state(lab: Lab, node: str, want: str, timeout: float = 300) -> None:
    def check() -> bool:
        now = states(lab).get(node, "")
        if now == "failed" and want != "failed":
            pytest.fail(f"{node} failed instead of becoming {want}\n{lab.summary([node])}")
        return now == want

    try:
        wait_for(check, timeout, interval=2, what=f"{node} to be {want}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: states {states(lab)}\n{lab.summary([node])}") from None


def conditions(lab: Lab, node: str) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in describe(lab, node).get("conditions", [])}


def wait_condition(
    lab: Lab, node: str, kind: str, present: bool = True, timeout: float = 30
) -> dict[str, Any]:
    """Until GetNode's conditions have (or no longer have) ``kind``; heartbeats come every second."""

    def check() -> dict[str, Any]:  # empty (falsy): not yet
        now = conditions(lab, node)
        if present:
            return now.get(kind) or {}
        return {} if kind in now else {"gone": True}

    verb = "raised" if present else "cleared"
    try:
        return wait_for(check, timeout, interval=1, what=f"{kind} {verb} on {node}")
    except AssertionError as exc:
        health = describe(lab, node).get("health", {})
        raise AssertionError(
            f"{exc}: conditions {conditions(lab, node)}; last health report {json.dumps(health)[:1500]}"
        ) from None


# -- the gate before the join ---------------------------------------------------------------------


def test_a_worker_with_the_wrong_driver_is_quarantined_before_its_join_until_released(lab: Lab) -> None:
    lab.apply(gpu_environment(lab.bed), "gpu")
    lab.bootstrap("gpu", {CP: "control-plane", WORKER: "worker"})

    wait_state(lab, WORKER, "quarantined")
    # The control plane matched everything: checked, verified, diagnosed, then kubeadm init.
    wait_for(
        lambda: "succeeded" in kinds(lab, CP, "kubeadm-init"),
        timeout=300,
        interval=2,
        what=f"{CP}'s kubeadm-init to succeed",
    )
    for step in ("hardware-check", "hardware-verify", "gpu-diagnostics"):
        assert "succeeded" in kinds(lab, CP, step), (step, lab.summary([CP]))
    init_started = first_time(lab, CP, "kubeadm-init", "started")
    # (event times are milliseconds: a step's end and the next one's start can share one)
    assert first_time(lab, CP, "hardware-verify", "succeeded") <= init_started
    assert first_time(lab, CP, "gpu-diagnostics", "succeeded") <= init_started
    calls = fake_gpu.dcgmi_calls(lab.bed, CP)
    assert calls and all(c.endswith("diag -r 1 -> pass") for c in calls), calls
    assert describe(lab, CP).get("quarantine") is None

    # The worker: hardware-check passed (nvidia-smi's count and product match), its base steps
    # ran, and hardware-verify found the driver: quarantined there, nothing after it started.
    assert "succeeded" in kinds(lab, WORKER, "hardware-check"), lab.summary([WORKER])
    node = describe(lab, WORKER)
    names = [s["name"] for s in node["steps"]]
    verify = names.index("hardware-verify")
    assert names.index("hardware-check") == 0 and names.index("kubeadm-join") > verify, names
    assert "gpu-diagnostics" in names[verify + 1 : names.index("kubeadm-join")], names
    for s in node["steps"][1:verify]:
        assert s["state"] in ("succeeded", "skipped"), (s["name"], s["state"], lab.summary([WORKER]))
    for s in node["steps"][verify + 1 :]:
        assert s["state"] == "pending", (s["name"], s["state"])
        assert "started" not in kinds(lab, WORKER, s["name"]), s["name"]
    assert "succeeded" not in kinds(lab, WORKER, "hardware-verify")

    q = node["quarantine"]
    assert q["stage"] == "before-join", q
    assert q["expected"]["gpus.driverVersion"] == "570.*", q
    assert q["found"]["gpus.driverVersion"] == OLD_DRIVER, q
    assert "gpus.driverVersion: expected 570.*, found 550.54.15" in q["problems"], q
    assert not any(p.startswith(("gpus.count", "gpus.product", "gpus.memoryMiB")) for p in q["problems"]), q
    text = lab.ctl("node", "describe", WORKER).stdout
    assert "Quarantined" in text and "before-join" in text, text
    assert "gpus.driverVersion: expected 570.*, found 550.54.15" in text, text
    assert list_state_column(lab, WORKER) == "quarantined"
    notices = [e for e in lab.events(WORKER) if e["kind"] == "info" and "quarantined" in text_of(e)]
    assert notices, lab.summary([WORKER])
    assert "gpus.driverVersion: expected 570.*, found 550.54.15" in text_of(notices[0]), notices
    assert notices[0]["step"] == "hardware-verify", notices
    assert fake_gpu.dcgmi_calls(lab.bed, WORKER) == []  # diagnostics come after the verify

    # Heartbeats and gate requests go on; the worker stays where it is.
    wait_for(lambda: describe(lab, CP)["state"] == "provisioned", 120, interval=2, what=f"{CP} provisioned")
    assert states(lab)[WORKER] == "quarantined"
    assert "started" not in kinds(lab, WORKER, "kubeadm-join")
    assert not lab.health("gpu")["available"]

    # The operator lets it go on once: diagnostics run (they pass), then the worker joins.
    out = lab.ctl("node", "release", WORKER)
    assert out.returncode == 0, out.stderr
    lab.wait_available("gpu", [CP, WORKER], timeout=300)
    wait_for(
        lambda: "succeeded" in kinds(lab, WORKER, "kubeadm-join"),
        timeout=60,
        interval=2,
        what=f"{WORKER}'s kubeadm-join to succeed",
    )
    assert kinds(lab, WORKER, "kubeadm-join").count("started") == 1
    assert "succeeded" in kinds(lab, WORKER, "hardware-verify")
    assert "succeeded" in kinds(lab, WORKER, "gpu-diagnostics")
    assert first_time(lab, WORKER, "gpu-diagnostics", "succeeded") <= first_time(
        lab, WORKER, "kubeadm-join", "started"
    )
    admin = admin_name(lab)
    assert_released_by(lab, WORKER, admin)
    wait_state(lab, WORKER, "provisioned", timeout=120)
    assert describe(lab, WORKER).get("quarantine") is None


# -- drift after provisioning ---------------------------------------------------------------------


def test_a_gpu_gone_an_xid_and_another_driver_raise_conditions_on_a_provisioned_node(lab: Lab) -> None:
    if "gpu" not in lab.ctl("env", "list").stdout:
        lab.apply(gpu_environment(lab.bed), "gpu")
        lab.bootstrap("gpu", {CP: "control-plane"})
    wait_state(lab, CP, "provisioned")
    gpus = fake_gpu.gpus(2, driver=DRIVER, node=CP)
    fake_gpu.set_gpus(lab.bed, CP, gpus)
    assert conditions(lab, CP) == {}, f"{CP} has conditions before any drift"

    # One GPU falls off the bus: nvidia-smi lists only the other one.
    fake_gpu.set_gpus(lab.bed, CP, gpus[:1])
    missing = wait_condition(lab, CP, "GPUsMissing")
    assert missing["message"], missing
    assert "GPUsMissing" in lab.ctl("node", "describe", CP).stdout
    health = {n["name"]: n for n in lab.health("gpu")["nodes"]}
    assert "GPUsMissing" in [c["type"] for c in health[CP].get("conditions", [])], health[CP]
    assert any("GPUsMissing" in text_of(e) for e in lab.events(CP)), lab.summary([CP])
    assert states(lab)[CP] == "provisioned"  # drift is health, not a quarantine

    # With onDrift: cordon the control plane cordons the node (the stand-in API server's record).
    def cordoned() -> bool:
        log = lab.bed.exec(CP, "cat /var/log/kubeadm-standin/apiserver.log 2>/dev/null || true").stdout
        changes = [json.loads(line) for line in log.splitlines() if '"unschedulable"' in line]
        return any(c["node"] == CP and c["value"] is True for c in changes)

    wait_for(cordoned, 60, interval=2, what=f"{CP} cordoned (onDrift: cordon)")

    # Back on the bus: the condition no longer holds.
    fake_gpu.set_gpus(lab.bed, CP, gpus)
    wait_condition(lab, CP, "GPUsMissing", present=False)

    # An Xid in the kernel journal for GPU 0.
    line = fake_gpu.inject_xid(lab.bed, CP, gpus[0])
    journal = lab.bed.exec(CP, "journalctl -b -t kernel --grep 'NVRM: Xid' -o cat --no-pager").stdout
    assert line in journal, journal
    errors = wait_condition(lab, CP, "GPUErrors")
    assert "xid" in (errors["reason"] + errors["message"]).lower(), errors

    # Another driver than spec.hardware.gpus.driverVersion.
    fake_gpu.set_gpus(lab.bed, CP, fake_gpu.gpus(2, driver=OLD_DRIVER, node=CP))
    mismatch = wait_condition(lab, CP, "DriverMismatch")
    assert OLD_DRIVER in mismatch["message"], mismatch
    fake_gpu.set_gpus(lab.bed, CP, gpus)
    wait_condition(lab, CP, "DriverMismatch", present=False)


# -- diagnostics ----------------------------------------------------------------------------------


def test_failed_or_missing_diagnostics_quarantine_with_the_reason(lab: Lab) -> None:
    path = lab.workdir / "diag.yaml"
    path.write_text(DIAG_ENV)
    lab.ctl("env", "apply", "-f", str(path))
    lab.bootstrap("diag", {DIAG_FAIL: "worker", NO_DCGM: "worker"})
    wait_state(lab, DIAG_FAIL, "quarantined")
    wait_state(lab, NO_DCGM, "quarantined")

    failing = describe(lab, DIAG_FAIL)
    assert failing["quarantine"]["stage"] == "diagnostics", failing["quarantine"]
    reason = " ".join(failing["quarantine"]["problems"]) + " " + lab.ctl("node", "describe", DIAG_FAIL).stdout
    assert "dcgmi diag -r 1 failed" in reason, reason
    assert "succeeded" in kinds(lab, DIAG_FAIL, "hardware-verify")
    assert kinds(lab, DIAG_FAIL, "gpu-diagnostics").count("failed") == 1, lab.summary([DIAG_FAIL])
    calls = fake_gpu.dcgmi_calls(lab.bed, DIAG_FAIL)
    assert len(calls) == 1 and calls[0].endswith("diag -r 1 -> fail"), calls
    lines = " ".join(line for e in lab.step_events(DIAG_FAIL, "gpu-diagnostics") for line in e["lines"])
    assert "Fail - GPU: 1" in lines, lines  # dcgmi's own table is in the step's output

    absent = describe(lab, NO_DCGM)
    assert absent["quarantine"]["stage"] == "diagnostics", absent["quarantine"]
    reason = " ".join(absent["quarantine"]["problems"]) + " " + lab.ctl("node", "describe", NO_DCGM).stdout
    assert "dcgmi is not installed" in reason, reason
    for node in (DIAG_FAIL, NO_DCGM):
        assert list_state_column(lab, node) == "quarantined"
        assert any(e["kind"] == "info" and "quarantined" in text_of(e) for e in lab.events(node)), (
            lab.summary([node])
        )

    # Released: the diagnostics step runs again without dcgmi (passed over), the node finishes.
    lab.ctl("node", "release", DIAG_FAIL)
    wait_state(lab, DIAG_FAIL, "provisioned", timeout=120)
    assert kinds(lab, DIAG_FAIL, "gpu-diagnostics")[-1] == "succeeded", lab.summary([DIAG_FAIL])
    assert len(fake_gpu.dcgmi_calls(lab.bed, DIAG_FAIL)) == 1  # not run again
    admin = admin_name(lab)
    assert_released_by(lab, DIAG_FAIL, admin)
    assert states(lab)[NO_DCGM] == "quarantined"
