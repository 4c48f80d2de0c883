"""One test per weakness of holodeck's provisioner (inventory §8) that rendering can fix."""

from __future__ import annotations

import hashlib
import io
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.unit.render import scenarios, shellrun
from tests.unit.render.shellrun import curl_serving, run_bash
from tether.controller.render import NodeContext, downloads, render
from tether.controller.render.components import kubeadm_config
from tether.controller.render.context import target_of
from tether.controller.render.steps import RenderInput
from tether.controller.render.targets import facts_for
from tether.controller.spec import SpecError, load_document

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


# -- running rendered steps against stubs ------------------------------------------------------


def _runnable(script: str, tmp: Path, *paths: str) -> str:
    """``script`` without the library's final OS check (the test host may be any OS), with each of
    ``paths`` (system directories) moved under ``tmp``: these tests may run as root."""
    text = script.replace("\ncheck_os\n", "\n", 1)
    for path in paths:
        text = text.replace(path, f"{tmp}{path}")
    return text


def _block(body: str, first: str, last: str) -> str:
    """The lines of ``body`` from the first that starts with ``first`` through the next that starts
    with ``last``."""
    lines = body.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith(first))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith(last))
    return "".join(lines[start : end + 1])


def _calls(tmp: Path) -> str:
    path = tmp / "work" / "calls"
    return path.read_text() if path.exists() else ""


def _tgz(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _serve_published(tmp: Path, files: dict[str, bytes]) -> str:
    """A curl stub serving ``files`` and, next to each, the ``.sha256`` file upstream publishes."""
    served = dict(files)
    for url, data in files.items():
        name = url.rsplit("/", 1)[-1]
        served[url + ".sha256"] = f"{hashlib.sha256(data).hexdigest()}  {name}\n".encode()
    return curl_serving(served, tmp)


RELEASE_PINS = scenarios.HEAD + (
    "  kubernetes: {install: true, release: {version: v1.33.4}, CniPluginsVersion: v1.6.0, "
    "CrictlVersion: v1.33.0}\n"
)
VERSIONS = "1.34.0 1.33.4 1.33.0 1.6.0 1.32.0"  # what the stub repositories offer, newest first
APT_MADISON = f'for v in {VERSIONS}; do printf " %s | %s-1.1 | r\\n" "$2" "$v"; done'
DNF = (
    f'if [[ $* == *" list "* ]]; then for v in {VERSIONS}; do '
    'printf "%s.x86_64 %s-150500.1.1 kubernetes\\n" "${!#}" "$v"; done; '
    'else echo "dnf $*" >>"$TETHER_WORKDIR/calls"; fi'
)


def _release_install(os_key: str) -> str:
    """The kubeadm step's package part (repository setup stubbed out: that is another test's business)."""
    step = render(load_document(RELEASE_PINS).spec, NodeContext("worker", facts_for(os_key))).step("kubeadm")
    assert step is not None
    body = _block(scenarios.library_of(step.script)[1], "want=", "version_matches")
    return shellrun.library(os_key) + "fetch_key() { :; }\nadd_repo() { :; }\n" + body


def test_kubernetes_packages_are_moved_to_the_pin_when_another_version_is_installed(tmp_path: Path) -> None:
    """§8.11: the binaries were reinstalled only if a file was missing, so a version change never
    upgraded. apt installs exactly the pin (over holds, downgrading if need be) and holds it."""
    stubs = {
        "apt-cache": APT_MADISON,
        "apt-get": 'echo "apt-get $*" >>"$TETHER_WORKDIR/calls"',
        "apt-mark": 'echo "apt-mark $*" >>"$TETHER_WORKDIR/calls"',
        "dpkg-query": "echo 1.32.0-1.1",  # the version on the node: never consulted as a reason to stop
        "kubeadm": "echo v1.33.4",
    }
    out = run_bash(tmp_path, _release_install("ubuntu-22.04"), stubs=stubs)
    assert out.returncode == 0, out.stderr
    calls = _calls(tmp_path)
    pinned = "kubeadm=1.33.4-1.1 kubelet=1.33.4-1.1 kubectl=1.33.4-1.1"
    assert f"--allow-downgrades --allow-change-held-packages {pinned}" in calls
    assert "kubernetes-cni=1.6.0-1.1" in calls and "cri-tools=1.33.0-1.1" in calls
    assert "apt-mark hold kubeadm kubelet kubectl" in calls


def test_kubernetes_rpms_at_another_version_are_replaced_by_the_pin(tmp_path: Path) -> None:
    """§8.11 on dnf: an installed kubeadm 1.32 is replaced by the pinned 1.33.4; one at the pin is left."""
    stubs = {
        "dnf": DNF,
        "rpm": 'if [[ $2 == --qf ]]; then printf %s "$INSTALLED"; fi',
        "kubeadm": "echo v1.33.4",
    }
    script = _release_install("rocky-9")
    out = run_bash(tmp_path, script, stubs=stubs, env={"INSTALLED": "1.32.0-150500.1.1"})
    assert out.returncode == 0, out.stderr
    install = [line for line in _calls(tmp_path).splitlines() if " install " in line]
    assert any(
        "kubeadm-1.33.4-150500.1.1 kubelet-1.33.4-150500.1.1 kubectl-1.33.4-150500.1.1" in line
        for line in install
    ), install
    again = tmp_path / "again"
    again.mkdir()
    out = run_bash(again, script, stubs=stubs, env={"INSTALLED": "1.33.4-150500.1.1"})
    assert out.returncode == 0, out.stderr
    assert "kubeadm-" not in _calls(again)  # already at the pin: nothing to do


def test_kubeadm_that_does_not_match_the_pin_fails_the_step(tmp_path: Path) -> None:
    stubs = {
        "apt-cache": APT_MADISON,
        "apt-get": "true",
        "apt-mark": "true",
        "kubeadm": "echo v1.32.0",
    }
    out = run_bash(tmp_path, _release_install("ubuntu-22.04"), stubs=stubs)
    assert out.returncode == 1
    assert "kubeadm v1.32.0 is installed, but v1.33.4 was pinned" in out.stderr


def test_cni_plugins_and_crictl_follow_their_pins_on_a_source_build(tmp_path: Path) -> None:
    """§8.11: an older CNI plugins or crictl already on the node (the runtime's build puts the
    default CNI plugins there first) was kept whatever the spec pinned."""
    doc = scenarios.HEAD + (
        "  kubernetes: {install: true, source: git, git: {ref: v1.35.3}, CniPluginsVersion: v1.6.0, "
        "CrictlVersion: v1.33.0}\n"
    )
    step = render(load_document(doc).spec, NodeContext("worker", facts_for("ubuntu-22.04"))).step("kubeadm")
    assert step is not None
    lib, body = scenarios.library_of(step.script)
    # What follows the build: the CNI plugins and crictl, up to the kubelet unit.
    start = body.index("\n", body.index("provenance kubernetes.commit")) + 1
    snippet = body[start : body.index("install_file /etc/systemd/system/kubelet.service")]
    assert "crictl" in snippet and "/opt/cni/bin" in snippet
    cni = downloads.cni_plugins("v1.6.0", "amd64").url
    crictl = downloads.crictl("v1.33.0", "amd64").url
    curl = _serve_published(
        tmp_path,
        {
            cni: _tgz({"bridge": b"#!/bin/sh\necho cni v1.6.0\n"}),
            crictl: _tgz({"crictl": b"#!/bin/sh\necho crictl version v1.33.0\n"}),
        },
    )
    script = _runnable(lib + snippet, tmp_path, "/opt/cni/bin", "/usr/local/bin", "/var/lib/tether")
    for tool, version in (
        ("opt/cni/bin/bridge", "cni v1.5.0"),
        ("usr/local/bin/crictl", "crictl version v1.32.0"),
    ):
        path = tmp_path / tool
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"#!/bin/sh\necho {version}\n")
        path.chmod(0o755)
    out = run_bash(tmp_path, script, stubs={"curl": curl})
    assert out.returncode == 0, out.stderr
    fetched = (tmp_path / "work" / "fetched").read_text().split()
    assert cni in fetched and crictl in fetched
    assert subprocess.check_output([tmp_path / "opt/cni/bin/bridge"], text=True) == "cni v1.6.0\n"
    assert (
        subprocess.check_output([tmp_path / "usr/local/bin/crictl"], text=True) == "crictl version v1.33.0\n"
    )
    (tmp_path / "work" / "fetched").unlink()
    out = run_bash(tmp_path, script, stubs={"curl": curl})
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "work" / "fetched").exists()  # at the pins: a re-run fetches nothing


def test_kind_kubectl_is_pinned_not_stable_txt(tmp_path: Path) -> None:
    """§8.11: kubectl for kind came from stable.txt. It is the release's, and replaced when it differs."""
    for where, script, _ in BODIES:
        assert "stable.txt" not in script, where
    step = scenarios.plan_for("kind-release", "ubuntu-22.04").step("kind")
    assert step is not None
    url = downloads.kubectl("v1.33.1", "amd64").url
    assert url == "https://dl.k8s.io/release/v1.33.1/bin/linux/amd64/kubectl"
    block = _block(scenarios.library_of(step.script)[1], "if [[ $(kubectl version", "fi\n")
    curl = _serve_published(tmp_path, {url: b"kubectl v1.33.1"})
    stubs = {
        "curl": curl,
        "kubectl": 'printf "clientVersion:\\n  gitVersion: %s\\n" "$HAVE"',
        "install": 'echo "install $*" >>"$TETHER_WORKDIR/calls"',
    }
    out = run_bash(tmp_path, shellrun.library() + block, stubs=stubs, env={"HAVE": "v1.31.0"})
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "work" / "fetched").read_text().split()[-1] == url
    assert "/usr/local/bin/kubectl" in _calls(tmp_path)
    (tmp_path / "work" / "fetched").unlink()
    (tmp_path / "work" / "calls").unlink()
    out = run_bash(tmp_path, shellrun.library() + block, stubs=stubs, env={"HAVE": "v1.33.1"})
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "work" / "fetched").exists() and _calls(tmp_path) == ""


def test_microk8s_does_not_assume_a_user_named_ubuntu(tmp_path: Path) -> None:
    """§8.13: holodeck added the hard-coded user ubuntu to the microk8s group and wrote its kubeconfig."""
    for os_key in ("ubuntu-22.04", "rocky-9", "fedora-42", "debian-12"):
        step = scenarios.plan_for("microk8s", os_key).step("microk8s")
        assert step is not None
        body = scenarios.library_of(step.script)[1]
        assert not re.search(r"\bubuntu\b|usermod|gpasswd|/home/|\$HOME|\bsudo\b", body), os_key
    step = scenarios.plan_for("microk8s", "ubuntu-22.04").step("microk8s")
    assert step is not None
    listing = (
        "Name Version Rev Tracking Publisher Notes\\nmicrok8s v1.32.3 7 1.32/stable canonical classic\\n"
    )
    record = 'echo "$FUNCNAME $*" >>"$TETHER_WORKDIR/calls"'
    stubs = {
        "snap": f'{record}; [[ $1 != list ]] || printf "{listing}"',
        "microk8s": f'{record}; [[ $1 != config ]] || echo "kubeconfig-for-root"',
        "systemctl": record,
        "usermod": record,
        "gpasswd": record,
        "chown": record,
    }
    home = tmp_path / "home" / "ubuntu"
    home.mkdir(parents=True)
    script = _runnable(step.script, tmp_path, "/root/")
    out = run_bash(tmp_path, script, stubs=stubs, env={"HOME": str(home), "USER": "ubuntu"})
    assert out.returncode == 0, out.stderr
    calls = _calls(tmp_path)
    assert "microk8s enable gpu" in calls
    assert not re.search(r"^(usermod|gpasswd|chown) ", calls, re.M), calls
    assert (tmp_path / "root" / ".kube" / "config").read_text() == "kubeconfig-for-root\n"
    assert not any(home.iterdir())


def test_steps_that_need_root_refuse_to_run_without_it(tmp_path: Path) -> None:
    """§8.14: holodeck's kubeadm probe ran as the SSH user against root-only admin.conf, so it
    could never see the cluster. tether's steps run as root, and the plan checks that first."""
    plan = scenarios.plan_for("kubeadm-release", "ubuntu-22.04")
    names = [s.name for s in plan.steps]
    assert names[0] == "preflight" and names.index("kubeadm-init") > 0
    script = _runnable(plan.steps[0].script, tmp_path)
    stubs = {"apt-get": "true", "cloud-init": "true"}
    out = run_bash(tmp_path, script, stubs={**stubs, "id": "echo 1000"})
    assert out.returncode == 1
    assert "tether steps run as root" in out.stderr
    out = run_bash(tmp_path, script, stubs={**stubs, "id": "echo 0"})
    assert out.returncode == 0, out.stderr


def test_kubeadm_probe_reads_admin_conf_not_the_callers_home(tmp_path: Path) -> None:
    """§8.14: the early exit looks at /etc/kubernetes/admin.conf explicitly, so an initialised
    control plane is found whatever $HOME is, and kubeadm init is not run again (a single node is
    a cluster of one: its kubeadm-init hands out fresh join material and the kubeconfig instead)."""
    step = scenarios.plan_for("kubeadm-release", "ubuntu-22.04").step("kubeadm-init")
    assert step is not None
    script = _runnable(step.script, tmp_path, "/etc/kubernetes/", "/root/", "/var/lib/tether/")
    admin = tmp_path / "etc" / "kubernetes" / "admin.conf"
    admin.parent.mkdir(parents=True)
    admin.write_text("admin-kubeconfig\n")
    home = tmp_path / "home" / "someone"
    home.mkdir(parents=True)
    stubs = {
        "kubectl": f'[[ $KUBECONFIG == {admin} ]] || {{ echo "kubectl without admin.conf" >&2; return 1; }}',
        "kubeadm": (
            'echo "kubeadm $*" >>"$TETHER_WORKDIR/calls"; [[ $1 != version ]] || echo v1.33.4; '
            "[[ $1 != token ]] || echo abcdef.0123456789abcdef"
        ),
        "openssl": "cat >/dev/null; echo public-key",  # reads its pipe: no SIGPIPE upstream
    }
    env = {
        **step.env,
        "HOME": str(home),
        "TETHER_NODE_IP": "10.0.0.2",
        "TETHER_NODE": "node1",
        "TETHER_SECRETS_OUT": str(tmp_path / "secrets"),
        "TETHER_OUTPUTS": str(tmp_path / "outputs"),
    }
    out = run_bash(tmp_path, script, stubs=stubs, env=env)
    assert out.returncode == 0, out.stderr
    assert "already initialized" in out.stdout
    assert "init" not in _calls(tmp_path)
    assert (tmp_path / "root" / ".kube" / "config").read_text() == "admin-kubeconfig\n"
    assert shellrun.provenance(tmp_path)["kubernetes.server"] == "v1.33.4"
    assert "ADMIN_KUBECONFIG_B64=" in (tmp_path / "secrets").read_text()
    assert "JOIN_ENDPOINT=10.0.0.2:6443" in (tmp_path / "outputs").read_text()
    # admin.conf is there but the API server does not answer: fail loudly, never init over it.
    out = run_bash(tmp_path, script, stubs={**stubs, "kubectl": "return 1", "sleep": "true"}, env=env)
    assert out.returncode == 1
    assert "exists but the API server does not answer" in out.stderr
    assert "init" not in _calls(tmp_path)
