"""Issue 6 on real systemd nodes: kubeadm clusters orchestrated by pull, with the stand-in kubeadm.

A real controller listens on the testbed bridge; ``tetherctl bootstrap`` adopts the nodes (agents
under systemd). Proven here:

* 1 control plane + 2 workers reach Available; the workers, enrolled before the control plane
  existed, wait at their gate and then join;
* a worker whose join material the cluster refuses (a wrong CA hash) gets a failed step that says
  why, and its retry joins with fresh material;
* after the join material expired (on the cluster and at the controller), a new worker joins by
  refresh, without any operator action;
* 3 control planes (HA, endpoint = a load balancer on the bridge) + 1 worker reach Available, the
  extra control planes joined with the certificate key, one at a time (their join windows, from
  the events, do not overlap);
* the token and the certificate key never appear in any event, log, or store dump (canary).
"""

from __future__ import annotations

import base64
import datetime as dt
import itertools
import json
import os
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.testbed.testbed import Testbed
from tests.integration.harness import BIN, Controller, wait_for
from tether.controller.cluster.material import JoinMaterial
from tether.controller.secretbox import SecretBox

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]


def environment(
    bed: Testbed,
    name: str,
    *,
    control_planes: int,
    workers: int,
    ha_endpoint: str = "",
    dedicated: bool = False,
) -> str:
    desc = bed.describe()
    with urllib.request.urlopen(desc["apt_repo_key_url"], timeout=10) as reply:
        key = reply.read().decode()
    cluster: dict[str, Any] = {
        "controlPlane": {"count": control_planes, "dedicated": dedicated, "labels": {"team": "gpu"}},
        "workers": {"count": workers, "labels": {"pool": "e2e"}},
    }
    if ha_endpoint:
        cluster["highAvailability"] = {"enabled": True, "endpoint": ha_endpoint}
    doc = {
        "apiVersion": "holodeck.nvidia.com/v1alpha1",
        "kind": "Environment",
        "metadata": {"name": name},
        "spec": {
            "packageRepositories": {"apt": [{"url": desc["apt_repo_url"], "key": key}]},
            "downloadMirror": desc["download_mirror_url"],
            "containerRuntime": {"install": True, "name": "containerd", "package": {"name": "containerd"}},
            "kubernetes": {
                "install": True,
                "installer": "kubeadm",
                "release": {"version": "v" + desc["kubernetes_version"].removeprefix("v")},
            },
            "cluster": cluster,
            "customTemplates": [
                {
                    "name": "after-kubernetes",
                    "phase": "post-kubernetes",
                    "inline": "test -f /etc/kubernetes/kubelet.conf && echo kubernetes is there",
                }
            ],
        },
    }
    return str(yaml.safe_dump(doc, sort_keys=False))


def seconds(rfc3339: str) -> float:
    """An event's RFC 3339 time in seconds since the epoch."""
    return dt.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


class Lab:
    """A controller on the bridge, the testbed, and the operator's commands."""

    def __init__(self, bed: Testbed, workdir: Path) -> None:
        self.bed = bed
        self.workdir = workdir
        self.controller = Controller(workdir, bed.describe()["bridge_ip"])
        self.controller.start()
        self.outputs: list[str] = []

    def ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        out = self.controller.ctl(*args, check=check, timeout=300)
        self.outputs.append(out.stdout + out.stderr)
        return out

    def apply(self, doc: str, name: str) -> None:
        path = self.workdir / f"{name}.yaml"
        path.write_text(doc)
        self.ctl("env", "apply", "-f", str(path))

    def bootstrap(self, env: str, nodes: dict[str, str]) -> None:
        """Adopt ``{node: role}`` concurrently from an inventory, over real SSH."""
        desc = self.bed.describe()
        by_name = {n["name"]: n for n in desc["nodes"]}
        inventory = self.workdir / f"inventory-{'-'.join(nodes)}.yaml"
        inventory.write_text(
            yaml.safe_dump(
                {
                    "defaults": {"env": env, "user": "root", "identity": desc["ssh_key"]},
                    "nodes": [
                        {"ssh": by_name[n]["ip"], "name": n, "role": role, "host_key": by_name[n]["host_key"]}
                        for n, role in nodes.items()
                    ],
                }
            )
        )
        out = subprocess.run(
            [
                str(BIN / "tetherctl"),
                "bootstrap",
                "--inventory",
                str(inventory),
                "--controller",
                self.controller.address,
            ],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            env={**os.environ, "TETHER_CONFIG": str(self.controller.config)},
        )
        self.outputs.append(out.stdout + out.stderr)
        assert out.returncode == 0, out.stdout + out.stderr

    def events(self, node: str) -> list[dict[str, Any]]:
        return json.loads(self.ctl("events", "--node", node, "-o", "json").stdout)  # type: ignore[no-any-return]

    def health(self, env: str) -> dict[str, Any]:
        return json.loads(self.ctl("cluster", "health", "--env", env, "-o", "json").stdout)  # type: ignore[no-any-return]

    def wait_available(self, env: str, nodes: list[str], timeout: float = 420) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            h = self.health(env)
            ready = {n["name"] for n in h["nodes"] if n["ready"]}
            failed = [n["name"] for n in h["nodes"] if n["agent_state"] == "failed"]
            if failed:
                pytest.fail(f"nodes failed: {failed}: {h['conditions']}\n{self.summary(failed)}")
            return h if h["available"] and set(nodes) <= ready else None

        try:
            return wait_for(check, timeout, interval=2, what=f"{env} to be Available with {nodes}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.summary(nodes)}") from None

    def summary(self, nodes: list[str]) -> str:
        """Where each node stands (for failure messages)."""
        out = []
        for node in nodes:
            try:
                evs = self.events(node)
            except AssertionError as exc:
                out.append(f"{node}: {exc}")
                continue
            last = [f"{e['step']}:{e['kind']}" for e in evs if e["kind"] != "output"][-4:]
            tail = [line for e in evs[-3:] for line in e["lines"]][-5:]
            out.append(f"{node}: {last} {tail}")
        return "\n".join(out)

    def step_events(self, node: str, step: str) -> list[dict[str, Any]]:
        return [e for e in self.events(node) if e["step"] == step]

    def material(self, env: str) -> JoinMaterial:
        """What the controller holds (test-only: opened with the controller's own key)."""
        box = SecretBox.load_or_create(self.controller.data_dir / "pki" / "secrets.key")
        import sqlite3

        conn = sqlite3.connect(self.controller.data_dir / "tether.db")
        try:
            (blob,) = conn.execute(
                "SELECT value FROM kv WHERE key=?", (f"cluster/{env}/material",)
            ).fetchone()
        finally:
            conn.close()
        return JoinMaterial.from_bytes(box.open(bytes(blob), f"cluster/{env}/material"))

    def kubectl_nodes(self, control_plane: str) -> dict[str, Any]:
        out = self.bed.exec(
            control_plane, "kubectl --kubeconfig /etc/kubernetes/admin.conf get nodes -o json"
        )
        return {item["metadata"]["name"]: item for item in json.loads(out.stdout)["items"]}

    def close(self) -> None:
        self.controller.kill()


@pytest.fixture
def lab_factory(tmp_path: Path) -> Iterator[Callable[[Testbed], Lab]]:
    made: list[Lab] = []

    def make(bed: Testbed) -> Lab:
        lab = Lab(bed, tmp_path)
        made.append(lab)
        return lab

    yield make
    for lab in made:
        lab.close()


def assert_no_secret_anywhere(lab: Lab, env: str, secrets: list[str], nodes: list[str]) -> None:
    surfaces: dict[str, str] = {f"tetherctl output {i}": text for i, text in enumerate(lab.outputs)}
    surfaces["controller log"] = lab.controller.log_path.read_text()
    for node in nodes:
        surfaces[f"events of {node}"] = json.dumps(lab.events(node))
        surfaces[f"agent journal on {node}"] = lab.bed.exec(
            node, "journalctl -u tether-agent --no-pager -o cat"
        ).stdout
        raw = lab.bed.exec(node, "cat /var/lib/tether/state.db* | base64 -w0").stdout
        surfaces[f"agent store on {node}"] = base64.b64decode(raw).decode("latin-1")
    for path in lab.controller.data_dir.rglob("*"):
        if path.is_file():
            surfaces[str(path)] = path.read_bytes().decode("latin-1")
    for secret in secrets:
        assert len(secret) >= 16
        for name, text in surfaces.items():
            assert secret not in text, f"a join secret leaked into the {name}"


def test_one_control_plane_two_workers_waiting_refusal_and_refresh(
    fresh_testbed: Callable[..., Testbed], lab_factory: Callable[[Testbed], Lab]
) -> None:
    bed = fresh_testbed(5)
    lab = lab_factory(bed)
    lab.apply(environment(bed, "c1", control_planes=1, workers=2), "c1")
    secrets: list[str] = []

    # Workers first: there is no cluster yet, so they provision their base steps and wait at the gate.
    lab.bootstrap("c1", {"node2": "worker", "node3": "worker"})
    for node in ("node2", "node3"):
        wait_for(
            lambda n=node: any(e["kind"] == "waiting" for e in lab.step_events(n, "kubeadm-join")),
            timeout=300,
            interval=2,
            what=f"{node} to wait at its gate",
        )
    assert not lab.health("c1")["available"]

    lab.bootstrap("c1", {"node1": "control-plane"})
    health = lab.wait_available("c1", ["node1", "node2", "node3"])
    assert health["init_node"] == "node1"
    by_name = {n["name"]: n for n in health["nodes"]}
    for node in ("node1", "node2", "node3"):
        assert by_name[node]["ready"] and by_name[node]["version"].startswith("v")
        assert by_name[node]["internal_ip"] == bed.node(node).ip
    assert {n: by_name[n]["role"] for n in by_name} == {
        "node1": "control-plane",
        "node2": "worker",
        "node3": "worker",
    }

    # Each agent reports its node's kubelet and container runtime (systemd units on the node).
    def services_active() -> bool:
        nodes = lab.health("c1")["nodes"]
        return all(n["kubelet"] == "active" and n["runtime"] == "active" for n in nodes)

    wait_for(services_active, timeout=90, interval=2, what="kubelet and containerd reported active")
    first = lab.material("c1")
    secrets += [first.token]

    # Labels and taints from the spec, applied by the control plane after each join.
    def labelled() -> bool:
        k8s = lab.kubectl_nodes("node1")
        return (
            k8s["node2"]["metadata"]["labels"].get("pool") == "e2e"
            and "node-role.kubernetes.io/worker" in k8s["node3"]["metadata"]["labels"]
            and k8s["node1"]["metadata"]["labels"].get("team") == "gpu"
        )

    wait_for(labelled, timeout=120, interval=2, what="labels from the spec")
    k8s = lab.kubectl_nodes("node1")
    assert not any(
        t.get("effect") == "NoSchedule" for t in k8s["node1"]["spec"].get("taints", [])
    )  # not dedicated
    # Post-kubernetes templates ran after the join, with Kubernetes there.
    for node in ("node2", "node3"):
        wait_for(
            lambda n=node: (
                "kubernetes is there"
                in [line for e in lab.step_events(n, "custom-after-kubernetes") for line in e["lines"]]
            ),
            timeout=60,
            interval=2,
            what=f"custom-after-kubernetes output on {node}",
        )
        lines = [line for e in lab.step_events(node, "custom-after-kubernetes") for line in e["lines"]]
        assert "kubernetes is there" in lines
    kubeconfig = yaml.safe_load(
        lab.ctl("cluster", "kubeconfig", "--env", "c1", "--server", "10.9.8.7:6443").stdout
    )
    assert kubeconfig["clusters"][0]["cluster"]["server"] == "https://10.9.8.7:6443"

    # node4: the controller's material names the wrong CA. The stand-in refuses it, the step fails and
    # says why, and the retry asks the controller again, which refreshes the material first.
    lab.controller.kill()
    box = SecretBox.load_or_create(lab.controller.data_dir / "pki" / "secrets.key")
    wrong = JoinMaterial(**{**first.__dict__, "ca_hash": "sha256:" + "0" * 64})
    import sqlite3

    conn = sqlite3.connect(lab.controller.data_dir / "tether.db")
    conn.execute(
        "UPDATE kv SET value=? WHERE key=?",
        (box.seal(wrong.to_bytes(), "cluster/c1/material"), "cluster/c1/material"),
    )
    conn.commit()
    conn.close()
    lab.controller.start()
    lab.bootstrap("c1", {"node4": "worker"})
    lab.wait_available("c1", ["node1", "node2", "node3", "node4"])
    wait_for(
        lambda: (
            [e["attempt"] for e in lab.step_events("node4", "kubeadm-join") if e["kind"] == "succeeded"]
            == [2]
        ),
        timeout=60,
        interval=2,
        what="node4's kubeadm-join to succeed at attempt 2",
    )
    join = lab.step_events("node4", "kubeadm-join")
    failed = [e for e in join if e["kind"] == "failed"]
    assert failed and failed[0]["attempt"] == 1
    reason = " ".join(line for e in join if e["attempt"] == 1 for line in e["lines"])
    assert "cluster CA found in cluster-info ConfigMap is invalid" in reason and "pinned" in reason, reason
    assert [e["attempt"] for e in join if e["kind"] == "succeeded"] == [2]
    secrets.append(lab.material("c1").token)

    # Days later: everything expired, on the cluster and at the controller. node5 joins by refresh.
    bed.expire_join_material("node1")
    lab.ctl("cluster", "expire-join-material", "--env", "c1")
    lab.bootstrap("c1", {"node5": "worker"})
    lab.wait_available("c1", ["node1", "node2", "node3", "node4", "node5"])
    refreshes = [
        e
        for e in lab.events("node1")
        if e["step"] == "task:refresh-join-material" and e["kind"] == "succeeded"
    ]
    assert len(refreshes) >= 2
    final = lab.material("c1")
    secrets.append(final.token)
    assert_no_secret_anywhere(lab, "c1", secrets, ["node1", "node2", "node3", "node4", "node5"])


def test_three_control_planes_behind_a_load_balancer_and_a_worker(
    fresh_testbed: Callable[..., Testbed], lab_factory: Callable[[Testbed], Lab]
) -> None:
    bed = fresh_testbed(4, lb=True)
    lab = lab_factory(bed)
    endpoint = bed.describe()["lb_endpoint"]
    bed.set_lb_backends(["node1", "node2", "node3"])
    lab.apply(environment(bed, "ha", control_planes=3, workers=1, ha_endpoint=endpoint, dedicated=True), "ha")
    lab.bootstrap(
        "ha",
        {"node1": "control-plane", "node2": "control-plane", "node3": "control-plane", "node4": "worker"},
    )
    health = lab.wait_available("ha", ["node1", "node2", "node3", "node4"])
    assert health["endpoint"] == endpoint
    init = health["init_node"]
    material = lab.material("ha")
    assert material.endpoint == endpoint and material.cert_key
    k8s = lab.kubectl_nodes(init)
    control_planes = [
        n for n, item in k8s.items() if "node-role.kubernetes.io/control-plane" in item["metadata"]["labels"]
    ]
    assert sorted(control_planes) == ["node1", "node2", "node3"]
    for node in sorted({"node1", "node2", "node3"} - {init}):
        log = bed.exec(node, "cat /var/log/kubeadm-standin/kubeadm.log").stdout
        joins = [json.loads(line) for line in log.splitlines() if '"(effective)", "join"' in line]
        assert joins and joins[-1]["control_plane"] is True, log[-2000:]
        assert joins[-1]["certificate_key"].startswith("<redacted sha256:"), log[-2000:]
        assert joins[-1]["endpoint"] == endpoint
        # dedicated: control planes keep their NoSchedule taint
        assert any(t.get("effect") == "NoSchedule" for t in k8s[node]["spec"].get("taints", []))
        wait_for(
            lambda n=node: (
                [
                    e["kind"]
                    for e in lab.step_events(n, "kubeadm-join")
                    if e["kind"] in ("succeeded", "failed")
                ]
                == ["succeeded"]
            ),
            timeout=60,
            interval=2,
            what=f"{node}'s kubeadm-join to succeed",
        )
        assert [
            e["kind"] for e in lab.step_events(node, "kubeadm-join") if e["kind"] in ("succeeded", "failed")
        ] == ["succeeded"]
    # Control planes joined one at a time: no two kubeadm-join windows (first start to success) overlap.
    windows = sorted(
        (
            min(seconds(e["time"]) for e in events if e["kind"] == "started"),
            max(seconds(e["time"]) for e in events if e["kind"] == "succeeded"),
            node,
        )
        for node in sorted({"node1", "node2", "node3"} - {init})
        for events in [lab.step_events(node, "kubeadm-join")]
    )
    for (_, first_done, first), (second_start, _, second) in itertools.pairwise(windows):
        assert first_done <= second_start, f"{first} and {second} joined at the same time: {windows}"
    assert_no_secret_anywhere(
        lab, "ha", [material.token, material.cert_key], ["node1", "node2", "node3", "node4"]
    )
