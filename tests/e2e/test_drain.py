"""Issue 11 on real systemd nodes: spec.rollout.drain around a disruptive step (stand-in kubeadm).

A control plane and a worker form a cluster with ``rollout.drain: true``. On first provisioning
the nodes are not in the cluster yet, so their drain and uncordon gates open at once. Generation 2
changes the container runtime step (containerd pinned: it runs again and restarts containerd, the
driver-like disruptive step here, since testbed nodes have no GPU). Proven from the stand-in API
server's own log: the worker was cordoned by the control plane before that step started and
uncordoned after it finished, and kubectl drain ran with the flags tether promises.

Also, not marked e2e (they run everywhere): the stand-in's kubectl cordon/uncordon/drain.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.test_cluster import Lab, environment
from tests.e2e.testbed.testbed import Testbed
from tests.integration.harness import wait_for

sys.path.insert(0, str(Path(__file__).parent / "testbed" / "standins"))

from k8s_standin import common, kubectl


def drained_environment(bed: Testbed, containerd_version: str = "") -> str:
    doc = yaml.safe_load(environment(bed, "d1", control_planes=1, workers=1))
    doc["spec"]["rollout"] = {"drain": True}
    if containerd_version:
        doc["spec"]["containerRuntime"]["package"]["version"] = containerd_version
    return str(yaml.safe_dump(doc, sort_keys=False))


@pytest.fixture
def lab(fresh_testbed: Callable[..., Testbed], tmp_path: Path) -> Iterator[Lab]:
    made = Lab(fresh_testbed(2), tmp_path)
    yield made
    made.close()


def seconds(rfc3339: str) -> float:
    """An event's RFC 3339 time (``2024-05-01T12:00:00.123Z``) in seconds since the epoch."""
    return dt.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def step_times(lab: Lab, node: str, generation: int) -> dict[tuple[str, str], float]:
    """(step, kind) -> seconds since the epoch, of the node's events at ``generation``."""
    out: dict[tuple[str, str], float] = {}
    for e in lab.events(node):
        if e["plan_generation"] == generation and e["kind"] in ("started", "succeeded", "failed"):
            out.setdefault((e["step"], e["kind"]), seconds(e["time"]))
    return out


def lines_of(lab: Lab, node: str, step: str, generation: int) -> str:
    return "\n".join(
        line for e in lab.step_events(node, step) if e["plan_generation"] == generation for line in e["lines"]
    )


def cordon_log(lab: Lab, control_plane: str) -> list[dict[str, Any]]:
    out = lab.bed.exec(control_plane, "cat /var/log/kubeadm-standin/apiserver.log 2>/dev/null || true").stdout
    return [json.loads(line) for line in out.splitlines() if '"unschedulable"' in line]


@pytest.mark.e2e
@pytest.mark.timeout(1200)
def test_a_worker_is_drained_around_its_runtime_step_and_uncordoned_after(lab: Lab) -> None:
    bed = lab.bed
    lab.apply(drained_environment(bed), "d1")
    lab.bootstrap("d1", {"node1": "control-plane", "node2": "worker"})
    lab.wait_available("d1", ["node1", "node2"])
    # First provisioning: not in the cluster yet, nothing to drain, nothing asked of node1.
    for node in ("node1", "node2"):
        for step in ("drain", "uncordon"):
            assert "has not joined the cluster yet" in lines_of(lab, node, step, 1), (node, step)
    assert cordon_log(lab, "node1") == []

    version = bed.exec("node2", "dpkg-query -W -f '${Version}' containerd").stdout.strip()
    assert version
    lab.apply(drained_environment(bed, version), "d1")

    def done() -> dict[tuple[str, str], float] | None:
        times = step_times(lab, "node2", 2)
        failed = [step for step, kind in times if kind == "failed"]
        if failed:
            pytest.fail(f"node2 failed {failed} at generation 2\n{lab.summary(['node1', 'node2'])}")
        return times if ("uncordon", "succeeded") in times else None

    times = wait_for(
        done, timeout=600, interval=3, what="node2 through generation 2 (drain, containerd, uncordon)"
    )
    assert "kubectl drain done (on node1)" in lines_of(lab, "node2", "drain", 2)
    assert "kubectl uncordon done (on node1)" in lines_of(lab, "node2", "uncordon", 2)
    assert ("kubeadm-join", "started") not in times  # the node stayed in the cluster: no new join

    # The stand-in API server's own record: cordoned by node1's admin before containerd started,
    # uncordoned after it finished.
    changes = [c for c in cordon_log(lab, "node1") if c["node"] == "node2"]
    assert [c["value"] for c in changes] == [True, False], changes
    cordoned, uncordoned = changes[0]["time"], changes[1]["time"]
    assert cordoned < times[("drain", "started")]  # the gate opened once kubectl had cordoned it
    assert cordoned < times[("containerd", "started")] < times[("containerd", "succeeded")] < uncordoned
    assert uncordoned <= times[("uncordon", "succeeded")]
    calls = [
        json.loads(line)["argv"]
        for line in bed.exec("node1", "cat /var/log/kubeadm-standin/kubectl.log").stdout.splitlines()
    ]
    drains = [argv for argv in calls if argv[:2] == ["drain", "node2"]]
    assert drains == [["drain", "node2", "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=300s"]]
    nodes = lab.kubectl_nodes("node1")
    assert not nodes["node2"]["spec"].get("unschedulable")
    # The lone control plane drained itself around its own containerd step.
    assert [c["value"] for c in cordon_log(lab, "node1") if c["node"] == "node1"] == [True, False]
    assert "kubectl drain done (on node1)" in lines_of(lab, "node1", "drain", 2)


# -- the stand-in's kubectl cordon/uncordon/drain (no nodes needed) ---------------------------------


class FakeApi:
    """The API calls kubectl makes, against one in-memory node and the DaemonSets given."""

    def __init__(self, daemonsets: list[dict[str, Any]]) -> None:
        self.node: dict[str, Any] = {"metadata": {"name": "w-1", "labels": {}}, "spec": {}}
        self.daemonsets = daemonsets
        self.patches: list[Any] = []

    def request(self, method: str, path: str, body: Any = None) -> Any:
        if path == "/api/v1/nodes/w-1" and method == "GET":
            return self.node
        if path == "/api/v1/nodes/w-1" and method == "PATCH":
            self.patches.append(body)
            self.node["spec"].update(body["spec"])
            return self.node
        if path == "/apis/apps/v1/daemonsets":
            return {"items": self.daemonsets}
        raise common.ApiError(404, f'nodes "{path.rsplit("/", 1)[-1]}" not found', {"reason": "NotFound"})


DAEMONSET = {
    "metadata": {"name": "kube-proxy", "namespace": "kube-system"},
    "spec": {"template": {"spec": {"tolerations": [{"operator": "Exists"}]}}},
}


def run(api: FakeApi, monkeypatch: pytest.MonkeyPatch, *argv: str) -> int:
    kc = type("KC", (), {"api": lambda self: api})()
    monkeypatch.setattr(kubectl, "kubeconfig", lambda flags: kc)
    monkeypatch.setattr(common, "log_invocation", lambda *a, **k: None)
    return kubectl.main(list(argv))


def test_standin_drain_cordons_and_refuses_daemonset_pods_unless_told(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    api = FakeApi([DAEMONSET])
    assert run(api, monkeypatch, "drain", "w-1", "--delete-emptydir-data", "--timeout=60s") == 1
    out = capsys.readouterr()
    assert out.out == "node/w-1 cordoned\n"
    assert 'error: unable to drain node "w-1"' in out.err and "kube-system/kube-proxy-" in out.err
    assert api.node["spec"]["unschedulable"] is True
    assert run(api, monkeypatch, "drain", "w-1", "--ignore-daemonsets", "--delete-emptydir-data") == 0
    out = capsys.readouterr()
    assert out.out == "node/w-1 already cordoned\nnode/w-1 drained\n"
    assert "Warning: ignoring DaemonSet-managed Pods: kube-system/kube-proxy-" in out.err
    assert run(api, monkeypatch, "uncordon", "w-1") == 0
    assert capsys.readouterr().out == "node/w-1 uncordoned\n" and api.node["spec"]["unschedulable"] is False
    assert run(api, monkeypatch, "cordon", "node/w-1") == 0 and api.node["spec"]["unschedulable"] is True
    assert len(api.patches) == 3  # "already cordoned" patches nothing
    assert run(api, monkeypatch, "drain", "w-1", "--ignore-daemonset") == 1
    assert "unknown flag: --ignore-daemonset" in capsys.readouterr().err
    assert run(api, monkeypatch, "cordon", "w-2") == 1
    assert "NotFound" in capsys.readouterr().err
