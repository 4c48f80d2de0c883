"""The render matrix: every component x source, rendered for each OS family.

Used by the golden tests, the bash -n / shellcheck tests and ``regen`` (which rewrites the
golden files: ``.venv/bin/python -m tests.unit.render.regen``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tether.controller.render import NodeContext, render
from tether.controller.render.targets import facts_for
from tether.controller.spec import load_document
from tether.nodeagent.model import Plan

GOLDEN = Path(__file__).parent / "golden"
FAMILY_OS = {"debian": "ubuntu-22.04", "rhel": "rocky-9", "amazon": "amazon-linux-2023"}
EXTRA_OS = ("ubuntu-24.04", "ubuntu-26.04", "debian-12", "fedora-42")
SHA = "sha256:" + "ab" * 32

HEAD = "apiVersion: tether.dev/v1alpha1\nkind: Environment\nmetadata: {name: matrix}\nspec:\n"

# name -> spec body (YAML, indented under spec:)
SCENARIOS: dict[str, str] = {
    "kernel": "  kernel: {version: 6.8.0-1015-aws}\n",
    "driver-package-branch": "  nvidiaDriver: {install: true, package: {branch: '570'}}\n",
    "driver-package-version": "  nvidiaDriver: {install: true, package: {version: 580.65.06}}\n",
    "driver-runfile": (
        "  nvidiaDriver: {install: true, source: runfile, runfile: "
        f"{{url: 'https://download.nvidia.com/NVIDIA-Linux-x86_64-580.65.06.run', checksum: '{SHA}'}}}}\n"
    ),
    "driver-git": "  nvidiaDriver: {install: true, source: git, git: {ref: 580.65.06}}\n",
    "containerd-package": "  containerRuntime: {install: true, package: {version: 1.7.27}}\n",
    "containerd-git": "  containerRuntime: {install: true, source: git, git: {ref: v2.0.5}}\n",
    "containerd-latest": "  containerRuntime: {install: true, name: containerd, source: latest}\n",
    "docker-package": (
        "  containerRuntime: {install: true, name: docker, package: {version: 27.3.1}}\n"
        "  kubernetes: {install: true, Installer: kubeadm}\n"
    ),
    "docker-git": "  containerRuntime: {install: true, name: docker, source: git, git: {ref: v27.3.1}}\n",
    "docker-latest": (
        "  containerRuntime: {install: true, name: docker, source: latest, latest: {track: master}}\n"
    ),
    "crio-package": "  containerRuntime: {install: true, name: crio, package: {version: v1.33.2}}\n",
    "crio-git": "  containerRuntime: {install: true, name: crio, source: git, git: {ref: v1.33.2}}\n",
    "crio-latest": "  containerRuntime: {install: true, name: crio, source: latest}\n",
    "toolkit-package": (
        "  nvidiaContainerToolkit:\n"
        "    {install: true, enableCDI: true, package: {channel: stable, version: 1.17.8-1}}\n"
    ),
    "toolkit-git": "  nvidiaContainerToolkit: {install: true, source: git, git: {ref: v1.17.8}}\n",
    "toolkit-latest": (
        "  nvidiaContainerToolkit: {install: true, source: latest}\n  containerRuntime: {name: crio}\n"
    ),
    "kubeadm-release": (
        "  kubernetes:\n    install: true\n    Installer: kubeadm\n    release: {version: v1.33.4}\n"
        "    K8sFeatureGates: [DynamicResourceAllocation=true]\n    K8sEndpointHost: api.example.com\n"
    ),
    "kubeadm-release-legacy": "  kubernetes: {install: true, Installer: kubeadm, Version: v1.30.2}\n",
    "kubeadm-git": "  kubernetes: {install: true, source: git, git: {ref: v1.35.3}}\n",
    "kubeadm-latest": ("  kubernetes: {install: true, source: latest}\n  containerRuntime: {name: docker}\n"),
    "kind-release": (
        "  containerRuntime: {install: true, name: docker}\n"
        "  kubernetes: {install: true, Installer: kind, release: {version: v1.33.1}, "
        "kindConfigContent: 'kind: Cluster'}\n"
    ),
    "kind-git": "  kubernetes: {install: true, Installer: kind, source: git, git: {ref: v1.35.3}}\n",
    "kind-latest": "  kubernetes: {install: true, Installer: kind, source: latest}\n",
    "microk8s": "  kubernetes: {install: true, Installer: microk8s, release: {version: v1.32.3}}\n",
    "custom": (
        "  customTemplates:\n"
        "    - {name: first, phase: pre-install, inline: 'echo \"$GREETING\"', env: {GREETING: hello}}\n"
        "    - {name: runtime, phase: post-runtime, inline: 'true', roles: [worker]}\n"
        "    - {name: toolkit, phase: post-toolkit, inline: 'true', continueOnError: true}\n"
        "    - {name: cluster, phase: post-kubernetes, inline: 'true', timeout: 30}\n"
        f"    - {{name: fetched, phase: post-install, url: 'https://example.com/s.sh', checksum: '{SHA}'}}\n"
    ),
    "repositories": (
        "  downloadMirror: http://10.0.0.1:8080/mirror\n"
        "  packageRepositories:\n"
        "    apt:\n"
        "      - {url: 'http://10.0.0.1:8089/debs', trusted: true}\n"
        "      - {url: 'https://apt.example.com/debian', suite: bookworm, components: [main], "
        "key: 'https://apt.example.com/key.asc'}\n"
        "    dnf:\n"
        "      - {url: 'https://rpm.example.com/el9', key: 'https://rpm.example.com/key.asc'}\n"
        "  containerRuntime: {install: true, name: containerd}\n"
        "  kubernetes: {install: true, source: git, git: {ref: v1.35.3}}\n"
    ),
}


def document(name: str) -> str:
    return HEAD + SCENARIOS[name]


def plan_for(name: str, os_key: str, *, role: str = "control-plane", gpu: bool = True) -> Plan:
    spec = load_document(document(name)).spec
    return render(spec, NodeContext(role=role, facts=facts_for(os_key, gpu=gpu)))


def cases() -> list[tuple[str, str]]:
    """(scenario, os) pairs: every scenario on every family, the OS-specific ones on the rest."""
    out = [(s, os_key) for s in SCENARIOS for os_key in FAMILY_OS.values()]
    for os_key in EXTRA_OS:
        out += [(s, os_key) for s in ("driver-package-branch", "docker-package", "kubeadm-release")]
    return out


def library_of(script: str) -> tuple[str, str]:
    """(library text, script with the library replaced by a reference line)."""
    start = script.index("set -euo pipefail\n")
    end = script.index("\ncheck_os\n") + len("\ncheck_os\n")
    return script[start:end], script[:start] + "# [shared library: see library-*.sh]\n" + script[end:]


def golden_text(plan: Plan) -> tuple[str, dict[str, str]]:
    """The golden file for a plan, and the libraries it refers to (file name -> text)."""
    parts: list[str] = []
    libraries: dict[str, str] = {}
    for i, step in enumerate(plan.steps, 1):
        meta = {
            k: v
            for k, v in dataclasses.asdict(step).items()
            if k
            in ("phase", "component", "timeout_seconds", "reboot", "continue_on_error", "requested", "env")
        }
        parts.append(f"######## {i:02d} {step.name} {meta}\n")
        if "\ncheck_os\n" in step.script:
            lib, body = library_of(step.script)
            libraries[library_name(lib)] = lib
            parts.append(body)
        else:
            parts.append(step.script)
    return "".join(parts), libraries


def library_name(lib: str) -> str:
    import hashlib

    family = lib.split("TETHER_FAMILY=", 1)[1].split("\n", 1)[0]
    arch = lib.split("TETHER_ARCH=", 1)[1].split("\n", 1)[0]
    return f"library-{family}-{arch}-{hashlib.sha256(lib.encode()).hexdigest()[:8]}.sh"


def golden_path(name: str, os_key: str) -> Path:
    return GOLDEN / f"{name}--{os_key}.txt"
