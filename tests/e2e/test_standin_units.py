"""Pure parts of the kubeadm/kubectl stand-ins (no nodes needed, so not marked e2e: they run everywhere)."""

from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

sys.path.insert(0, str(Path(__file__).parent / "testbed" / "standins"))

from k8s_standin import common, kubeadm_base, kubectl, miniyaml

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
    assert [n["metadata"]["name"] for n in nodes if kubectl._selected(n, "role=cp")] == ["a"]
    assert [n["metadata"]["name"] for n in nodes if kubectl._selected(n, "!role")] == ["b"]
    assert kubectl.jsonpath("{.items[*].metadata.name}", nodes, single=False) == "a b"
    ready = '{.status.conditions[?(@.type=="Ready")].status}'
    assert kubectl.jsonpath(ready, nodes[:1], single=True) == "True"
