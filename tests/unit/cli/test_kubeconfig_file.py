"""Issue 14: ``tetherctl cluster kubeconfig`` writes holodeck's ``kubernetes.kubeConfig`` (relative to
the working directory), mode 0600, and never replaces a different file without --overwrite."""

from __future__ import annotations

from pathlib import Path

import pytest

from tether.controller.cli.client import CliError
from tether.controller.cli.cluster_cmd import spec_kubeconfig_path, write_private

HEAD = "apiVersion: holodeck.nvidia.com/v1alpha1\nkind: Environment\nmetadata: {name: e}\nspec:\n"


@pytest.mark.parametrize(
    ("kubernetes", "want"),
    [
        ("{install: true, kubeConfig: ./out/kubeconfig}", "./out/kubeconfig"),
        ("{install: true, kubeconfig: kc.yaml}", "kc.yaml"),  # holodeck's keys, any case
        ("{install: true}", ""),
        ("{install: true, kubeConfig: [a]}", ""),
    ],
)
def test_the_path_comes_from_the_document(kubernetes: str, want: str) -> None:
    assert spec_kubeconfig_path(HEAD + f"  kubernetes: {kubernetes}\n") == want


CONFIGMAP = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: extra}\ndata: {kubeConfig: other}\n"


def test_the_path_comes_from_the_environment_of_a_stored_stream() -> None:
    env = HEAD + "  kubernetes: {install: true, kubeConfig: ./out/kubeconfig}\n"
    assert spec_kubeconfig_path(f"{CONFIGMAP}---\n{env}") == "./out/kubeconfig"
    assert spec_kubeconfig_path(f"---\n{env}---\n{CONFIGMAP}") == "./out/kubeconfig"
    # Keys in any case, as the controller read them.
    assert spec_kubeconfig_path(f"{CONFIGMAP}---\n{env.replace('spec:', 'Spec:')}") == "./out/kubeconfig"


def test_no_path_from_a_stream_without_its_one_environment() -> None:
    env = HEAD + "  kubernetes: {install: true, kubeConfig: kc}\n"
    assert spec_kubeconfig_path(f"{CONFIGMAP}---\n{CONFIGMAP}") == ""
    assert spec_kubeconfig_path(f"{env}---\n{env}") == ""


@pytest.mark.parametrize("path", ["/etc/kubernetes/admin.conf", "~/.kube/config", "../../etc/x"])
def test_a_path_tether_refuses_is_an_error_naming_it_never_ignored(path: str) -> None:
    # Refused at apply since; one stored before is not written to, nor silently printed.
    with pytest.raises(CliError, match=r"spec\.kubernetes\.kubeConfig '.*': .*give --file PATH") as err:
        spec_kubeconfig_path(HEAD + f"  kubernetes: {{install: true, kubeConfig: '{path}'}}\n")
    assert repr(path) in str(err.value)


def test_no_path_in_an_odd_document() -> None:
    assert spec_kubeconfig_path("") == ""
    assert spec_kubeconfig_path("spec: [1]\n") == ""
    assert spec_kubeconfig_path(": : :\n") == ""


def test_written_0600_with_its_directories_and_never_replaced_silently(tmp_path: Path) -> None:
    path = tmp_path / "out" / "kubeconfig"
    assert write_private(path, "one\n", overwrite=False, origin="spec.kubernetes.kubeConfig") == "written to"
    assert path.read_text() == "one\n" and path.stat().st_mode & 0o777 == 0o600
    # The same content again: nothing to replace.
    assert write_private(path, "one\n", overwrite=False, origin="x") == "unchanged in"
    # Different content: refused, and the file is as it was.
    with pytest.raises(CliError, match="already exists and differs: pass --overwrite"):
        write_private(path, "two\n", overwrite=False, origin="spec.kubernetes.kubeConfig")
    assert path.read_text() == "one\n"
    assert write_private(path, "two\n", overwrite=True, origin="--file") == "replaced in"
    assert path.read_text() == "two\n" and path.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["kubeconfig"]  # no temporary left
    with pytest.raises(CliError, match="is a directory"):
        write_private(path.parent, "x", overwrite=True, origin="--file")
