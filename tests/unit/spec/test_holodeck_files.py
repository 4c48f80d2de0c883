"""holodeck's own Environment files validate (issue 14, classes 2-7): unknown fields, names, the
kind config's path, a runfile without a checksum, the Go-templated kubeadm config and several
YAML documents in one file. Each class under holodeck's apiVersion, and tether's own kept strict."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tether.controller.cli import commands
from tether.controller.limits import MAX_DOCUMENT_BYTES, MAX_YAML_NODES
from tether.controller.spec import SpecError, inline_local_files, kubeadm_template, load_document, names

HOLODECK = "holodeck.nvidia.com/v1alpha1"
TETHER = "tether.dev/v1alpha1"


def doc(body: str, *, api: str = HOLODECK, name: str = "h") -> str:
    return f"apiVersion: {api}\nkind: Environment\nmetadata:\n  name: {name}\nspec:\n{body}"


def problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as err:
        load_document(text)
    return [str(p) for p in err.value.problems]


# -- class 2: unknown fields ------------------------------------------------------------------

UNKNOWN = (
    "  kubernetes:\n    install: true\n    installer: kubeadm\n    kubernetesVersion: v1.31.1\n"
    "  nvidiaDriver: {install: true, colour: green}\n"
    "  futureField: {a: 1}\n"
)


def test_an_unknown_field_under_holodecks_api_version_is_a_note_with_its_exact_path() -> None:
    loaded = load_document(doc(UNKNOWN))
    assert "spec.kubernetes.kubernetesVersion: ignored: not a holodeck field tether knows" in loaded.notes
    assert "spec.nvidiaDriver.colour: ignored: not a holodeck field tether knows" in loaded.notes
    assert "spec.futureField: ignored: not a holodeck field tether knows" in loaded.notes
    assert loaded.spec.kubernetes.version != "v1.31.1"  # ignored, as holodeck ignores it


def test_an_unknown_top_level_field_under_holodecks_api_version_is_a_note() -> None:
    loaded = load_document(doc("  kernel: {version: 6.8.0-1015-aws}\n") + "extra: 1\n")
    assert "extra: ignored: not a holodeck field tether knows" in loaded.notes


def test_an_unknown_field_under_tethers_api_version_stays_an_error() -> None:
    found = problems(doc(UNKNOWN, api=TETHER))
    assert "spec.kubernetes.kubernetesVersion: unknown field" in found
    assert "spec.nvidiaDriver.colour: unknown field" in found
    assert "spec.futureField: unknown field" in found


def test_a_typo_inside_tethers_own_extensions_stays_an_error_under_holodecks_api_version() -> None:
    found = problems(doc("  rollout: {maxParalel: 2}\n  hardware: {gpus: {count: 1, speed: 9}}\n"))
    assert "spec.rollout.maxParalel: unknown field" in found
    assert "spec.hardware.gpus.speed: unknown field" in found


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ("  Rollout: {maxParalel: 2}\n", "spec.Rollout.maxParalel"),
        ("  HARDWARE: {gpus: {count: 1, speed: 3}}\n", "spec.HARDWARE.gpus.speed"),
        ("  hardware: {GPUs: {count: 1, Speed: 3}}\n", "spec.hardware.GPUs.Speed"),
        ("  PackageRepositories: {apt: [], yum: []}\n", "spec.PackageRepositories.yum"),
    ],
)
def test_tethers_own_extensions_stay_strict_in_any_case(body: str, path: str) -> None:
    # Keys match in any case, so spec.Rollout is spec.rollout: a typo in it is still an error.
    assert problems(doc(body)) == [f"{path}: unknown field"]


def test_the_whole_spec_in_another_case_keeps_the_extensions_strict() -> None:
    text = doc("").replace("spec:\n", "Spec:\n  rollout: {maxParalel: 2}\n")
    assert problems(text) == ["Spec.rollout.maxParalel: unknown field"]


def test_a_key_with_a_dot_is_quoted_in_its_path() -> None:
    loaded = load_document(doc("  kubernetes: {install: true, a.b: 1}\n  rollout.x: 1\n"))
    assert 'spec.kubernetes["a.b"]: ignored: not a holodeck field tether knows' in loaded.notes
    # Not inside spec.rollout (a note under holodeck's apiVersion, not a typo in tether's extension).
    assert 'spec["rollout.x"]: ignored: not a holodeck field tether knows' in loaded.notes
    found = problems(doc("  kubernetes: {install: true, 'a.b': 1, 'c[0]': 2}\n", api=TETHER))
    assert found == ['spec.kubernetes["a.b"]: unknown field', 'spec.kubernetes["c[0]"]: unknown field']


def test_a_bad_value_of_a_known_field_is_still_a_problem_under_holodecks_api_version() -> None:
    found = problems(doc("  containerRuntime: {install: true, name: podman}\n  bogus: 1\n"))
    assert [p.split(":")[0] for p in found] == ["spec.containerRuntime.name"]


# -- class 3: names ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "dns"),
    [
        ("aws_kubeadm_example", "aws-kubeadm-example"),
        ("draKind", "drakind"),
        ("holodeck.v2", "holodeck-v2"),
        ("a--b", "a--b"),
        ("lab", "lab"),
        ("Z_", "z"),
    ],
)
def test_holodecks_names_are_accepted_with_their_dns_safe_form(name: str, dns: str) -> None:
    loaded = load_document(doc("  kernel: {version: 6.8.0-1015-aws}\n", name=name))
    assert loaded.spec.name == name  # the key stays the name as written
    assert loaded.spec.dns_name == dns == names.dns_name(name)
    assert loaded.normalized["metadata"]["name"] == name
    noted = [n for n in loaded.notes if n.startswith("metadata.name:")]
    assert len(noted) == (dns != name)
    if dns != name:
        assert repr(dns) in noted[0] and "DNS name" in noted[0]


def test_a_long_name_has_a_dns_label_that_keeps_it_apart() -> None:
    one, two = "A" * 200 + "_one", "A" * 200 + "_two"
    assert names.dns_name(one) != names.dns_name(two)
    for name in (one, two):
        dns = names.dns_name(name)
        assert len(dns) <= 63 and names.DNS_LABEL_RE.fullmatch(dns), dns
    load_document(doc("  kernel: {version: 6.8.0-1015-aws}\n", name="a" * 253))


@pytest.mark.parametrize(
    "name",
    ["'a b'", "a/b", "'a\\\\b'", "'-a'", "'.hidden'", "'..'", "'a\\tb'", "x" * 254, "'é'", "'a:b'", "''"],
)
def test_names_holodeck_might_take_but_tether_does_not(name: str) -> None:
    found = problems(doc("  kernel: {version: 6.8.0-1015-aws}\n", name=name))
    assert [p.split(":")[0] for p in found] == ["metadata.name"], found
    assert "at most 253 characters" in found[0]


@pytest.mark.parametrize("name", ["aws_kubeadm_example", "draKind", "a.b"])
def test_tethers_api_version_keeps_the_dns_label_rule(name: str) -> None:
    found = problems(doc("  kernel: {version: 6.8.0-1015-aws}\n", api=TETHER, name=name))
    assert found == ["metadata.name: required: lowercase letters, digits and '-', at most 63 characters"]


def test_an_admin_scope_takes_holodecks_names() -> None:
    from tether.controller.admins import parse_environments

    assert parse_environments("draKind,aws_kubeadm_example") == ["aws_kubeadm_example", "draKind"]
    with pytest.raises(Exception, match="not an environment name"):
        parse_environments("a b/c")


# -- class 4: the kind config's path ------------------------------------------------------------

KIND = "  kubernetes:\n    install: true\n    installer: kind\n    kindConfig: ./examples/kind.yaml\n"
KIND_YAML = "kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\nnodes: [{role: control-plane}]\n"


def test_a_kind_config_beside_the_file_is_read_from_there(tmp_path: Path) -> None:
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "kind.yaml").write_text(KIND_YAML)
    notes: list[str] = []
    text = inline_local_files(doc(KIND), tmp_path, cwd=tmp_path / "elsewhere", notes=notes)
    assert load_document(text).spec.kubernetes.kind_config == KIND_YAML
    assert notes == [f"spec.kubernetes.kindConfig: read {tmp_path}/examples/kind.yaml (beside the YAML file)"]


def test_a_kind_config_in_the_working_directory_is_read_from_there(tmp_path: Path) -> None:
    yaml_dir, work = tmp_path / "envs", tmp_path / "repo"
    yaml_dir.mkdir()
    (work / "examples").mkdir(parents=True)
    (work / "examples" / "kind.yaml").write_text(KIND_YAML)
    notes: list[str] = []
    text = inline_local_files(doc(KIND), yaml_dir, cwd=work, notes=notes)
    assert load_document(text).spec.kubernetes.kind_config == KIND_YAML
    assert notes == [
        f"spec.kubernetes.kindConfig: read {work}/examples/kind.yaml "
        "(from the working directory: not beside the YAML file)"
    ]


def test_beside_the_file_wins_over_the_working_directory(tmp_path: Path) -> None:
    for where, text in (("envs", KIND_YAML), ("repo", "kind: Cluster\n")):
        (tmp_path / where / "examples").mkdir(parents=True)
        (tmp_path / where / "examples" / "kind.yaml").write_text(text)
    out = inline_local_files(doc(KIND), tmp_path / "envs", cwd=tmp_path / "repo")
    assert load_document(out).spec.kubernetes.kind_config == KIND_YAML


def test_a_kind_config_in_neither_place_names_both(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as err:
        inline_local_files(doc(KIND), tmp_path / "envs", cwd=tmp_path / "repo")
    (line,) = err.value.problems
    assert line.startswith("spec.kubernetes.kindConfig: cannot read ./examples/kind.yaml: neither beside")
    assert str(tmp_path / "envs") in line and str(tmp_path / "repo") in line


def test_cli_validate_and_render_from_a_fresh_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = tmp_path / "holodeck"
    (repo / "examples").mkdir(parents=True)
    (repo / "examples" / "kind.yaml").write_text(KIND_YAML)
    (repo / "examples" / "aws_kind.yaml").write_text(
        doc(KIND + "  containerRuntime: {install: true, name: docker}\n  unknownThing: 1\n", name="aws_kind")
    )
    monkeypatch.chdir(repo)  # holodeck's examples are run from the repository's root
    args = argparse.Namespace(file="examples/aws_kind.yaml", max_document_bytes=MAX_DOCUMENT_BYTES)
    assert commands.env_validate(args) == 0
    out = capsys.readouterr()
    assert out.out == "valid\n"
    assert (
        f"note: spec.kubernetes.kindConfig: read {Path.cwd()}/examples/kind.yaml "
        "(from the working directory: not beside the YAML file)\n" in out.err
    )
    assert "note: spec.unknownThing: ignored: not a holodeck field tether knows\n" in out.err
    assert "note: metadata.name: 'aws_kind' is 'aws-kind' where a DNS name is needed" in out.err
    render = argparse.Namespace(
        file="examples/aws_kind.yaml", role="control-plane", os="ubuntu-22.04", gpu=True, arch="amd64", out=""
    )
    assert commands.env_render(render) == 0
    out = capsys.readouterr()
    assert "TETHER_KIND_CONFIG=" in out.out and "(from the working directory" in out.err


# -- class 5: a runfile without a checksum ------------------------------------------------------

RUNFILE = (
    "  nvidiaDriver:\n    install: true\n    source: runfile\n    runfile:\n"
    "      url: https://us.download.nvidia.com/tesla/560.35.03/NVIDIA-Linux-x86_64-560.35.03.run\n"
)


def test_a_runfile_without_a_checksum_loads_under_holodecks_api_version_with_a_loud_note() -> None:
    loaded = load_document(doc(RUNFILE))
    assert loaded.spec.driver.source == "runfile" and loaded.spec.driver.runfile_sha256 == ""
    (note,) = [n for n in loaded.notes if n.startswith("spec.nvidiaDriver.runfile.checksum:")]
    assert "WARNING" in note and "NOT verified" in note


def test_a_runfile_without_a_checksum_is_refused_under_tethers_api_version() -> None:
    assert problems(doc(RUNFILE, api=TETHER)) == ["spec.nvidiaDriver.runfile.checksum: required"]
    empty = RUNFILE + "      checksum: ''\n"
    assert problems(doc(empty, api=TETHER)) == ["spec.nvidiaDriver.runfile.checksum: required"]


def test_a_malformed_checksum_is_refused_under_either_api_version() -> None:
    bad = RUNFILE + "      checksum: sha256:00\n"
    for api in (HOLODECK, TETHER):
        (line,) = problems(doc(bad, api=api))
        assert line.startswith("spec.nvidiaDriver.runfile.checksum: must be sha256:")


# -- class 6: the Go-templated kubeadm config ---------------------------------------------------

# holodeck's examples/kubeadm-config.yaml, as its docs describe it.
KUBEADM_TEMPLATE = """\
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
nodeRegistration:
  criSocket: "{{ .CriSocket }}"
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
clusterName: "{{.ClusterName}}"
kubernetesVersion: "{{  .KubernetesVersion }}"
controlPlaneEndpoint: "{{ .ControlPlaneEndpoint	}}:6443"
"""


def _kubeadm(content: str, api: str = HOLODECK) -> str:
    import json

    return doc(
        f"  kubernetes:\n    install: true\n    kubeAdmConfigContent: {json.dumps(content)}\n", api=api
    )


def test_holodecks_four_placeholders_are_accepted_under_either_api_version() -> None:
    for api in (HOLODECK, TETHER):
        assert (
            load_document(_kubeadm(KUBEADM_TEMPLATE, api)).spec.kubernetes.kubeadm_config == KUBEADM_TEMPLATE
        )


@pytest.mark.parametrize(
    ("line", "action"),
    [
        ("version: {{ .Version }}", "{{ .Version }}"),
        ("{{ if .IsUbuntu }}x{{ end }}", "{{ if .IsUbuntu }}"),
        ("gates: {{ range .ParsedFeatureGates }}", "{{ range .ParsedFeatureGates }}"),
        ('name: "{{- .ClusterName -}}"', "{{- .ClusterName -}}"),
        ('name: {{ .ClusterName | printf "%q" }}', '{{ .ClusterName | printf "%q" }}'),
        ("name: {{ .ClusterName", "{{ .ClusterName"),
        ("x: {{ .criSocket }}", "{{ .criSocket }}"),
    ],
)
def test_any_other_template_action_is_refused_with_its_path_and_line(line: str, action: str) -> None:
    found = problems(_kubeadm(KUBEADM_TEMPLATE + line + "\n"))
    assert found == [
        f"spec.kubernetes.kubeAdmConfigContent: line 12: {action!r} is a Go-template action tether does "
        "not run; only {{ .CriSocket }}, {{ .ClusterName }}, {{ .KubernetesVersion }}, "
        "{{ .ControlPlaneEndpoint }} are filled in"
    ]


def test_expand_fills_exactly_the_four() -> None:
    values = {
        "CriSocket": "unix:///s",
        "ClusterName": "c",
        "KubernetesVersion": "v1.33.0",
        "ControlPlaneEndpoint": "h",
    }
    out = kubeadm_template.expand(KUBEADM_TEMPLATE, values)
    assert '"unix:///s"' in out and 'clusterName: "c"' in out and '"v1.33.0"' in out and '"h:6443"' in out
    assert "{{" not in out
    lb = kubeadm_template.expand(KUBEADM_TEMPLATE, values, endpoint="apiserver.tether.internal:7443")
    assert 'controlPlaneEndpoint: "apiserver.tether.internal:7443"' in lb  # holodeck's ":6443" included


def test_a_kind_config_with_template_actions_is_still_refused() -> None:
    text = doc(
        "  kubernetes:\n    install: true\n    installer: kind\n    kindConfigContent: 'a: {{ .X }}'\n"
    )
    (line,) = problems(text)
    assert line.startswith("spec.kubernetes.kindConfigContent: holodeck does not expand Go templates")


def test_a_templated_kubeadm_config_file_is_inlined_and_validated(tmp_path: Path) -> None:
    (tmp_path / "kubeadm-config.yaml").write_text(KUBEADM_TEMPLATE)
    text = doc("  kubernetes:\n    install: true\n    kubeAdmConfig: kubeadm-config.yaml\n")
    loaded = load_document(inline_local_files(text, tmp_path))
    assert loaded.spec.kubernetes.kubeadm_config == KUBEADM_TEMPLATE


# -- class 7: several YAML documents in one file ------------------------------------------------

CONFIGMAP = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: extra}\ndata: {a: b}\n"
ENV = doc("  kernel: {version: 6.8.0-1015-aws}\n", name="multi")


def test_a_stream_with_one_environment_loads_it_and_names_the_others() -> None:
    loaded = load_document(f"{CONFIGMAP}---\n{ENV}---\n- a list\n")
    assert loaded.spec.name == "multi" and loaded.spec.kernel is not None
    assert loaded.notes[0] == (
        "document: the file holds 3 documents; document 2 is the Environment, ignored: "
        "document 1 (kind ConfigMap), document 3 (not a mapping) (WARNING: the other documents are "
        "stored with the Environment and shown by `tetherctl env get -o yaml`: keep no credentials in them)"
    )


def test_a_leading_separator_and_an_empty_document_are_not_documents() -> None:
    loaded = load_document(f"# comment\n---\n{ENV}---\n")
    assert not any(n.startswith("document:") for n in loaded.notes)


def test_a_stream_without_an_environment_names_every_document() -> None:
    assert problems(f"{CONFIGMAP}---\nfoo: 1\n") == [
        "document: the file holds 2 documents and none is an Environment: "
        "document 1 (kind ConfigMap), document 2 (no kind)"
    ]


def test_a_stream_with_two_environments_is_refused() -> None:
    assert problems(f"{ENV}---\n{CONFIGMAP}---\n{ENV}") == [
        "document: the file holds 3 documents and 2 are Environments (documents 1, 3): "
        "give one Environment per file"
    ]


def test_the_environment_of_a_stream_is_validated_as_usual() -> None:
    found = problems(f"{CONFIGMAP}---\n" + doc("  kernel: {version: 'x; reboot'}\n", api=TETHER))
    assert [p.split(":")[0] for p in found] == ["spec.kernel.version"]


def test_the_yaml_limits_hold_for_the_whole_stream() -> None:
    third = MAX_YAML_NODES // 3 + 10
    filler = "items: [" + ", ".join(["1"] * third) + "]\n"
    stream = f"{filler}---\n{filler}---\n{filler}---\n{ENV}"
    (line,) = problems(stream)
    assert line == f"document: more than {MAX_YAML_NODES} nodes, aliases expanded (the limit)"


def test_local_files_of_the_environment_in_a_stream_are_inlined(tmp_path: Path) -> None:
    (tmp_path / "kind.yaml").write_text(KIND_YAML)
    env = doc("  kubernetes:\n    install: true\n    installer: kind\n    kindConfig: kind.yaml\n")
    loaded = load_document(inline_local_files(f"{CONFIGMAP}---\n{env}", tmp_path))
    assert loaded.spec.kubernetes.kind_config == KIND_YAML
    assert loaded.notes[0].startswith("document: the file holds 2 documents; document 2 is the Environment")


def test_cli_validate_of_a_stream(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "env.yaml"
    path.write_text(f"{CONFIGMAP}---\n{ENV}")
    assert (
        commands.env_validate(argparse.Namespace(file=str(path), max_document_bytes=MAX_DOCUMENT_BYTES)) == 0
    )
    out = capsys.readouterr()
    assert out.out == "valid\n"
    assert "note: document: the file holds 2 documents; document 2 is the Environment" in out.err
    path.write_text(f"{CONFIGMAP}---\n{CONFIGMAP}")
    assert (
        commands.env_validate(argparse.Namespace(file=str(path), max_document_bytes=MAX_DOCUMENT_BYTES)) == 1
    )
    assert "none is an Environment" in capsys.readouterr().out
