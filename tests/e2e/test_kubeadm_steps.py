"""The rendered kubeadm cluster path run for real on testbed nodes, against the stand-in Kubernetes.

No agent and no controller: each node's plan is rendered with the ``ClusterContext`` the controller
would give it, and every step runs on its node the way the agent runs it (bash, its environment, a 0700
tmpfs ``$TETHER_WORKDIR``, ``$TETHER_SECRETS_OUT``/``$TETHER_PROVENANCE`` read back afterwards, stdout and
stderr together). The init node runs preflight .. kubeadm, kubeadm-init and calico; the others run the
same base steps and kubeadm-join with the join material kubeadm-init wrote to ``$TETHER_SECRETS_OUT``.
Then the controller's one-off tasks (``label_task``, ``refresh_task``) run on the init node, and a last
node joins, after the stand-in cluster expired the first material, with what the refresh produced.

What it shows: every node Ready with the labels and taints the label task applied; extra control planes
joined with the certificate key; refreshed material works where the expired material is refused; every
step succeeds a second time and changes nothing; no token or certificate key in any output or left on
disk. Cases: 1 control plane + a worker (+ a late worker); 3 dedicated control planes behind the testbed's
load balancer (+ a worker); and, without spec.cluster, the single-node control plane.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import re
import shlex
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from tests.e2e.testbed.testbed import Testbed
from tether.controller.cluster import material
from tether.controller.cluster.context import INIT_STEP, JOIN_STEP, ClusterContext, Position
from tether.controller.cluster.scripts import label_task, refresh_task
from tether.controller.render import NodeContext, render
from tether.controller.render.targets import facts_for
from tether.controller.spec import load_document
from tether.controller.spec.model import EnvironmentSpec
from tether.nodeagent.model import Plan, Step

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

BASE_STEPS = ["preflight", "package-repositories", "containerd", "kubeadm"]
ADMIN = "KUBECONFIG=/etc/kubernetes/admin.conf"
# Files a second run of a step must leave exactly as they were (sha256 over those that exist).
WATCHED = (
    "/etc/kubernetes/admin.conf",
    "/etc/kubernetes/kubelet.conf",
    "/etc/kubernetes/tether-kubeadm.yaml",
    "/etc/kubernetes/pki/ca.crt",
    "/etc/kubernetes/pki/apiserver.crt",
    "/etc/containerd/config.toml",
    "/etc/crictl.yaml",
    "/etc/sysctl.d/99-kubernetes.conf",
    "/etc/modules-load.d/kubernetes.conf",
    "/root/.kube/config",
    "/var/lib/kubelet/kubeadm-flags.env",
)


# ---------------------------------------------------------------------------------------------- running steps


@dataclass
class Result:
    step: str
    node: str
    code: int
    output: str
    observed: dict[str, str] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)


class Runner:
    """Runs steps on testbed nodes as the agent does; keeps every result (for the secret scan)."""

    def __init__(self, bed: Testbed) -> None:
        self.bed = bed
        self.results: list[Result] = []

    def run(self, node: str, step: Step, secret_env: Mapping[str, str] | None = None) -> Result:
        """One run of ``step`` on ``node``: environment values travel on stdin, never on an argv."""
        ip = self.bed.node(node).ip
        env = {
            **step.env,
            **(secret_env or {}),
            "TETHER_NODE": node,
            "TETHER_NODE_IP": ip,
            "TETHER_STEP": step.name,
        }
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
        work = self.bed.exec(node, "mkdir -p /run/tether-e2e && mktemp -d /run/tether-e2e/step.XXXXXX")
        work_dir = work.stdout.strip()
        self.bed.exec(node, f"cat >{work_dir}/env", input=exports)
        self.bed.exec(node, f"cat >{work_dir}/step.sh", input=step.script)
        command = (
            f"cd {work_dir} && set -a && . ./env && set +a && "
            f"export TETHER_WORKDIR={work_dir}/w TETHER_PROVENANCE={work_dir}/provenance "
            f"TETHER_SECRETS_OUT={work_dir}/secrets TETHER_OUTPUTS={work_dir}/outputs && "
            f"mkdir -m 0700 {work_dir}/w && rm -f env && "
            f"exec bash step.sh </dev/null 2>&1"
        )
        done = self.bed.exec(node, command, check=False, timeout=step.timeout_seconds)
        back = self.bed.exec(
            node,
            f"cat {work_dir}/provenance 2>/dev/null; echo '--- secrets'; "
            f"cat {work_dir}/secrets {work_dir}/outputs 2>/dev/null; rm -rf {work_dir}",
        ).stdout
        prov, _, secrets = back.partition("--- secrets\n")
        result = Result(step.name, node, done.returncode, done.stdout + done.stderr, _kv(prov), _kv(secrets))
        self.results.append(result)
        return result

    def ok(self, node: str, step: Step, secret_env: Mapping[str, str] | None = None) -> Result:
        result = self.run(node, step, secret_env)
        assert result.code == 0, f"{node}: {step.name} failed ({result.code}):\n{result.output[-6000:]}"
        return result

    def twice(self, node: str, step: Step, secret_env: Mapping[str, str] | None = None) -> Result:
        """Run a step, then again: the second run succeeds and leaves the node's files as they were."""
        first = self.ok(node, step, secret_env)
        before = self.fingerprint(node)
        again = self.ok(node, step, secret_env)
        assert "wrote /" not in again.output, (node, step.name, again.output[-4000:])
        assert self.fingerprint(node) == before, (node, step.name, again.output[-4000:])
        return first

    def fingerprint(self, node: str) -> str:
        files = " ".join(WATCHED)
        return self.bed.exec(
            node,
            f"for f in {files}; do [ -e $f ] && sha256sum $f; done; "
            # (the kubelet crash-loops until kubeadm configured it: whether it is enabled, not active)
            "systemctl is-enabled kubelet; systemctl is-active containerd kube-apiserver-standin; true",
        ).stdout


def _kv(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def parallel(fn: Callable[[str], Any], nodes: list[str]) -> list[Any]:
    with concurrent.futures.ThreadPoolExecutor(len(nodes)) as pool:
        return list(pool.map(fn, nodes))


# ------------------------------------------------------------------------------------------ spec and plans


def spec_text(bed: Testbed, cluster: dict[str, Any] | None) -> str:
    services = bed.state["services"]
    url = re.search(r"(https?://\S+)", services["apt_source_trusted"])
    assert url is not None
    with urllib.request.urlopen(services["apt_repo_key_url"], timeout=10) as reply:
        key = reply.read().decode()
    doc: dict[str, Any] = {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "Environment",
        "metadata": {"name": "e2e-kubeadm"},
        "spec": {
            "packageRepositories": {"apt": [{"url": url.group(1), "key": key}]},
            "downloadMirror": services["download_mirror_url"],
            "containerRuntime": {"install": True, "name": "containerd", "package": {"name": "containerd"}},
            "kubernetes": {
                "install": True,
                "installer": "kubeadm",
                "release": {"version": services["kubernetes_version"]},
            },
        },
    }
    if cluster is not None:
        doc["spec"]["cluster"] = cluster
    return yaml.safe_dump(doc)


def load(text: str) -> EnvironmentSpec:
    loaded = load_document(text)
    return loaded.spec


def plan_for(spec: EnvironmentSpec, position: Position) -> Plan:
    """The node's plan with the ClusterContext the controller derives from spec.cluster."""
    cluster = spec.cluster
    assert cluster is not None
    ha = cluster.high_availability
    context = ClusterContext(
        position,
        upload_certs=cluster.control_plane.count > 1 or ha.enabled,
        ha_endpoint=ha.endpoint if ha.enabled else "",
        dedicated_control_plane=cluster.control_plane.dedicated,
    )
    role = "worker" if position is Position.WORKER else "control-plane"
    return render(spec, NodeContext(role, facts_for("debian-12"), cluster=context))


def join_env(values: Mapping[str, str], *, control_plane: bool) -> dict[str, str]:
    """What the controller releases to a join step (its secret_env)."""
    names = [material.TOKEN, material.CA_HASH, material.ENDPOINT]
    if control_plane:
        names.append(material.CERT_KEY)
    return {n: values[n] for n in names}


def nodes_json(bed: Testbed, node: str) -> dict[str, Any]:
    out = bed.exec(node, f"{ADMIN} kubectl get nodes -o json").stdout
    return {n["metadata"]["name"]: n for n in json.loads(out)["items"]}


def ready(node: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])


def cp_tainted(node: dict[str, Any]) -> bool:
    return any(t["key"] == "node-role.kubernetes.io/control-plane" for t in node["spec"].get("taints", []))


def redacted(value: str) -> str:
    return f"<redacted sha256:{hashlib.sha256(value.encode()).hexdigest()}>"


def secret_values(runner: Runner) -> set[str]:
    """Every token, token secret and certificate key any step or task handed out."""
    out: set[str] = set()
    for result in runner.results:
        for name in (material.TOKEN, material.CERT_KEY):
            value = result.secrets.get(name, "")
            if value:
                out |= {value, value.partition(".")[2]} - {""}
    return out


def assert_no_secret_leaked(bed: Testbed, runner: Runner, nodes: list[str]) -> None:
    """Not in any step's output or provenance, not in any file tether or the agent would leave behind."""
    secrets = secret_values(runner)
    assert secrets, "no join material was produced"
    admin = {r.secrets[material.KUBECONFIG] for r in runner.results if material.KUBECONFIG in r.secrets}
    for result in runner.results:
        shown = result.output + json.dumps(result.observed)
        for value in secrets | admin:
            assert value not in shown, f"{result.node}: {result.step} printed join material"
        # kubeadm prints bootstrap tokens of its own: the scripts mask every token-shaped string
        assert not re.search(r"\b[a-z0-9]{6}\.[a-z0-9]{16}\b", result.output), (result.node, result.step)
    dirs = "/etc /root /run /tmp /var/log /var/lib/tether /var/lib/kubelet"
    for node in nodes:
        for value in secrets:
            found = bed.exec(node, f"grep -rlF -e {shlex.quote(value)} {dirs} 2>/dev/null; true").stdout
            assert found == "", f"{node}: join material on disk in {found}"


def base_steps(runner: Runner, plans: Mapping[str, Plan]) -> None:
    """Preflight .. kubeadm on every node at once (as the agents do), each run twice."""

    def run(node: str) -> None:
        steps = plans[node].steps
        assert [s.name for s in steps[: len(BASE_STEPS)]] == BASE_STEPS, [s.name for s in steps]
        for step in steps[: len(BASE_STEPS)]:
            runner.twice(node, step)

    parallel(run, list(plans))


def step(plan: Plan, name: str) -> Step:
    return next(s for s in plan.steps if s.name == name)


def joined_with_certificate_key(bed: Testbed, node: str, cert_key: str) -> bool:
    """The stand-in's log: this node's kubeadm join was a control-plane join with that certificate key."""
    lines = bed.exec(node, "cat /var/log/kubeadm-standin/kubeadm.log").stdout.splitlines()
    joins = [json.loads(line) for line in lines if '"(effective)", "join"' in line]
    return any(j["control_plane"] and j.get("certificate_key") == redacted(cert_key) for j in joins)


def label_all(runner: Runner, init: str, roles: Mapping[str, str], spec: EnvironmentSpec) -> None:
    """The controller's label task for every joined node, run on the init node (twice: idempotent)."""
    cluster = spec.cluster
    assert cluster is not None
    for node, role in roles.items():
        pool = cluster.control_plane if role == "control-plane" else cluster.workers
        task = label_task(
            node,
            role=role,
            labels=dict(pool.labels),
            untaint=role == "control-plane" and not cluster.control_plane.dedicated,
        )
        runner.ok(init, task)
        again = runner.ok(init, task)
        assert f"node {node} labelled" in again.output


def assert_cluster(bed: Testbed, viewer: str, roles: Mapping[str, str], spec: EnvironmentSpec) -> None:
    """``kubectl get nodes -o json`` on a control plane: every node Ready, labelled and tainted as the
    label task left it."""
    cluster = spec.cluster
    assert cluster is not None
    seen = nodes_json(bed, viewer)
    assert sorted(seen) == sorted(roles)
    for name, role in roles.items():
        node = seen[name]
        labels = node["metadata"]["labels"]
        assert ready(node), (name, node["status"]["conditions"])
        assert labels["tether.dev/managed"] == "true"
        assert labels["tether.dev/role"] == role
        pool = cluster.control_plane if role == "control-plane" else cluster.workers
        for key, value in pool.labels.items():
            assert labels[key] == value, (name, key)
        if role == "control-plane":
            assert "node-role.kubernetes.io/control-plane" in labels
            assert cp_tainted(node) == cluster.control_plane.dedicated, (name, node["spec"])
        else:
            assert labels["node-role.kubernetes.io/worker"] == ""
            assert not cp_tainted(node)
        address = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
        assert address == bed.node(name).ip


def refresh(runner: Runner, init: str, previous: Mapping[str, str], *, upload_certs: bool) -> dict[str, str]:
    """The controller's refresh task on the init node; the endpoint stays what init handed out."""
    result = runner.ok(init, refresh_task(upload_certs=upload_certs))
    fresh = result.secrets
    assert fresh[material.TOKEN] != previous[material.TOKEN]
    assert fresh[material.CA_HASH] == previous[material.CA_HASH]
    if upload_certs:
        assert re.fullmatch(r"[0-9a-f]{64}", fresh[material.CERT_KEY])
        assert fresh[material.CERT_KEY] != previous[material.CERT_KEY]
    return {**previous, **fresh}


def stale_join_is_refused(runner: Runner, node: str, join: Step, stale: Mapping[str, str], cp: bool) -> None:
    """After the stand-in cluster expired the material, a join with it fails, with kubeadm's reason."""
    result = runner.run(node, join, join_env(stale, control_plane=cp))
    assert result.code != 0
    assert "kubeadm join failed" in result.output
    assert "could not find a JWS signature in the cluster-info ConfigMap" in result.output, result.output


# ---------------------------------------------------------------------------------------------- the tests


def test_one_control_plane_and_a_worker_then_a_late_worker_by_refresh(
    fresh_testbed: Callable[..., Testbed],
) -> None:
    bed = fresh_testbed(3)
    cluster = {
        "controlPlane": {"count": 1, "labels": {"tether.test/pool": "system"}},
        "workers": {"count": 2, "labels": {"tether.test/pool": "gpu"}},
    }
    spec = load(spec_text(bed, cluster))
    plans = {
        "node1": plan_for(spec, Position.INIT),
        "node2": plan_for(spec, Position.WORKER),
        "node3": plan_for(spec, Position.WORKER),
    }
    assert [s.name for s in plans["node1"].steps] == [*BASE_STEPS, INIT_STEP, "calico"]
    assert [s.name for s in plans["node2"].steps] == [*BASE_STEPS, JOIN_STEP]
    join = step(plans["node2"], JOIN_STEP)
    assert join.gate and set(join.secret_env) == {material.TOKEN, material.CA_HASH, material.ENDPOINT}
    runner = Runner(bed)
    base_steps(runner, plans)

    init = runner.twice("node1", step(plans["node1"], INIT_STEP))
    handed = runner.results[
        -1
    ].secrets  # a second run hands out fresh material; the controller keeps the last
    assert set(init.secrets) >= {material.TOKEN, material.CA_HASH, material.ENDPOINT, material.KUBECONFIG}
    assert material.CERT_KEY not in handed
    assert handed[material.ENDPOINT] == f"{bed.node('node1').ip}:6443"
    assert init.observed["kubernetes.ca_hash"] == handed[material.CA_HASH]
    runner.twice("node1", step(plans["node1"], "calico"))
    runner.twice("node2", join, join_env(handed, control_plane=False))
    label_all(runner, "node1", {"node1": "control-plane", "node2": "worker"}, spec)
    assert_cluster(bed, "node1", {"node1": "control-plane", "node2": "worker"}, spec)

    # Days later: the material expired; a new worker is refused with it and joins with refreshed material.
    bed.expire_join_material("node1")
    stale_join_is_refused(runner, "node3", join, handed, cp=False)
    fresh = refresh(runner, "node1", handed, upload_certs=False)
    runner.twice("node3", step(plans["node3"], JOIN_STEP), join_env(fresh, control_plane=False))
    roles = {"node1": "control-plane", "node2": "worker", "node3": "worker"}
    label_all(runner, "node1", {"node3": "worker"}, spec)
    assert_cluster(bed, "node1", roles, spec)
    assert_no_secret_leaked(bed, runner, list(roles))


def test_three_control_planes_behind_the_load_balancer(fresh_testbed: Callable[..., Testbed]) -> None:
    bed = fresh_testbed(4, lb=True)
    lb = bed.state["services"]["lb_endpoint"]
    bed.set_lb_backends(["node1", "node2", "node3"])
    cluster = {
        "controlPlane": {"count": 3, "dedicated": True, "labels": {"tether.test/pool": "system"}},
        "workers": {"count": 1, "labels": {"tether.test/pool": "gpu"}},
        "highAvailability": {"enabled": True, "endpoint": lb},
    }
    spec = load(spec_text(bed, cluster))
    plans = {
        "node1": plan_for(spec, Position.INIT),
        "node2": plan_for(spec, Position.CONTROL_PLANE),
        "node3": plan_for(spec, Position.CONTROL_PLANE),
        "node4": plan_for(spec, Position.WORKER),
    }
    cp_join = step(plans["node2"], JOIN_STEP)
    assert material.CERT_KEY in cp_join.secret_env
    runner = Runner(bed)
    base_steps(runner, plans)

    runner.twice("node1", step(plans["node1"], INIT_STEP))
    handed = runner.results[-1].secrets
    assert handed[material.ENDPOINT] == lb
    assert re.fullmatch(r"[0-9a-f]{64}", handed[material.CERT_KEY])
    admin = bed.exec("node1", "grep server: /etc/kubernetes/admin.conf").stdout
    assert f"https://{lb}" in admin
    runner.twice("node1", step(plans["node1"], "calico"))
    operator = bed.exec(
        "node1",
        f"{ADMIN} kubectl -n tigera-operator get deployment tigera-operator "
        "-o jsonpath='{.spec.template.spec.hostNetwork} {.spec.template.spec.containers[0].env}'",
    ).stdout
    assert operator.startswith("true ") and lb.split(":")[0] in operator  # the API without a service network
    runner.twice("node2", cp_join, join_env(handed, control_plane=True))
    assert joined_with_certificate_key(bed, "node2", handed[material.CERT_KEY])

    # The certificate key lives 2 h, tokens a day: after both expired, the refresh task's material works.
    bed.expire_join_material("node1")
    stale_join_is_refused(runner, "node3", step(plans["node3"], JOIN_STEP), handed, cp=True)
    fresh = refresh(runner, "node1", handed, upload_certs=True)
    runner.twice("node3", step(plans["node3"], JOIN_STEP), join_env(fresh, control_plane=True))
    assert joined_with_certificate_key(bed, "node3", fresh[material.CERT_KEY])
    runner.twice("node4", step(plans["node4"], JOIN_STEP), join_env(fresh, control_plane=False))
    for node in ("node2", "node3", "node4"):
        conf = bed.exec(node, "grep server: /etc/kubernetes/kubelet.conf").stdout
        assert f"https://{lb}" in conf, (node, conf)
    for node in ("node1", "node2", "node3"):
        bed.exec(node, "systemctl is-active kube-apiserver-standin")
    roles = {"node1": "control-plane", "node2": "control-plane", "node3": "control-plane", "node4": "worker"}
    label_all(runner, "node1", roles, spec)
    for viewer in ("node1", "node3"):
        assert_cluster(bed, viewer, roles, spec)
    assert_no_secret_leaked(bed, runner, list(roles))


def test_single_node_control_plane(fresh_testbed: Callable[..., Testbed]) -> None:
    """Without spec.cluster: kubeadm init, Calico, then untaint, label and wait (kubernetes-ready)."""
    bed = fresh_testbed(1)
    spec = load(spec_text(bed, None))
    plan = render(spec, NodeContext("control-plane", facts_for("debian-12")))
    assert [s.name for s in plan.steps] == [*BASE_STEPS, "kubeadm-init", "calico", "kubernetes-ready"]
    runner = Runner(bed)
    for s in plan.steps:
        runner.twice("node1", s)
    node = nodes_json(bed, "node1")["node1"]
    assert ready(node) and not cp_tainted(node)
    assert node["metadata"]["labels"]["node-role.kubernetes.io/worker"] == ""
    assert node["metadata"]["labels"]["tether.dev/managed"] == "true"
    pulled = bed.exec("node1", "cat /var/log/kubeadm-standin/kubeadm.log").stdout
    assert '"config", "images", "pull"' in pulled
