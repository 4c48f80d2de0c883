"""Loading and validating Environment documents: holodeck's verbatim, tether's own, and the
problems (all of them at once, each with its field path)."""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import pytest

from tether.controller.cli import commands
from tether.controller.limits import MAX_DOCUMENT_BYTES
from tether.controller.spec import SpecError, inline_local_files, load_document

HOLODECK = """\
apiVersion: holodeck.nvidia.com/v1alpha1
kind: Environment
metadata:
  name: holodeck-aws-e2e
  description: "end-to-end test infrastructure"
spec:
  provider: aws
  auth:
    keyName: cnt-ci
    privateKey: /home/runner/.cache/key
  instance:
    type: g4dn.xlarge
    region: us-west-1
    ingressIpRanges: ["18.190.12.32/32"]
    image:
      architecture: amd64
  containerRuntime:
    install: true
    name: containerd
    version: 1.7.27
  nvidiaContainerToolkit:
    install: true
    enableCDI: true
  nvidiaDriver:
    install: true
    branch: "570"
  kubernetes:
    install: true
    installer: kubeadm
    version: v1.31.1
    K8sFeatureGates: ["DynamicResourceAllocation=true"]
    crictlVersion: v1.31.1
    calicoVersion: v3.28.0
"""


def problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as err:
        load_document(text)
    return err.value.problems


def test_holodeck_document_loads_verbatim_with_notes() -> None:
    loaded = load_document(HOLODECK)
    spec = loaded.spec
    assert loaded.api_version == "holodeck.nvidia.com/v1alpha1"
    assert spec.runtime.version == "1.7.27" and spec.driver.branch == "570"
    assert spec.kubernetes.version == "v1.31.1" and spec.kubernetes.installer == "kubeadm"
    assert spec.kubernetes.crictl_version == "v1.31.1" and spec.kubernetes.calico_version == "v3.28.0"
    assert "spec.instance.type: ignored: tether adopts machines that exist" in loaded.notes
    assert "spec.auth.keyName: ignored: tether adopts machines that exist" in loaded.notes
    assert any(n.startswith("spec.kubernetes.version: deprecated alias") for n in loaded.notes)
    json.dumps(loaded.normalized)  # JSON-serialisable


def test_tether_api_version_gives_the_same_model() -> None:
    tether = HOLODECK.replace("holodeck.nvidia.com/v1alpha1", "tether.dev/v1alpha1")
    assert load_document(tether).spec == load_document(HOLODECK).spec


def test_capitalized_and_lower_keys_are_the_same_field() -> None:
    both = HOLODECK.replace("    installer: kubeadm\n", "    installer: kubeadm\n    Installer: kind\n")
    assert problems(both) == ["spec.kubernetes.Installer: given twice (also as 'installer')"]


def test_every_problem_at_once_with_paths() -> None:
    bad = (
        HOLODECK.replace("v1.31.1\n    K8s", "v1.31.1; reboot\n    K8s")
        .replace("name: containerd", "name: podman")
        .replace('branch: "570"', "branch: 57x")
        .replace("enableCDI: true", "enableCDI: yes-please")
        + "  customTemplates:\n    - {name: Bad_Name, inline: 'x', env: {'1A': v}}\n"
        + "  cluster:\n    controlPlane: {count: 2, labels: {'bad key!': v}}\n"
        + "    highAvailability: {enabled: true, etcdTopology: external}\n"
        + "  bogus: 1\n"
    )
    found = problems(bad)
    expected_prefixes = [
        "spec.kubernetes.version: not a version",
        "spec.containerRuntime.name: must be one of containerd, docker, crio",
        "spec.nvidiaDriver.branch: not a driver branch",
        "spec.nvidiaContainerToolkit.enableCDI: must be true or false",
        "spec.customTemplates[0].name: lowercase",
        "spec.customTemplates[0].env.1A: not a valid environment variable name",
        "spec.cluster.controlPlane.labels.bad key!: not a Kubernetes label key",
        "spec.cluster.controlPlane.count: must be odd",
        "spec.cluster.highAvailability.etcdTopology: external etcd is not supported",
        "spec.cluster.highAvailability.enabled: high availability needs controlPlane.count >= 3",
    ]
    for prefix in expected_prefixes:
        assert any(p.startswith(prefix) for p in found), (prefix, found)
    assert not any(p.startswith("spec.bogus") for p in found)  # holodeck's apiVersion: a note (issue 14)
    # HA without an endpoint: every node runs its own load balancer (issue 14), a note.
    assert not any(p.startswith("spec.cluster.highAvailability.endpoint") for p in found)
    assert all(p.split(":", 1)[0].startswith(("spec.", "metadata.")) for p in found)


def test_top_level_problems() -> None:
    found = problems("apiVersion: v1\nkind: Pod\nmetadata: {name: UPPER}\nspec: {}\n")
    assert [p.split(":")[0] for p in found] == ["apiVersion", "kind", "metadata.name"]
    assert problems("[1, 2]") == ["document: expected a mapping with apiVersion, kind, metadata and spec"]
    assert problems("a: [")[0].startswith("document: not valid YAML")


def _doc(body: str) -> str:
    return "apiVersion: tether.dev/v1alpha1\nkind: Environment\nmetadata: {name: t}\nspec:\n" + body


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (
            "  containerRuntime: {install: true, version: '1.7', package: {version: '1.6'}}\n",
            "spec.containerRuntime.version: conflicts",
        ),
        (
            "  nvidiaDriver: {install: true, source: runfile}\n",
            "spec.nvidiaDriver.runfile: required when source is runfile",
        ),
        (
            "  nvidiaDriver: {install: true, source: runfile,\n"
            "    runfile: {url: 'http://x/y.run', checksum: 'sha256:00'}}\n",
            "spec.nvidiaDriver.runfile.url: must be an https",
        ),
        (
            "  containerRuntime: {install: true, source: git}\n",
            "spec.containerRuntime.git: required when source is git",
        ),
        (
            "  nvidiaContainerToolkit: {install: true, package: {channel: nightly}}\n",
            "spec.nvidiaContainerToolkit.package.channel: must be one of stable, experimental",
        ),
        (
            "  kubernetes: {install: true, Installer: microk8s, source: git, git: {ref: main}}\n",
            "spec.kubernetes.source: microk8s installs",
        ),
        (
            "  kubernetes: {install: true, Installer: kind}\n"
            "  containerRuntime: {install: true, name: crio}\n",
            "spec.containerRuntime.name: kind runs its nodes in docker",
        ),
        (
            "  kubernetes: {install: true, Installer: kind, K8sFeatureGates: [A=true]}\n",
            "spec.kubernetes.K8sFeatureGates: only used with the kubeadm installer",
        ),
        (
            "  kubernetes: {install: true, kubeAdmConfig: ./kubeadm.yaml}\n",
            "spec.kubernetes.kubeAdmConfig: a file on the operator's machine",
        ),
        (
            "  kubernetes: {install: true, kubeAdmConfigContent: 'version: {{ .Version }}'}\n",
            "spec.kubernetes.kubeAdmConfigContent: line 1: '{{ .Version }}' is a Go-template action",
        ),
        (
            "  kubernetes: {install: true, release: {version: v1.20.1}}\n",
            "spec.kubernetes.release.version: releases before v1.24",
        ),
        ("  cluster: {workers: {count: 2}}\n", "spec.cluster: a cluster needs kubernetes.install: true"),
        (
            "  customTemplates: [{name: a, inline: x}, {name: a, inline: y}]\n",
            "spec.customTemplates[1].name: duplicate",
        ),
        (
            "  customTemplates: [{name: a, url: 'https://e.com/x.sh'}]\n",
            "spec.customTemplates[0].checksum: required with url",
        ),
        (
            "  customTemplates: [{name: a, inline: x, url: 'https://e.com/x.sh', checksum: 'sha256:"
            + "0" * 64
            + "'}]\n",
            "spec.customTemplates[0]: exactly one of inline, file or url",
        ),
        (
            "  customTemplates: [{name: a, inline: x, checksum: 'sha256:" + "0" * 64 + "'}]\n",
            "spec.customTemplates[0].checksum: does not match",
        ),
        (
            "  customTemplates: [{name: a, inline: x, timeout: 0}]\n",
            "spec.customTemplates[0].timeout: must be a whole number",
        ),
        (
            "  customTemplates: [{name: a, inline: x, env: {PATH: /tmp}}]\n",
            "spec.customTemplates[0].env.PATH: reserved name",
        ),
        (
            "  customTemplates: [{name: a, inline: x, roles: [master]}]\n",
            "spec.customTemplates[0].roles[0]: must be one of",
        ),
        (
            "  packageRepositories: {apt: [{url: 'https://a/d', key: 'https://a/k', trusted: true}]}\n",
            "spec.packageRepositories.apt[0].trusted: give either key",
        ),
        (
            "  packageRepositories: {apt: [{url: 'https://a/d', suite: jammy, trusted: true}]}\n",
            "spec.packageRepositories.apt[0].components: required with a suite",
        ),
        (
            "  packageRepositories: {dnf: [{url: 'https://a/r', key: 'not a key'}]}\n",
            "spec.packageRepositories.dnf[0].key: not a plain",
        ),
        ("  downloadMirror: 'ftp://mirror'\n", "spec.downloadMirror: not a plain http(s) URL"),
    ],
)
def test_rules(body: str, problem: str) -> None:
    found = problems(_doc(body))
    assert any(p.startswith(problem) for p in found), found


def test_cluster_is_parsed() -> None:
    body = (
        "  kubernetes: {install: true}\n  cluster:\n    region: us-west-2\n"
        "    controlPlane: {count: 3, dedicated: true, instanceType: m5.xlarge, labels: {tier: cp}}\n"
        "    workers: {count: 4, labels: {nvidia.com/gpu.present: 'true'}}\n"
        "    highAvailability: {enabled: true, endpoint: 'lb.example.com:6443', loadBalancerType: nlb}\n"
    )
    loaded = load_document(_doc(body))
    cluster = loaded.spec.cluster
    assert cluster is not None and cluster.control_plane.count == 3 and cluster.control_plane.dedicated
    assert cluster.workers.labels == {"nvidia.com/gpu.present": "true"}
    assert cluster.high_availability.endpoint == "lb.example.com:6443"
    assert "spec.cluster.region: ignored: tether adopts machines that exist" in loaded.notes


def test_repositories_and_mirror() -> None:
    key = "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmQINBF==\n-----END PGP PUBLIC KEY BLOCK-----\n"
    body = (
        "  downloadMirror: 'http://10.0.0.1:8080/m/'\n  packageRepositories:\n"
        "    apt: [{url: 'http://10.0.0.1/debs', trusted: true}]\n"
        f"    dnf: [{{url: 'https://r/el9', key: {json.dumps(key)}}}]\n"
    )
    spec = load_document(_doc(body)).spec
    assert spec.download_mirror == "http://10.0.0.1:8080/m"
    assert spec.package_repositories.apt[0].suite == "./" and spec.package_repositories.apt[0].trusted
    assert spec.package_repositories.dnf[0].key == key


def test_inline_local_files_resolves_against_the_yaml_directory(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    script = "echo from-a-file\n"
    (tmp_path / "scripts" / "s.sh").write_text(script)
    (tmp_path / "kubeadm.yaml").write_text("kind: ClusterConfiguration\n")
    sha = hashlib.sha256(script.encode()).hexdigest()
    text = _doc(
        f"  customTemplates: [{{name: a, file: scripts/s.sh, checksum: 'sha256:{sha}'}}]\n"
        "  kubernetes: {install: true, kubeAdmConfig: kubeadm.yaml}\n"
    )
    spec = load_document(inline_local_files(text, tmp_path)).spec
    assert spec.custom_templates[0].inline == script
    assert spec.kubernetes.kubeadm_config == "kind: ClusterConfiguration\n"
    unchanged = _doc("  kernel: {version: 6.1.0-1-amd64}\n")
    assert inline_local_files(unchanged, tmp_path) == unchanged


def test_inline_local_files_reports_every_bad_file(tmp_path: Path) -> None:
    (tmp_path / "s.sh").write_text("echo\n")
    text = _doc(
        "  customTemplates:\n    - {name: a, file: missing.sh}\n"
        f"    - {{name: b, file: s.sh, checksum: 'sha256:{'0' * 64}'}}\n    - {{name: c, file: ../x.sh}}\n"
    )
    with pytest.raises(SpecError) as err:
        inline_local_files(text, tmp_path)
    paths = [p.split(":")[0] for p in err.value.problems]
    assert paths == [
        "spec.customTemplates[0].file",
        "spec.customTemplates[1].checksum",
        "spec.customTemplates[2].file",
    ]


def test_cli_validate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "env.yaml"
    good.write_text(HOLODECK)
    assert (
        commands.env_validate(argparse.Namespace(file=str(good), max_document_bytes=MAX_DOCUMENT_BYTES)) == 0
    )
    assert capsys.readouterr().out == "valid\n"
    bad = tmp_path / "bad.yaml"
    bad.write_text(HOLODECK.replace("name: containerd", "name: podman").replace('branch: "570"', "branch: x"))
    assert (
        commands.env_validate(argparse.Namespace(file=str(bad), max_document_bytes=MAX_DOCUMENT_BYTES)) == 1
    )
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(line.startswith("spec.") for line in lines)


def test_cli_render_writes_numbered_steps(tmp_path: Path) -> None:
    env = tmp_path / "env.yaml"
    env.write_text(HOLODECK)
    out = tmp_path / "out"
    args = argparse.Namespace(
        file=str(env), os="rocky-9", gpu=False, arch="amd64", role="worker", out=str(out)
    )
    assert commands.env_render(args) == 0
    assert sorted(p.name for p in out.iterdir()) == ["01-preflight.sh", "02-containerd.sh", "03-kubeadm.sh"]
