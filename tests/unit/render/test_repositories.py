"""spec.packageRepositories replaces the upstream package repositories in every package step."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.unit.render import scenarios
from tests.unit.render.shellrun import curl_serving, run_bash
from tether.controller.render import NodeContext, render
from tether.controller.render.targets import facts_for
from tether.controller.spec import load_document
from tether.nodeagent.model import Plan

UPSTREAM = {
    "kubernetes": "pkgs.k8s.io",
    "docker": "download.docker.com",
    "toolkit": "nvidia.github.io",
    "cuda": "developer.download.nvidia.com",
    "crio": "download.opensuse.org",
}
REPOSITORIES = (
    "  packageRepositories:\n"
    "    apt:\n"
    "      - {url: 'http://10.0.0.1:8089/debs', trusted: true}\n"
    "    dnf:\n"
    "      - {url: 'https://rpm.example.com/el9', key: 'https://rpm.example.com/key.asc'}\n"
)
COMPONENTS = (
    "  nvidiaDriver: {install: true, package: {branch: '570'}}\n"
    "  nvidiaContainerToolkit: {install: true}\n"
    "  kubernetes: {install: true, release: {version: v1.33.4}}\n"
)
OS_KEYS = ("ubuntu-22.04", "debian-12", "rocky-9", "fedora-42", "amazon-linux-2023")
RUNTIMES = ("containerd", "docker", "crio")


def _plan(runtime: str, os_key: str, *, repositories: bool) -> Plan:
    doc = scenarios.HEAD + COMPONENTS + f"  containerRuntime: {{install: true, name: {runtime}}}\n"
    if repositories:
        doc += REPOSITORIES
    return render(load_document(doc).spec, NodeContext("control-plane", facts_for(os_key)))


def _package_steps(plan: Plan, runtime: str) -> dict[str, str]:
    """name -> step body (the library left out) of the steps that install packages."""
    names = ("nvidia-driver", runtime, "nvidia-container-toolkit", "kubeadm")
    out = {}
    for name in names:
        step = plan.step(name)
        assert step is not None, name
        out[name] = scenarios.library_of(step.script)[1]
    return out


@pytest.mark.parametrize("os_key", OS_KEYS)
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_package_steps_use_only_the_configured_repositories(runtime: str, os_key: str) -> None:
    plan = _plan(runtime, os_key, repositories=True)
    assert [s.name for s in plan.steps][:2] == ["preflight", "package-repositories"]
    configured = plan.step("package-repositories")
    assert configured is not None
    manager_url = (
        "http://10.0.0.1:8089/debs" if os_key in ("ubuntu-22.04", "debian-12") else "rpm.example.com"
    )
    assert manager_url in configured.script
    for name, body in _package_steps(plan, runtime).items():
        where = f"{runtime}/{os_key}/{name}"
        for host in UPSTREAM.values():
            assert host not in body, (where, host)
        assert not re.search(r"^\s*(fetch_key|add_repo) ", body, re.M), where
        assert "epel-release" not in body, where
        assert re.search(r"^\s*pkg_install(_pinned)? ", body, re.M), where  # still installs, from those


@pytest.mark.parametrize("os_key", OS_KEYS)
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_without_repositories_the_same_steps_use_upstream(runtime: str, os_key: str) -> None:
    """The check above can fail: the same steps name the upstream repositories otherwise."""
    plan = _plan(runtime, os_key, repositories=False)
    assert plan.step("package-repositories") is None
    bodies = _package_steps(plan, runtime)
    found = {key for key, host in UPSTREAM.items() if any(host in body for body in bodies.values())}
    expected = {"kubernetes", "toolkit", "cuda"}
    if runtime == "crio":
        expected.add("crio")
    elif not os_key.startswith("amazon"):
        expected.add("docker")  # containerd.io and docker-ce from Docker's repository
    assert found == expected
    for name in ("nvidia-driver", "nvidia-container-toolkit", "kubeadm"):
        assert re.search(r"^\s*add_repo ", bodies[name], re.M), name
    if os_key == "rocky-9":
        assert "epel-release" in bodies["nvidia-driver"]


@pytest.mark.parametrize(
    ("os_key", "written"),
    [
        (
            "ubuntu-22.04",
            {"etc/apt/sources.list.d/tether-0.list": "deb [trusted=yes] http://10.0.0.1:8089/debs ./ \n"},
        ),
        (
            "rocky-9",
            {
                "etc/yum.repos.d/tether-0.repo": (
                    "[tether-0]\nname=tether-0\nbaseurl=https://rpm.example.com/el9\nenabled=1\ngpgcheck=1\n"
                    "gpgkey=file://{tmp}/etc/pki/rpm-gpg/tether-0.asc\n"
                ),
                "etc/pki/rpm-gpg/tether-0.asc": "KEY\n",
            },
        ),
    ],
)
def test_the_repositories_step_writes_only_the_configured_sources(
    tmp_path: Path, os_key: str, written: dict[str, str]
) -> None:
    step = _plan("containerd", os_key, repositories=True).step("package-repositories")
    assert step is not None
    script = step.script.replace("\ncheck_os\n", "\n", 1)
    script = script.replace("/etc/", f"{tmp_path}/etc/").replace("/var/lib/tether", f"{tmp_path}/state")
    stubs = {
        "curl": curl_serving({"https://rpm.example.com/key.asc": b"KEY\n"}, tmp_path),
        "apt-get": 'echo "apt-get $*" >>"$TETHER_WORKDIR/calls"',
        "dnf": 'echo "dnf $*" >>"$TETHER_WORKDIR/calls"',
    }
    out = run_bash(tmp_path, script, stubs=stubs, env=dict(step.env))
    assert out.returncode == 0, out.stderr
    files = {
        str(p.relative_to(tmp_path)): p.read_text() for p in (tmp_path / "etc").rglob("*") if p.is_file()
    }
    assert files == {k: v.format(tmp=tmp_path) for k, v in written.items()}
    assert re.search(
        r"^(apt-get .* update|dnf .*makecache)$", (tmp_path / "work" / "calls").read_text(), re.M
    )
