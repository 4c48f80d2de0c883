"""One test per weakness of holodeck's provisioner (inventory §8) that rendering can fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from controller.render import NodeContext, render
from controller.render.components import kubeadm_config
from controller.render.context import target_of
from controller.render.steps import RenderInput
from controller.render.targets import facts_for
from controller.spec import SpecError, load_document
from tests.unit.render import scenarios
from tests.unit.render.shellrun import run_bash

ALL = [(n, o) for n, o in scenarios.cases()]


def _bodies() -> list[tuple[str, str, str]]:
    out = []
    for name, os_key in ALL:
        for step in scenarios.plan_for(name, os_key).steps:
            body = scenarios.library_of(step.script)[1] if "\ncheck_os\n" in step.script else step.script
            out.append((f"{name}/{os_key}/{step.name}", step.script, body))
    return out


BODIES = _bodies()


def test_no_tracing_anywhere() -> None:
    """§8.2.4: set -x echoed join secrets and env values into the output."""
    for where, script, _ in BODIES:
        assert not re.search(r"set -[a-z]*x|set -o xtrace|xtrace", script), where


def test_secret_env_values_are_not_echoed(tmp_path: Path) -> None:
    doc = (
        scenarios.HEAD
        + "  customTemplates:\n    - {name: s, inline: 'test -n \"$TOKEN\"', env: {TOKEN: s3cr3t-value}}\n"
    )
    step = render(load_document(doc).spec, NodeContext("worker", facts_for("ubuntu-22.04"))).steps[-1]
    out = run_bash(tmp_path, step.script, env=dict(step.env))
    assert out.returncode == 0, out.stderr
    assert "s3cr3t-value" not in out.stdout + out.stderr
    assert "s3cr3t-value" not in step.script


def test_pins_never_fall_back_to_latest() -> None:
    """§8.11: a containerd pin that failed silently installed the newest; AL2023 ignored pins."""
    for where, _, body in BODIES:
        if "want={{" in body:
            continue
        for line in body.splitlines():
            assert "|| pkg_install" not in line, where
    body = scenarios.library_of(
        scenarios.plan_for("containerd-package", "amazon-linux-2023").steps[1].script
    )[1]
    assert 'pkg_install_pinned "$want" "$name"' in body and "want=1.7.27" in body


def test_every_download_is_checked() -> None:
    """§8.11: no checksum for any download. Only the library's fetch helpers call curl."""
    for where, _, body in BODIES:
        assert not re.search(r"\b(curl|wget)\s+(-|\"?\S*:\/\/)", body), where
        for line in body.splitlines():
            if re.match(r"\s*fetch_verified ", line):
                assert len(line.split()) >= 4, where  # URL, destination and a check, always


def test_no_unauthenticated_package_sources_unless_the_spec_says_so() -> None:
    """§8.12: AllowUnauthenticated, repo_gpgcheck=0 for the toolkit."""
    for where, script, body in BODIES:
        assert "AllowUnauthenticated" not in script and "allow-unauthenticated" not in script, where
        if not where.startswith("repositories/"):
            assert "trusted=yes" not in body and "gpgcheck=0" not in body, where
    toolkit = scenarios.plan_for("toolkit-package", "rocky-9").step("nvidia-container-toolkit")
    assert toolkit is not None and "0 1\n" in toolkit.script  # packages unsigned: metadata checked


def test_trusted_repositories_need_the_spec_to_say_so() -> None:
    doc = scenarios.HEAD + "  packageRepositories:\n    apt:\n      - {url: 'http://10.0.0.1/debs'}\n"
    with pytest.raises(SpecError) as err:
        load_document(doc)
    assert err.value.problems[0].startswith("spec.packageRepositories.apt[0]: needs key")


def test_preflight_errors_are_never_ignored() -> None:
    """§8.12: --ignore-preflight-errors=all everywhere."""
    for where, script, _ in BODIES:
        assert "ignore-preflight-errors" not in script, where


def test_kernel_pin_reboots_through_the_agent_and_is_verified(tmp_path: Path) -> None:
    """§8.2.2: fixed 30s sleeps, deleting the running kernel, no check after the reboot."""
    plan = scenarios.plan_for("kernel", "ubuntu-22.04")
    kernel, verify = plan.step("kernel"), plan.step("kernel-verify")
    assert kernel is not None and kernel.reboot and verify is not None and not verify.reboot
    assert [s.name for s in plan.steps].index("kernel-verify") == [s.name for s in plan.steps].index(
        "kernel"
    ) + 1
    assert "rm " not in scenarios.library_of(kernel.script)[1] and "nohup" not in kernel.script
    out = run_bash(tmp_path, verify.script, stubs={"uname": "echo 6.1.0-old", "check_os": "true"})
    assert out.returncode == 1 and "not the pinned 6.8.0-1015-aws" in out.stderr
    out = run_bash(tmp_path, verify.script, stubs={"uname": "echo 6.8.0-1015-aws"})
    assert out.returncode == 0, out.stderr


def test_custom_template_timeout_is_on_the_step() -> None:
    """§8.9: the timeout was stored and never enforced; the agent enforces Step.timeout_seconds."""
    plan = scenarios.plan_for("custom", "ubuntu-22.04")
    step = plan.step("custom-cluster")
    assert step is not None and step.timeout_seconds == 30


def test_docker_and_crio_latest_are_implemented() -> None:
    """§8.9/§1.9: latest was accepted and failed at render time for docker and CRI-O."""
    for name in ("docker-latest", "crio-latest"):
        step = scenarios.plan_for(name, "rocky-9").steps[1]
        assert step.requested["source"] == "latest"
        assert "git_resolve" in step.script


def test_microk8s_keeps_the_other_components() -> None:
    """§8.9: microk8s reset the list, silently dropping kernel, driver and custom templates."""
    doc = (
        scenarios.HEAD + "  kernel: {version: 6.8.0-1015-aws}\n  nvidiaDriver: {install: true}\n"
        "  kubernetes: {install: true, Installer: microk8s}\n"
        "  customTemplates: [{name: pre, phase: pre-install, inline: 'true'}]\n"
    )
    names = [
        s.name
        for s in render(load_document(doc).spec, NodeContext("worker", facts_for("ubuntu-22.04"))).steps
    ]
    assert names == ["preflight", "custom-pre", "kernel", "kernel-verify", "nvidia-driver", "microk8s"]
    with pytest.raises(SpecError) as err:
        load_document(doc + "  containerRuntime: {install: true}\n")
    assert any(p.startswith("spec.containerRuntime.install: microk8s brings") for p in err.value.problems)


def test_kind_honours_the_release_version() -> None:
    """§8.9: kind used its default node image whatever the release said."""
    step = scenarios.plan_for("kind-release", "ubuntu-22.04").step("kind")
    assert step is not None and "image=kindest/node:v1.33.1" in step.script


def test_kubeadm_config_uses_release_version_not_the_legacy_field() -> None:
    """§3.7/§8.11: the config generator read only the legacy Version field."""
    doc = scenarios.HEAD + "  kubernetes: {install: true, release: {version: v1.33.4}}\n"
    spec = load_document(doc).spec
    target, _ = target_of(facts_for("ubuntu-22.04"))
    assert target is not None
    text = kubeadm_config.generate(
        RenderInput(spec, NodeContext("control-plane", facts_for("ubuntu-22.04")), target)
    )
    assert "kubernetesVersion: v1.33.4" in text


def test_components_report_what_is_installed() -> None:
    """§8.2.7: provenance was the request; every component step reports observations."""
    for where, _, body in BODIES:
        if "/custom-" in where:
            continue
        assert "provenance " in body, where


def test_writes_to_system_files_go_through_install_file() -> None:
    """§8.14: regenerated configs wiped others' settings; scripts must be idempotent."""
    for where, _, body in BODIES:
        for line in body.splitlines():
            assert not re.search(r"(>|tee )\s*/etc/", line) or "install_file" in line, (where, line)


def test_crio_policy_is_not_accept_anything_by_default() -> None:
    """§8.12: a permissive /etc/containers/policy.json on AL2023."""
    step = scenarios.plan_for("crio-package", "amazon-linux-2023").step("crio")
    assert step is not None and '"default": [{"type": "reject"}]' in step.script


def test_gpu_absent_nodes_get_no_driver_or_toolkit() -> None:
    """§10: the lspci gate for mixed clusters, decided at render time from the node's facts."""
    doc = scenarios.HEAD + "  nvidiaDriver: {install: true}\n  nvidiaContainerToolkit: {install: true}\n"
    spec = load_document(doc).spec
    gpu = [s.name for s in render(spec, NodeContext("worker", facts_for("rocky-9", gpu=True))).steps]
    cpu = [s.name for s in render(spec, NodeContext("worker", facts_for("rocky-9", gpu=False))).steps]
    assert gpu == ["preflight", "nvidia-driver", "nvidia-container-toolkit"]
    assert cpu == ["preflight"]
