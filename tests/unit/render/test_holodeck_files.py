"""What holodeck's files render to (issue 14): a runfile without a checksum says on the node that
its download was not verified; the Go-templated kubeadm config gets its four values; a holodeck
name that is no DNS label becomes one where kubeadm needs it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import yaml

from tests.unit.render.shellrun import curl_serving, run_bash
from tether.controller.cluster.context import Position, context_for
from tether.controller.render import NodeContext, render
from tether.controller.render.targets import facts_for
from tether.controller.spec import load_document
from tether.nodeagent.model import Step

URL = "https://us.download.nvidia.com/tesla/560.35.03/NVIDIA-Linux-x86_64-560.35.03.run"


def holodeck(body: str, name: str = "driver-runfile-test") -> str:
    head = "apiVersion: holodeck.nvidia.com/v1alpha1\nkind: Environment\n"
    return f"{head}metadata: {{name: {name}}}\nspec:\n{body}"


def _step(text: str, name: str, node: NodeContext | None = None) -> Step:
    plan = render(load_document(text).spec, node or NodeContext("control-plane", facts_for("ubuntu-22.04")))
    step = plan.step(name)
    assert step is not None, [s.name for s in plan.steps]
    return step


# -- a runfile without a checksum -------------------------------------------------------------

RUNFILE = f"  nvidiaDriver:\n    install: true\n    source: runfile\n    runfile: {{url: '{URL}'}}\n"


def test_an_unverified_runfile_says_so_in_the_plan() -> None:
    step = _step(holodeck(RUNFILE), "nvidia-driver")
    assert step.requested == {"source": "runfile", "url": URL, "verified": "no: the spec gives no checksum"}
    assert "NOT verified" in step.description
    assert "fetch_verified" not in step.script.split("install_headers\n")[-1]
    assert 'provenance nvidia-driver.verified "no: the spec gives no checksum"' in step.script


def test_a_verified_runfile_renders_as_before() -> None:
    body = RUNFILE.replace("'}\n", f"', checksum: 'sha256:{'ab' * 32}'}}\n")
    assert body != RUNFILE
    step = _step(holodeck(body), "nvidia-driver")
    assert step.requested == {"source": "runfile", "url": URL, "sha256": "ab" * 32}
    assert "NOT verified" not in step.script and "nvidia-driver.verified" not in step.script


def test_an_unverified_runfile_install_logs_and_records_it_on_the_node(tmp_path: Path) -> None:
    step = _step(holodeck(RUNFILE), "nvidia-driver")
    script = step.script.replace("\ncheck_os\n", "\n", 1)
    runfile = b"#!/bin/sh\necho pretend driver\n"
    installed = tmp_path / "installed"
    stubs = {
        "curl": curl_serving({URL: runfile}, tmp_path),
        "apt-get": "true",
        "sh": f'echo "sh $*" >>"$TETHER_WORKDIR/calls"; touch {installed}',
        "nvidia-smi": f"[[ -f {installed} ]] && echo 560.35.03",
        "modprobe": "true",
        "modinfo": "echo 560.35.03",
        "systemctl": "return 1",
    }
    env = {"TETHER_STATE": str(tmp_path / "state"), **step.env}
    out = run_bash(tmp_path, script, stubs=stubs, env=env)
    assert out.returncode == 0, out.stderr
    assert f"WARNING: the spec gives no checksum for {URL}: the download is NOT verified" in out.stdout
    assert "WARNING: installing an unverified runfile (sha256 " in out.stdout
    provenance = (tmp_path / "provenance").read_text()
    assert "nvidia-driver.verified=no: the spec gives no checksum\n" in provenance
    assert f"nvidia-driver.sha256={hashlib.sha256(runfile).hexdigest()}\n" in provenance
    assert "sh " in (tmp_path / "work" / "calls").read_text()
    # Again: the same URL's driver works, so nothing is fetched, and it still says unverified.
    (tmp_path / "provenance").unlink()
    again = run_bash(tmp_path, script, stubs={**stubs, "curl": "return 99"}, env=env)
    assert again.returncode == 0, again.stderr
    assert "its download was NOT verified" in again.stdout
    assert "nvidia-driver.verified=no" in (tmp_path / "provenance").read_text()


# -- the Go-templated kubeadm config ------------------------------------------------------------

TEMPLATE = """\
apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
nodeRegistration:
  criSocket: "{{ .CriSocket }}"
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
clusterName: "{{ .ClusterName }}"
kubernetesVersion: "{{ .KubernetesVersion }}"
controlPlaneEndpoint: "{{ .ControlPlaneEndpoint }}:6443"
"""


def _kubeadm_doc(extra: str = "", runtime: str = "containerd", name: str = "aws_kubeadm_example") -> str:
    return holodeck(
        f"  containerRuntime: {{install: true, name: {runtime}}}\n"
        "  kubernetes:\n    install: true\n    release: {version: v1.33.2}\n"
        f"    kubeAdmConfigContent: {json.dumps(TEMPLATE)}\n" + extra,
        name=name,
    )


def _init_config(text: str) -> list[dict[str, object]]:
    spec = load_document(text).spec
    assert spec.cluster is not None
    node = NodeContext(
        "control-plane", facts_for("ubuntu-22.04"), cluster=context_for(spec.cluster, Position.INIT)
    )
    step = render(spec, node).step("kubeadm-init")
    assert step is not None
    return list(yaml.safe_load_all(step.env["TETHER_KUBEADM_CONFIG"]))


def test_the_four_placeholders_are_filled_in_for_the_init_node() -> None:
    init, cluster = _init_config(_kubeadm_doc("  cluster: {controlPlane: {count: 1}, workers: {count: 2}}\n"))
    assert init["nodeRegistration"] == {"criSocket": "unix:///run/containerd/containerd.sock"}
    assert cluster["clusterName"] == "aws-kubeadm-example"  # the DNS-safe form of the name
    assert cluster["kubernetesVersion"] == "v1.33.2"
    assert cluster["controlPlaneEndpoint"] == "@ADVERTISE_ADDRESS@:6443"  # the init script fills it in


def test_with_an_ha_endpoint_holodecks_host_and_port_is_the_endpoint() -> None:
    ha = (
        "  cluster:\n    controlPlane: {count: 3}\n"
        "    highAvailability: {enabled: true, endpoint: 'lb.example.com:8443'}\n"
    )
    _, cluster = _init_config(_kubeadm_doc(ha, runtime="crio"))
    assert cluster["controlPlaneEndpoint"] == "lb.example.com:8443"  # "{{ .ControlPlaneEndpoint }}:6443"


def test_with_ha_and_no_endpoint_it_is_the_local_load_balancer() -> None:
    ha = "  cluster:\n    controlPlane: {count: 3}\n    highAvailability: {enabled: true}\n"
    _, cluster = _init_config(_kubeadm_doc(ha))
    spec = load_document(_kubeadm_doc(ha)).spec.cluster
    assert spec is not None
    local = context_for(spec, Position.INIT).ha_endpoint  # each node's own load balancer
    assert local and cluster["controlPlaneEndpoint"] == local


def test_the_placeholder_alone_is_the_host() -> None:
    ha = "    highAvailability: {enabled: true, endpoint: 'lb.example.com:8443'}\n"
    text = _kubeadm_doc("  cluster:\n    controlPlane: {count: 3}\n" + ha)
    text = text.replace("{{ .ControlPlaneEndpoint }}:6443", "{{ .ControlPlaneEndpoint }}:443")
    _, cluster = _init_config(text)
    assert cluster["controlPlaneEndpoint"] == "lb.example.com:443"


def test_the_runtime_decides_the_cri_socket() -> None:
    init, _ = _init_config(_kubeadm_doc("  cluster: {controlPlane: {count: 1}}\n", runtime="docker"))
    assert init["nodeRegistration"] == {"criSocket": "unix:///run/cri-dockerd.sock"}


def test_the_generated_config_uses_the_dns_safe_cluster_name() -> None:
    text = holodeck("  containerRuntime: {install: true}\n  kubernetes: {install: true}\n"
                    "  cluster: {controlPlane: {count: 1}}\n", name="draKind")  # fmt: skip
    docs = _init_config(text)
    assert any(d.get("clusterName") == "drakind" for d in docs)
