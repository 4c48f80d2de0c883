"""Pure parts of the kubeadm/kubectl stand-ins (no nodes needed, so not marked e2e: they run everywhere)."""

from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

sys.path.insert(0, str(Path(__file__).parent / "testbed" / "standins"))

from k8s_standin import common, kubeadm_base, kubectl, miniyaml, objects

KUBEADM_CONFIG = """\
apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
bootstrapTokens:
- token: "abcdef.0123456789abcdef"   # quoted, with a comment
  ttl: 2h
nodeRegistration:
  criSocket: unix:///run/containerd/containerd.sock
  kubeletExtraArgs:
  - name: node-ip
    value: 10.0.0.5
  taints: []
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
controlPlaneEndpoint: lb.example:6443
apiServer:
  certSANs:
    - lb.example
    - 10.0.0.100
networking:
  podSubnet: 192.168.0.0/16
"""


def test_miniyaml_reads_kubeadm_configs() -> None:
    init, cluster = miniyaml.load_all(KUBEADM_CONFIG)
    assert init["bootstrapTokens"] == [{"token": "abcdef.0123456789abcdef", "ttl": "2h"}]
    assert init["nodeRegistration"]["kubeletExtraArgs"] == [{"name": "node-ip", "value": "10.0.0.5"}]
    assert init["nodeRegistration"]["taints"] == []
    assert cluster["apiServer"]["certSANs"] == ["lb.example", "10.0.0.100"]
    assert cluster["controlPlaneEndpoint"] == "lb.example:6443"


def test_miniyaml_round_trips_kubeconfigs() -> None:
    doc = {
        "apiVersion": "v1",
        "clusters": [
            {
                "cluster": {"certificate-authority-data": "QUJD", "server": "https://10.0.0.1:6443"},
                "name": "k",
            }
        ],
        "contexts": [{"context": {"cluster": "k", "user": "admin"}, "name": "admin@k"}],
        "current-context": "admin@k",
        "preferences": {},
        "users": [
            {"name": "admin", "user": {"client-certificate-data": "Q0VSVA==", "client-key-data": "S0VZ"}}
        ],
    }
    assert miniyaml.load(miniyaml.dump(doc)) == doc


def test_kubeadm_config_is_parsed_by_kind(tmp_path: Path) -> None:
    path = tmp_path / "kubeadm.yaml"
    path.write_text(KUBEADM_CONFIG)
    cfg = kubeadm_base.load_config(str(path))
    assert set(cfg) == {"InitConfiguration", "ClusterConfiguration"}
    path.write_text("apiVersion: v1\nkind: Pod\n")
    with pytest.raises(kubeadm_base.Failure, match="unknown apiVersion"):
        kubeadm_base.load_config(str(path))


def test_secrets_in_logged_arguments_are_replaced_by_their_hash() -> None:
    token, key = "abcdef.0123456789abcdef", "a" * 64
    logged = common.redact_argv(
        ["join", "x:6443", "--token", token, f"--certificate-key={key}", "token", "delete", token]
    )
    text = " ".join(logged)
    assert "0123456789abcdef" not in text and key not in text
    assert hashlib.sha256(b"0123456789abcdef").hexdigest() in text  # tests can match a known secret
    assert hashlib.sha256(key.encode()).hexdigest() in text
    assert "abcdef." in text  # the token id is not secret


def test_bootstrap_token_jws_detects_a_wrong_secret() -> None:
    payload = "apiVersion: v1\nkind: Config\n"
    jws = common.jws_detached(payload, "abcdef", "0123456789abcdef")
    assert common.jws_verify(payload, jws, "abcdef", "0123456789abcdef")
    assert not common.jws_verify(payload, jws, "abcdef", "0123456789abcdeX")
    assert not common.jws_verify(payload + " ", jws, "abcdef", "0123456789abcdef")


@pytest.mark.parametrize(
    ("text", "seconds"), [("24h0m0s", 86400), ("2h", 7200), ("90s", 90), ("1h30m", 5400), ("0", 0)]
)
def test_go_durations(text: str, seconds: float) -> None:
    assert kubeadm_base.parse_duration(text) == seconds


def test_bad_duration_is_an_error() -> None:
    with pytest.raises(kubeadm_base.Failure):
        kubeadm_base.parse_duration("tomorrow")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")
def test_ca_cert_hash_is_kubeadms_spki_sha256(tmp_path: Path) -> None:
    common.new_ca(tmp_path / "ca.crt", tmp_path / "ca.key")
    pem = (tmp_path / "ca.crt").read_bytes()
    spki = (
        x509.load_pem_x509_certificate(pem)
        .public_key()
        .public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    assert common.ca_cert_hash(pem) == "sha256:" + hashlib.sha256(spki).hexdigest()
    assert common.new_token() != common.new_token()
    assert common.TOKEN_RE.match(common.new_token())


def test_kubectl_label_selector_and_jsonpath() -> None:
    nodes = [
        {
            "metadata": {"name": "a", "labels": {"role": "cp"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        },
        {
            "metadata": {"name": "b", "labels": {}},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]},
        },
    ]
    assert [n["metadata"]["name"] for n in nodes if common.selected(n, "role=cp")] == ["a"]
    assert [n["metadata"]["name"] for n in nodes if common.selected(n, "!role")] == ["b"]
    assert kubectl.jsonpath("{.items[*].metadata.name}", nodes, single=False) == "a b"
    ready = '{.status.conditions[?(@.type=="Ready")].status}'
    assert kubectl.jsonpath(ready, nodes[:1], single=True) == "True"


# ---------------------------------------------------------------- objects (the API server's add-on emulation)


def _node(name: str, *, ready: bool = True, taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/os": "linux"}},
        "spec": {"taints": taints or []},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


CP_TAINT = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}


def test_strategic_merge_merges_containers_and_env_by_name() -> None:
    base = {
        "containers": [{"name": "op", "image": "a", "env": [{"name": "A", "value": "1"}]}],
        "hostNetwork": True,
    }
    change = {
        "containers": [{"name": "op", "env": [{"name": "B", "value": "2"}, {"name": "A", "value": "3"}]}]
    }
    merged = objects.strategic_merge(base, change)
    assert merged["containers"][0]["image"] == "a"
    assert merged["containers"][0]["env"] == [{"name": "A", "value": "3"}, {"name": "B", "value": "2"}]
    assert merged["hostNetwork"] is True
    assert objects.merge_patch(base, {"containers": [], "hostNetwork": None}) == {"containers": []}


def test_tolerations_and_scheduling() -> None:
    assert objects.tolerates([{"operator": "Exists"}], CP_TAINT)
    assert objects.tolerates([{"key": CP_TAINT["key"], "effect": "NoSchedule"}], CP_TAINT)
    assert not objects.tolerates([{"key": "other", "operator": "Exists"}], CP_TAINT)
    pod = {"containers": []}
    assert "untolerated taint" in (objects.pod_problem(pod, [_node("cp", taints=[CP_TAINT])], True) or "")
    assert objects.pod_problem(pod, [_node("w")], False) == objects.CNI_NOT_READY
    assert objects.pod_problem({**pod, "hostNetwork": True}, [_node("w")], False) is None


def test_the_tigera_operator_registers_crds_and_calico_follows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(objects, "POD_START_S", 0.0)
    state: dict[str, Any] = {
        "members": [{"name": "cp", "address": "10.0.0.1:6443"}],
        "cluster": {"controlPlaneEndpoint": "10.0.0.1:6443"},
    }
    nodes = [_node("cp", taints=[CP_TAINT]), _node("w")]
    objects.kubeadm_addons(state, 0.0)
    coredns = objects.get(state, objects.DEPLOYMENTS, "kube-system", "coredns")
    assert coredns is not None
    assert not objects.render(state, coredns, nodes, 10.0)["status"].get("availableReplicas")  # no CNI yet
    recorded = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tigera-operator"}}]
    recorded.append({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "tigera-operator"}})
    results = objects.apply(state, recorded, "default", 1.0)
    assert [(r["type"], r["name"]) for r in results] == [
        ("namespace", "tigera-operator"),
        ("deployment.apps", "tigera-operator"),
    ]
    installation = [
        {"apiVersion": "operator.tigera.io/v1", "kind": "Installation", "metadata": {"name": "default"}}
    ]
    assert "no matches for kind" in objects.apply(state, installation, "default", 1.0)[0]["error"]
    # the operator is pointed at an address that is no API server: it does not work
    objects.patch(
        state,
        objects.DEPLOYMENTS,
        "tigera-operator",
        "tigera-operator",
        {
            "spec": {
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "tigera-operator",
                                "env": [
                                    {"name": "KUBERNETES_SERVICE_HOST", "value": "10.9.9.9"},
                                    {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"},
                                ],
                            }
                        ]
                    }
                }
            }
        },
        "application/strategic-merge-patch+json",
        2.0,
    )
    assert not objects.reconcile(state, nodes, 3.0)
    assert "connection refused" in (objects.operator_problem(state, nodes, 3.0) or "")
    objects.patch(
        state,
        objects.DEPLOYMENTS,
        "tigera-operator",
        "tigera-operator",
        {
            "spec": {
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "tigera-operator",
                                "env": [
                                    {"name": "KUBERNETES_SERVICE_HOST", "value": "10.0.0.1"},
                                ],
                            }
                        ]
                    }
                }
            }
        },
        "application/strategic-merge-patch+json",
        4.0,
    )
    assert objects.reconcile(state, nodes, 5.0)
    crd = objects.get(state, objects.CRDS, "", "installations.operator.tigera.io")
    assert crd is not None
    established = objects.render(state, crd, nodes, 5.0)["status"]["conditions"]
    assert {"type": "Established", "status": "True"}.items() <= established[1].items()
    assert objects.apply(state, installation, "default", 6.0)[0]["action"] == "created"
    objects.reconcile(state, nodes, 6.0)
    calico = objects.get(state, objects.DAEMONSETS, "calico-system", "calico-node")
    assert calico is not None
    status = objects.render(state, calico, nodes, 7.0)["status"]
    assert status["desiredNumberScheduled"] == status["numberReady"] == 2  # it tolerates the control plane
    assert objects.render(state, coredns, nodes, 7.0)["status"]["availableReplicas"] == 2  # the CNI is up


def test_rest_paths_route_to_resources() -> None:
    known = list(objects.BUILTIN)
    assert objects.route("/apis/apps/v1/namespaces/ns/deployments/x", known) == (
        objects.DEPLOYMENTS,
        "ns",
        "x",
    )
    assert objects.route("/api/v1/namespaces/kube-system", known) == (objects.NAMESPACES, "", "kube-system")
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    assert objects.route(crds, known) == (objects.CRDS, "", "")
    assert objects.route("/api/v1/nodes/n1", known) is None  # nodes have their own handler
    assert objects.resolve("deploy", known) == objects.DEPLOYMENTS
    assert objects.resolve("customresourcedefinitions.apiextensions.k8s.io", known) == objects.CRDS


def test_kubectl_jsonpath_ranges_literals_and_flags() -> None:
    doc = {"items": [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}], "x": {"y": [1, 2]}}
    expr = '{range .items[*]}{.metadata.name}{"\\n"}{end}'
    assert kubectl.jsonpath_doc(expr, doc) == "a\nb\n"
    assert kubectl.jsonpath_doc("{.x.y}", doc) == "[1,2]"
    flags, words = kubectl.parse(["-ojson", "-n", "ns", "get", "--raw", "/readyz", "patch", "-p", "{}"])
    assert flags == {"output": "json", "namespace": "ns", "raw": "/readyz", "patch": "{}"}
    assert words == ["get", "patch"]
    flags, _ = kubectl.parse(["config", "view", "--raw", "--minify"])
    assert flags == {"raw": True, "minify": True}


def test_kubectl_rollout_messages_are_kubectls() -> None:
    dep = {
        "metadata": {"name": "d", "generation": 2},
        "spec": {"replicas": 1},
        "status": {"observedGeneration": 1},
    }
    assert kubectl._rollout_message(objects.DEPLOYMENTS, dep)[0].startswith(
        "Waiting for deployment spec update"
    )
    dep["status"] = {"observedGeneration": 2, "replicas": 1, "updatedReplicas": 1, "availableReplicas": 1}
    assert kubectl._rollout_message(objects.DEPLOYMENTS, dep) == (
        'deployment "d" successfully rolled out',
        True,
    )
    ds = {
        "metadata": {"name": "c", "generation": 1},
        "status": {
            "observedGeneration": 1,
            "desiredNumberScheduled": 2,
            "updatedNumberScheduled": 2,
            "numberAvailable": 1,
        },
    }
    message, done = kubectl._rollout_message(objects.DAEMONSETS, ds)
    assert (
        not done
        and message == 'Waiting for daemon set "c" rollout to finish: 1 of 2 updated pods are available...'
    )
