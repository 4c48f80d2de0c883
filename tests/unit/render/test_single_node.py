"""Issue 14: single-node kubeadm is a cluster of one; kubernetes.remoteAccess / kubeConfig;
containerRuntime.smokeTest (holodeck's ``docker run hello-world`` after Docker installs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.unit.render import scenarios
from tests.unit.render.shellrun import run_bash
from tether.controller.cluster.context import SINGLE_NODE, ClusterContext, Position, cluster_of, context_for
from tether.controller.render import NodeContext, render
from tether.controller.render.components import cluster as cluster_steps
from tether.controller.render.targets import facts_for
from tether.controller.spec import SpecError, load_document
from tether.controller.spec.model import EnvironmentSpec
from tether.nodeagent.model import Plan

HOLODECK = "apiVersion: holodeck.nvidia.com/v1alpha1\nkind: Environment\nmetadata: {name: single}\nspec:\n"


def spec_of(body: str, head: str = HOLODECK) -> EnvironmentSpec:
    return load_document(head + body).spec


def plan(spec: EnvironmentSpec, role: str = "control-plane", cluster: ClusterContext | None = None) -> Plan:
    return render(spec, NodeContext(role, facts_for("ubuntu-22.04"), cluster))


def names(p: Plan) -> list[str]:
    return [s.name for s in p.steps]


def kubeadm_config(p: Plan) -> list[dict[str, object]]:
    init = p.step("kubeadm-init")
    assert init is not None
    return list(yaml.safe_load_all(init.env["TETHER_KUBEADM_CONFIG"]))


# -- a single node is a cluster of one -------------------------------------------------------------


def test_kubeadm_without_spec_cluster_is_a_cluster_of_one() -> None:
    single = spec_of("  kubernetes: {install: true, installer: kubeadm}\n")
    assert single.cluster is None
    assert cluster_of(single) is SINGLE_NODE
    assert (SINGLE_NODE.control_plane.count, SINGLE_NODE.workers.count) == (1, 0)
    assert not SINGLE_NODE.control_plane.dedicated and not SINGLE_NODE.high_availability.enabled
    # Other installers have no kubeadm cluster.
    kind = spec_of(
        "  kubernetes: {install: true, installer: kind}\n  containerRuntime: {install: true, name: docker}\n"
    )
    assert cluster_of(kind) is None
    assert cluster_of(spec_of("  kubernetes: {install: false}\n")) is None


def test_the_single_control_plane_runs_the_cluster_init_calico_and_holodecks_ready_step() -> None:
    single = spec_of("  kubernetes: {install: true, installer: kubeadm}\n")
    offline = plan(single)
    assert names(offline)[-4:] == ["kubeadm", "kubeadm-init", "calico", "kubernetes-ready"]
    init = offline.step("kubeadm-init")
    assert init is not None
    # The cluster init: it hands the controller the join material and the admin kubeconfig.
    assert "ADMIN_KUBECONFIG_B64" in init.script and "$TETHER_SECRETS_OUT" in init.script
    assert "kubeadm config images pull" in init.script  # holodeck pre-pulls, with retries
    ready = offline.step("kubernetes-ready")
    assert ready is not None
    assert "node-role.kubernetes.io/control-plane:NoSchedule-" in ready.script  # holodeck untaints
    assert "node-role.kubernetes.io/worker=" in ready.script
    # The plan the controller gives the node it chose to initialise is the offline one, byte for byte.
    chosen = plan(single, cluster=context_for(SINGLE_NODE, Position.INIT))
    assert chosen.digest == offline.digest
    assert context_for(SINGLE_NODE, Position.INIT) == ClusterContext(Position.INIT)  # no certificate upload


def test_other_nodes_of_a_single_node_environment_join_it() -> None:
    single = spec_of("  kubernetes: {install: true, installer: kubeadm}\n")
    worker = plan(single, "worker", context_for(SINGLE_NODE, Position.WORKER))
    assert names(worker)[-2:] == ["kubeadm", "kubeadm-join"]
    assert "kubernetes-ready" not in names(worker)
    # Without a position (offline) a worker renders its base steps only, as with spec.cluster.
    assert names(plan(single, "worker"))[-1] == "kubeadm"


def test_spec_cluster_keeps_its_plans_without_the_single_node_step() -> None:
    spec = spec_of(
        "  kubernetes: {install: true}\n  cluster: {controlPlane: {count: 1}, workers: {count: 1}}\n"
    )
    assert spec.cluster is not None
    init = plan(spec, cluster=context_for(spec.cluster, Position.INIT))
    assert names(init)[-3:] == ["kubeadm", "kubeadm-init", "calico"]
    assert names(plan(spec))[-1] == "kubeadm"  # no position: no cluster step


# -- kubernetes.remoteAccess and kubeConfig -------------------------------------------------------


def test_remote_access_and_kube_config_are_read() -> None:
    k8s = spec_of(
        "  kubernetes: {install: true, remoteAccess: true, kubeConfig: ./out/kubeconfig}\n"
    ).kubernetes
    assert k8s.remote_access and k8s.kube_config == "./out/kubeconfig"
    plain = spec_of("  kubernetes: {install: true}\n").kubernetes
    assert not plain.remote_access and plain.kube_config == ""


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "  kubernetes: {install: true, kubeConfig: ../up/kc}\n",
            "spec.kubernetes.kubeConfig: path must not contain '..'",
        ),
        (  # relative to tetherctl's working directory: never ~ or absolute (the path is named)
            "  kubernetes: {install: true, kubeConfig: '~/kc'}\n",
            "spec.kubernetes.kubeConfig: must be relative to the working directory (no leading / or ~) "
            "(got '~/kc')",
        ),
        (
            "  kubernetes: {install: true, kubeConfig: /etc/kubernetes/admin.conf}\n",
            "spec.kubernetes.kubeConfig: must be relative to the working directory (no leading / or ~) "
            "(got '/etc/kubernetes/admin.conf')",
        ),
        (
            "  kubernetes: {install: true, remoteAccess: 'yes'}\n",
            "spec.kubernetes.remoteAccess: must be true or false",
        ),
    ],
)
def test_bad_remote_access_or_kube_config_is_refused_with_its_path(body: str, message: str) -> None:
    with pytest.raises(SpecError) as err:
        load_document(HOLODECK + body)
    assert any(str(p).startswith(message) for p in err.value.problems), err.value.problems


def test_remote_access_with_another_installer_is_a_note() -> None:
    loaded = load_document(
        HOLODECK + "  kubernetes: {install: true, installer: kind, remoteAccess: true, kubeConfig: kc}\n"
        "  containerRuntime: {install: true, name: docker}\n"
    )
    assert any(n.startswith("spec.kubernetes.remoteAccess: ignored") for n in loaded.notes)
    assert any(n.startswith("spec.kubernetes.kubeConfig: ignored") for n in loaded.notes)


def test_k8s_endpoint_host_is_a_certificate_name_and_the_endpoint_stays_the_node() -> None:
    spec = spec_of("  kubernetes: {install: true, K8sEndpointHost: api.example.com}\n")
    docs = kubeadm_config(plan(spec))
    cluster = next(d for d in docs if d["kind"] == "ClusterConfiguration")
    assert cluster["controlPlaneEndpoint"] == cluster_steps.ENDPOINT  # the node's address (holodeck's)
    assert cluster["apiServer"] == {"certSANs": [cluster_steps.ADVERTISE, "api.example.com"]}


def test_remote_access_names_every_address_of_the_init_node_in_the_certificate(tmp_path: Path) -> None:
    spec = spec_of("  kubernetes: {install: true, remoteAccess: true, K8sEndpointHost: api.example.com}\n")
    p = plan(spec)
    cluster = next(d for d in kubeadm_config(p) if d["kind"] == "ClusterConfiguration")
    assert cluster["apiServer"]["certSANs"] == [  # type: ignore[index]
        cluster_steps.ADVERTISE,
        "api.example.com",
        cluster_steps.NODE_SANS,
    ]
    init = p.step("kubeadm-init")
    assert init is not None
    # The part of the script that fills the config in, run with a stub hostname.
    body = init.script
    start = body.index("node_ip=${TETHER_NODE_IP")
    end = body.index("printf '%s\\n' \"$text\" | install_file")
    snippet = 'set -euo pipefail\nlog() { echo "$*" >&2; }\n' + body[start:end] + "printf '%s\\n' \"$text\"\n"
    stubs = {
        "hostname": (
            'case ${1:-} in -I) echo "10.0.0.5 192.0.2.7 fd00::7 ";; -f) echo node1.lab.example;; '
            "*) echo node1;; esac"
        )
    }
    env = {**init.env, "TETHER_NODE_IP": "10.0.0.5", "TETHER_NODE": "node1"}
    out = run_bash(tmp_path, snippet, stubs=stubs, env=env)
    assert out.returncode == 0, out.stderr
    filled = next(d for d in yaml.safe_load_all(out.stdout) if d["kind"] == "ClusterConfiguration")
    assert filled["apiServer"]["certSANs"] == [
        "10.0.0.5",
        "api.example.com",
        "192.0.2.7",
        "fd00::7",
        "node1",
        "node1.lab.example",
    ]
    assert filled["controlPlaneEndpoint"] == "10.0.0.5:6443"
    # Without remoteAccess the script has no such part, and the config no placeholder.
    plain = plan(spec_of("  kubernetes: {install: true}\n")).step("kubeadm-init")
    assert plain is not None
    assert "@NODE_SANS@" not in plain.script + plain.env["TETHER_KUBEADM_CONFIG"]
    assert "hostname -I" not in plain.script


def test_remote_access_leaves_a_users_kubeadm_config_alone() -> None:
    user = "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\n"
    spec = spec_of(
        f"  kubernetes: {{install: true, remoteAccess: true, kubeAdmConfigContent: {json.dumps(user)}}}\n"
    )
    init = plan(spec).step("kubeadm-init")
    assert init is not None
    assert init.env["TETHER_KUBEADM_CONFIG"] == user
    assert "hostname -I" not in init.script


# -- containerRuntime.smokeTest --------------------------------------------------------------------


def test_the_docker_smoke_test_runs_only_when_asked() -> None:
    docker = "  containerRuntime: {install: true, name: docker}\n"
    assert "docker-smoke-test" not in names(plan(spec_of(docker)))
    asked = plan(spec_of("  containerRuntime: {install: true, name: docker, smokeTest: true}\n"))
    assert names(asked)[1:3] == ["docker", "docker-smoke-test"]  # right after the install
    step = asked.step("docker-smoke-test")
    assert step is not None
    assert 'docker run --rm "$image"' in step.script and "image=hello-world" in step.script
    assert step.requested == {"image": "hello-world"}
    assert step.phase == "runtime" and step.component == "docker"
    # With kubeadm, cri-dockerd still follows.
    kube = plan(
        spec_of(
            "  containerRuntime: {install: true, name: docker, smokeTest: true}\n"
            "  kubernetes: {install: true}\n"
        )
    )
    assert names(kube)[1:4] == ["docker", "docker-smoke-test", "cri-dockerd"]


def test_the_smoke_test_image_can_come_from_a_mirror() -> None:
    spec = spec_of(
        "  containerRuntime:\n    install: true\n    name: docker\n    smokeTest: true\n"
        "    smokeTestImage: registry.lab:5000/library/hello-world:linux\n"
    )
    step = plan(spec).step("docker-smoke-test")
    assert step is not None
    assert "image=registry.lab:5000/library/hello-world:linux" in step.script


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("  containerRuntime: {install: true, name: containerd, smokeTest: true}\n", "only with Docker"),
        (
            "  containerRuntime:\n    {install: true, name: docker, smokeTest: true,\n"
            "     smokeTestImage: 'x;rm -rf /'}\n",
            "not a container image reference",
        ),
    ],
)
def test_a_smoke_test_docker_cannot_run_is_refused(body: str, message: str) -> None:
    with pytest.raises(SpecError) as err:
        load_document(scenarios.HEAD + body)
    assert any(message in str(p) for p in err.value.problems), err.value.problems


def test_the_smoke_test_says_why_it_failed(tmp_path: Path) -> None:
    step = plan(spec_of("  containerRuntime: {install: true, name: docker, smokeTest: true}\n")).step(
        "docker-smoke-test"
    )
    assert step is not None
    script = step.script.replace("\ncheck_os\n", "\n", 1)
    ok = run_bash(
        tmp_path,
        script,
        stubs={"docker": '[[ $1 != run ]] || echo "Hello from Docker!"', "sleep": "true"},
    )
    assert ok.returncode == 0, ok.stderr
    assert "Hello from Docker!" in ok.stdout and "smoke test passed" in ok.stdout
    failing = run_bash(
        tmp_path,
        script,
        stubs={
            "docker": '[[ $1 != run ]] || { echo "pull access denied" >&2; return 125; }',
            "journalctl": "echo docker journal",
            "sleep": "true",
        },
    )
    assert failing.returncode != 0
    assert "pull access denied" in failing.stdout
    assert "the Docker smoke test failed" in failing.stderr
