"""holodeck's own files through a real controller and tetherctl (issue 14, classes 2-7): run from
a fresh working directory with relative paths, ``env validate`` and ``env apply`` accept them and
show every note; a holodeck name keeps its spelling as the key and shows its DNS-safe form; two
names with the same DNS-safe form cannot both exist."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.integration.harness import BIN, Controller

KIND_YAML = "kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\n"
AWS_KIND = """\
apiVersion: holodeck.nvidia.com/v1alpha1
kind: Environment
metadata:
  name: aws_kind_example
  description: "kind from holodeck's examples"
spec:
  provider: aws
  auth: {keyName: key, privateKey: /keys/key.pem}
  instance: {type: g4dn.xlarge, region: us-west-1}
  nvidiaDriver:
    install: true
    source: runfile
    runfile: {url: 'https://us.download.nvidia.com/tesla/560.35.03/NVIDIA-Linux-x86_64-560.35.03.run'}
  containerRuntime: {install: true, name: docker}
  nvidiaContainerToolkit: {install: true}
  kubernetes:
    install: true
    installer: kind
    kindConfig: ./examples/kind.yaml
    kubernetesVersion: v1.31.1
"""


def ctl(controller: Controller, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TETHER_CONFIG": str(controller.config)}
    return subprocess.run(
        [str(BIN / "tetherctl"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=cwd,
        check=False,
    )


def test_a_holodeck_example_applies_from_its_repository_root(controller: Controller, tmp_path: Path) -> None:
    repo = tmp_path / "holodeck"
    (repo / "examples").mkdir(parents=True)
    (repo / "examples" / "kind.yaml").write_text(KIND_YAML)
    (repo / "examples" / "aws_kind.yaml").write_text("# leading comment\n---\n" + AWS_KIND)

    checked = ctl(controller, repo, "env", "validate", "-f", "examples/aws_kind.yaml")
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout == "valid\n"
    for note in (
        f"note: spec.kubernetes.kindConfig: read {repo}/examples/kind.yaml (from the working directory: "
        "not beside the YAML file)",
        "note: spec.kubernetes.kubernetesVersion: ignored: not a holodeck field tether knows",
        "note: spec.nvidiaDriver.runfile.checksum: WARNING: none given, so the runfile download is NOT "
        "verified",
        "note: metadata.name: 'aws_kind_example' is 'aws-kind-example' where a DNS name is needed",
    ):
        assert note in checked.stderr, (note, checked.stderr)

    applied = ctl(controller, repo, "env", "apply", "-f", "examples/aws_kind.yaml")
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout == (
        "environment/aws_kind_example (DNS name aws-kind-example) applied (generation 1)\n"
    )
    assert "(from the working directory: not beside the YAML file)" in applied.stderr
    assert "kubernetesVersion: ignored: not a holodeck field tether knows" in applied.stderr
    assert "runfile download is NOT verified" in applied.stderr

    got = json.loads(ctl(controller, repo, "env", "get", "aws_kind_example", "-o", "json").stdout)
    assert (got["name"], got["dns_name"]) == ("aws_kind_example", "aws-kind-example")
    listed = json.loads(ctl(controller, repo, "env", "list", "-o", "json").stdout)
    assert [(e["name"], e["dns_name"]) for e in listed] == [("aws_kind_example", "aws-kind-example")]
    table = ctl(controller, repo, "env", "list").stdout
    assert "aws_kind_example (DNS name aws-kind-example)" in table
    created = ctl(controller, repo, "token", "create", "--env", "aws_kind_example", "--role", "worker")
    assert created.returncode == 0, created.stderr  # the name as written is the key everywhere


def test_a_second_name_with_the_same_dns_safe_form_is_refused(controller: Controller, tmp_path: Path) -> None:
    for name in ("a_b", "a-b"):
        (tmp_path / f"{name}.yaml").write_text(
            f"apiVersion: holodeck.nvidia.com/v1alpha1\nkind: Environment\nmetadata: {{name: {name}}}\n"
            "spec: {kernel: {version: 6.8.0-1015-aws}}\n"
        )
    first = ctl(controller, tmp_path, "env", "apply", "-f", "a_b.yaml")
    assert first.returncode == 0, first.stderr
    for extra in ((), ("--dry-run",)):
        second = ctl(controller, tmp_path, "env", "apply", "-f", "a-b.yaml", *extra)
        assert second.returncode != 0
        assert "would have the DNS name 'a-b', which environment 'a_b' already has" in second.stderr
    again = ctl(controller, tmp_path, "env", "apply", "-f", "a_b.yaml")  # the same one: unchanged
    assert again.returncode == 0 and "unchanged" in again.stdout


def test_a_multi_document_file_applies_its_environment(controller: Controller, tmp_path: Path) -> None:
    (tmp_path / "stream.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n---\n"
        "apiVersion: holodeck.nvidia.com/v1alpha1\nkind: Environment\nmetadata: {name: stream}\n"
        "spec: {kernel: {version: 6.8.0-1015-aws}}\n"
    )
    applied = ctl(controller, tmp_path, "env", "apply", "-f", "stream.yaml")
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout == "environment/stream applied (generation 1)\n"
    assert (
        "note: document: the file holds 2 documents; document 2 is the Environment, ignored: "
        "document 1 (kind ConfigMap)" in applied.stderr
    )
    (tmp_path / "two.yaml").write_text(
        (tmp_path / "stream.yaml").read_text().replace("ConfigMap", "Environment")
    )
    refused = ctl(controller, tmp_path, "env", "apply", "-f", "two.yaml")
    assert refused.returncode == 1
    assert "2 are Environments (documents 1, 2)" in refused.stderr
