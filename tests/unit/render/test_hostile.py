"""Hostile strings in every shell-bound field are rejected at validation or rendered inert.

For each field, hypothesis throws shell metacharacters, command substitutions, newlines and
quotes at it. Either ``load_document`` refuses the spec with a problem at that field's path, or
the rendered plan carries the value only as a single shell-quoted word (or only in the step's
environment), so no shell ever parses it as code.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.render.shellrun import run_bash
from tether.controller.cluster.context import ClusterContext, Position
from tether.controller.render import NodeContext, render
from tether.controller.render.targets import facts_for
from tether.controller.spec import SpecError, load_document
from tether.controller.spec.model import EnvironmentSpec

SHA = "sha256:" + "ab" * 32
PAYLOADS = [
    "$(touch /tmp/tether-pwned)",
    "`touch /tmp/tether-pwned`",
    "x; touch /tmp/tether-pwned",
    "x && touch /tmp/tether-pwned",
    "x\ntouch /tmp/tether-pwned",
    "x' ; touch /tmp/tether-pwned; '",
    'x" ; touch /tmp/tether-pwned; "',
    "${IFS}touch${IFS}/tmp/tether-pwned",
    "x|touch /tmp/tether-pwned",
    "../../etc/passwd",
    "-rf /",
    "v1.2.3 --help",
    "https://example.com/a b",
    "https://example.com/$(id)",
    "main\x00",
    "{{ 7 * 7 }}",
    "{% raw %}",
]
hostile = st.one_of(
    st.sampled_from(PAYLOADS),
    st.text(alphabet="$`;|&<>(){}[]'\"\\\n *?!#~=%:/.-_aZ09", min_size=1, max_size=40),
)

Build = Callable[[str], dict[str, Any]]
FIELDS: dict[str, Build] = {
    "spec.kernel.version": lambda v: {"kernel": {"version": v}},
    "spec.nvidiaDriver.package.version": lambda v: {
        "nvidiaDriver": {"install": True, "package": {"version": v}}
    },
    "spec.nvidiaDriver.package.branch": lambda v: {
        "nvidiaDriver": {"install": True, "package": {"branch": v}}
    },
    "spec.nvidiaDriver.runfile.url": lambda v: {
        "nvidiaDriver": {"install": True, "source": "runfile", "runfile": {"url": v, "checksum": SHA}}
    },
    "spec.nvidiaDriver.runfile.checksum": lambda v: {
        "nvidiaDriver": {
            "install": True,
            "source": "runfile",
            "runfile": {"url": "https://e.com/d.run", "checksum": v},
        }
    },
    "spec.nvidiaDriver.git.ref": lambda v: {
        "nvidiaDriver": {"install": True, "source": "git", "git": {"ref": v}}
    },
    "spec.nvidiaDriver.git.repo": lambda v: {
        "nvidiaDriver": {"install": True, "source": "git", "git": {"ref": "main", "repo": v}}
    },
    "spec.containerRuntime.package.version": lambda v: {
        "containerRuntime": {"install": True, "package": {"version": v}}
    },
    "spec.containerRuntime.package.name": lambda v: {
        "containerRuntime": {"install": True, "package": {"name": v}}
    },
    "spec.containerRuntime.git.ref": lambda v: {
        "containerRuntime": {"install": True, "source": "git", "git": {"ref": v}}
    },
    "spec.containerRuntime.git.repo": lambda v: {
        "containerRuntime": {"install": True, "source": "git", "git": {"ref": "main", "repo": v}}
    },
    "spec.containerRuntime.latest.track": lambda v: {
        "containerRuntime": {"install": True, "name": "crio", "source": "latest", "latest": {"track": v}}
    },
    "spec.nvidiaContainerToolkit.package.version": lambda v: {
        "nvidiaContainerToolkit": {"install": True, "package": {"version": v}}
    },
    "spec.nvidiaContainerToolkit.package.channel": lambda v: {
        "nvidiaContainerToolkit": {"install": True, "package": {"channel": v}}
    },
    "spec.nvidiaContainerToolkit.git.ref": lambda v: {
        "nvidiaContainerToolkit": {"install": True, "source": "git", "git": {"ref": v}}
    },
    "spec.nvidiaContainerToolkit.git.repo": lambda v: {
        "nvidiaContainerToolkit": {"install": True, "source": "git", "git": {"ref": "main", "repo": v}}
    },
    "spec.kubernetes.release.version": lambda v: {"kubernetes": {"install": True, "release": {"version": v}}},
    "spec.kubernetes.K8sFeatureGates[0]": lambda v: {"kubernetes": {"install": True, "K8sFeatureGates": [v]}},
    "spec.kubernetes.K8sEndpointHost": lambda v: {"kubernetes": {"install": True, "K8sEndpointHost": v}},
    "spec.kubernetes.CalicoVersion": lambda v: {"kubernetes": {"install": True, "CalicoVersion": v}},
    "spec.kubernetes.git.ref": lambda v: {
        "kubernetes": {"install": True, "source": "git", "git": {"ref": v}}
    },
    "spec.kubernetes.git.repo": lambda v: {
        "kubernetes": {"install": True, "source": "git", "git": {"ref": "main", "repo": v}}
    },
    "spec.kubernetes.latest.track": lambda v: {
        "kubernetes": {"install": True, "source": "latest", "latest": {"track": v}}
    },
    "spec.kubernetes.CniPluginsVersion": lambda v: {"kubernetes": {"install": True, "CniPluginsVersion": v}},
    "spec.kubernetes.CrictlVersion": lambda v: {"kubernetes": {"install": True, "CrictlVersion": v}},
    "spec.kubernetes.kindVersion": lambda v: {
        "kubernetes": {"install": True, "Installer": "kind", "kindVersion": v}
    },
    "spec.cluster.highAvailability.endpoint": lambda v: {
        "kubernetes": {"install": True},
        "cluster": {"controlPlane": {"count": 3}, "highAvailability": {"enabled": True, "endpoint": v}},
    },
    "spec.cluster.workers.labels": lambda v: {
        "kubernetes": {"install": True},
        "cluster": {"workers": {"count": 1, "labels": {"team": v}}},
    },
    "spec.cluster.controlPlane.labels": lambda v: {
        "kubernetes": {"install": True},
        "cluster": {"controlPlane": {"count": 1, "labels": {v: "x"}}},
    },
    "spec.customTemplates[0].name": lambda v: {"customTemplates": [{"name": v, "inline": "true"}]},
    "spec.customTemplates[0].env": lambda v: {
        "customTemplates": [{"name": "t", "inline": "true", "env": {v: "x"}}]
    },
    "spec.customTemplates[0].url": lambda v: {"customTemplates": [{"name": "t", "url": v, "checksum": SHA}]},
    "spec.customTemplates[0].checksum": lambda v: {
        "customTemplates": [{"name": "t", "url": "https://e.com/s.sh", "checksum": v}]
    },
    "spec.packageRepositories.apt[0].url": lambda v: {
        "packageRepositories": {"apt": [{"url": v, "trusted": True}]}
    },
    "spec.packageRepositories.apt[0].suite": lambda v: {
        "packageRepositories": {
            "apt": [{"url": "https://a.com/d", "suite": v, "components": ["main"], "trusted": True}]
        }
    },
    "spec.packageRepositories.apt[0].components[0]": lambda v: {
        "packageRepositories": {
            "apt": [{"url": "https://a.com/d", "suite": "stable", "components": [v], "trusted": True}]
        }
    },
    "spec.packageRepositories.apt[0].key": lambda v: {
        "packageRepositories": {"apt": [{"url": "https://a.com/d", "key": v}]}
    },
    "spec.packageRepositories.dnf[0].url": lambda v: {
        "packageRepositories": {"dnf": [{"url": v, "trusted": True}]}
    },
    "spec.packageRepositories.dnf[0].key": lambda v: {
        "packageRepositories": {"dnf": [{"url": "https://a.com/r", "key": v}]}
    },
    "spec.downloadMirror": lambda v: {"downloadMirror": v},
}


# Fields outside spec: each builds the document's metadata; the spec installs Kubernetes, so the
# name reaches the rendered kubeadm configuration.
METADATA_FIELDS: dict[str, Build] = {"metadata.name": lambda v: {"name": v}}
ALL_FIELDS = sorted([*FIELDS, *METADATA_FIELDS])


def _doc(spec: dict[str, Any], metadata: dict[str, Any] | None = None) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "tether.dev/v1alpha1",
            "kind": "Environment",
            "metadata": metadata or {"name": "h"},
            "spec": spec,
        }
    )


def _document(field: str, value: str) -> str:
    if field in METADATA_FIELDS:
        return _doc({"kubernetes": {"install": True}}, METADATA_FIELDS[field](value))
    return _doc(FIELDS[field](value))


def _nodes(spec: EnvironmentSpec) -> list[NodeContext]:
    """Every node the spec renders differently for: both single-node roles, or every cluster position."""
    places: list[tuple[str, ClusterContext | None]] = [("control-plane", None), ("worker", None)]
    if spec.cluster is not None:
        ha = spec.cluster.high_availability
        endpoint = ha.endpoint if ha.enabled else ""
        places = [
            (
                "worker" if p is Position.WORKER else "control-plane",
                ClusterContext(p, upload_certs=True, ha_endpoint=endpoint),
            )
            for p in Position
        ]
    return [
        NodeContext(role, facts_for(os_key), ctx)
        for os_key in ("ubuntu-22.04", "rocky-9")
        for role, ctx in places
    ]


def _check(field: str, value: str) -> None:
    try:
        loaded = load_document(_document(field, value))
    except SpecError as exc:
        found = exc.problems
    else:
        found = []
    if found:
        prefix = field.split("[")[0].rsplit(".", 1)[0]
        assert any(p.startswith(prefix) for p in found), (field, found)
        return
    for node in _nodes(loaded.spec):
        for step in render(loaded.spec, node).steps:
            _assert_inert(value, step.script)


def _assert_inert(value: str, script: str) -> None:
    """The value appears only as one quoted word (or a word that needs no quoting)."""
    if value not in script:
        return
    quoted = shlex.quote(value)
    if quoted == value:
        assert all(c.isalnum() or c in "@%+=:,./-_" for c in value), value
        return
    stripped = script.replace(quoted, "")
    assert value not in stripped, f"{value!r} appears unquoted"


settings.register_profile(
    "hostile", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@settings(settings.get_profile("hostile"))
@given(field=st.sampled_from(ALL_FIELDS), value=hostile)
def test_hostile_values_are_rejected_or_inert(field: str, value: str) -> None:
    _check(field, value)


def test_every_payload_in_every_field() -> None:
    for field in ALL_FIELDS:
        for value in PAYLOADS:
            _check(field, value)


# A valid, distinctive value per field (as it appears on the node: versions without the v that
# loading adds, checksums without their sha256: prefix).
BENIGN: dict[str, str] = {
    "metadata.name": "benign-env",
    "spec.kernel.version": "6.8.0-4242-aws",
    "spec.nvidiaDriver.package.version": "580.42.42",
    "spec.nvidiaDriver.package.branch": "575",
    "spec.nvidiaDriver.runfile.url": "https://e.com/benign-driver.run",
    "spec.nvidiaDriver.runfile.checksum": "cd" * 32,
    "spec.nvidiaDriver.git.ref": "benign-ref",
    "spec.nvidiaDriver.git.repo": "https://git.example.com/benign.git",
    "spec.containerRuntime.package.version": "1.7.42",
    "spec.containerRuntime.package.name": "containerd-benign",
    "spec.containerRuntime.git.ref": "benign-ref",
    "spec.containerRuntime.git.repo": "https://git.example.com/benign.git",
    "spec.containerRuntime.latest.track": "benign-track",
    "spec.nvidiaContainerToolkit.package.version": "1.17.42-1",
    "spec.nvidiaContainerToolkit.package.channel": "experimental",
    "spec.nvidiaContainerToolkit.git.ref": "benign-ref",
    "spec.nvidiaContainerToolkit.git.repo": "https://git.example.com/benign.git",
    "spec.kubernetes.release.version": "v1.33.42",
    "spec.kubernetes.K8sFeatureGates[0]": "BenignGate=true",
    "spec.kubernetes.K8sEndpointHost": "api.benign.example",
    "spec.kubernetes.CalicoVersion": "v3.31.42",
    "spec.kubernetes.git.ref": "benign-ref",
    "spec.kubernetes.git.repo": "https://git.example.com/benign.git",
    "spec.kubernetes.latest.track": "benign-track",
    "spec.kubernetes.CniPluginsVersion": "1.6.42",
    "spec.kubernetes.CrictlVersion": "1.33.42",
    "spec.kubernetes.kindVersion": "v0.42.0",
    "spec.cluster.highAvailability.endpoint": "lb.benign.example:6443",
    "spec.cluster.workers.labels": "benign-team",
    "spec.cluster.controlPlane.labels": "benign.example/key",
    "spec.customTemplates[0].name": "benign-name",
    "spec.customTemplates[0].env": "BENIGN_VAR",
    "spec.customTemplates[0].url": "https://e.com/benign.sh",
    "spec.customTemplates[0].checksum": "ef" * 32,
    "spec.packageRepositories.apt[0].url": "https://apt.benign.example/debs",
    "spec.packageRepositories.apt[0].suite": "benign-suite",
    "spec.packageRepositories.apt[0].components[0]": "benigncomp",
    "spec.packageRepositories.apt[0].key": "https://apt.benign.example/key.asc",
    "spec.packageRepositories.dnf[0].url": "https://rpm.benign.example/el9",
    "spec.packageRepositories.dnf[0].key": "https://rpm.benign.example/key.asc",
    "spec.downloadMirror": "http://mirror.benign.example",
}
# Applied by cluster orchestration after the join, not by any rendered step.
NOT_RENDERED = {"spec.cluster.workers.labels", "spec.cluster.controlPlane.labels"}


def test_every_field_reaches_the_plan_with_a_benign_value() -> None:
    """The builders above are sound: with a valid value the spec loads and the value reaches a step.

    So a hostile value's rejection is that value's doing, not a broken builder's, and the
    inertness check really sees the value in the scripts it scans.
    """
    assert sorted(BENIGN) == ALL_FIELDS
    for field, value in BENIGN.items():
        loaded = load_document(_document(field, value))
        if field in NOT_RENDERED:
            continue
        texts = [
            step.script + "\n".join([*step.env, *step.env.values()])
            for node in _nodes(loaded.spec)
            for step in render(loaded.spec, node).steps
        ]
        assert any(value in text for text in texts), field


def test_env_values_stay_data_when_the_step_runs(tmp_path: Path) -> None:
    """Env values are process environment: running the step does not execute them."""
    marker = tmp_path / "pwned"
    payload = f"$(touch {marker}); `touch {marker}`; x' ; touch {marker}"
    spec = {"customTemplates": [{"name": "t", "inline": 'printf "%s" "$V" >"$OUT"', "env": {"V": payload}}]}
    step = render(load_document(_doc(spec)).spec, NodeContext("worker", facts_for("ubuntu-22.04"))).steps[-1]
    assert payload not in step.script
    out = run_bash(tmp_path, step.script, env={**step.env, "OUT": str(tmp_path / "out")})
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "out").read_text() == payload
    assert not marker.exists()


def test_kubeadm_config_reaches_the_node_as_data() -> None:
    text = "kind: ClusterConfiguration\n# $(touch /tmp/x) `id`\n"
    spec = {"kubernetes": {"install": True, "kubeAdmConfigContent": text}}
    plan = render(load_document(_doc(spec)).spec, NodeContext("control-plane", facts_for("ubuntu-22.04")))
    init = plan.step("kubeadm-init")
    assert init is not None and init.env["TETHER_KUBEADM_CONFIG"] == text and text not in init.script


def test_armored_repository_keys_reach_the_node_as_data() -> None:
    key = "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmQINBGX0benignKEY=\n-----END PGP PUBLIC KEY BLOCK-----\n"
    spec = {"packageRepositories": {"apt": [{"url": "https://a.com/d", "key": key}]}}
    plan = render(load_document(_doc(spec)).spec, NodeContext("worker", facts_for("ubuntu-22.04")))
    step = plan.step("package-repositories")
    assert step is not None and step.env["TETHER_REPO_KEY_0"] == key
    assert "mQINBGX0benignKEY" not in step.script
