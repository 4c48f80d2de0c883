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

from controller.render import NodeContext, render
from controller.render.targets import facts_for
from controller.spec import SpecError, load_document
from tests.unit.render.shellrun import run_bash

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
    "spec.nvidiaDriver.runfile.url": lambda v: {
        "nvidiaDriver": {"install": True, "source": "runfile", "runfile": {"url": v, "checksum": SHA}}
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
    "spec.containerRuntime.latest.track": lambda v: {
        "containerRuntime": {"install": True, "name": "crio", "source": "latest", "latest": {"track": v}}
    },
    "spec.nvidiaContainerToolkit.package.version": lambda v: {
        "nvidiaContainerToolkit": {"install": True, "package": {"version": v}}
    },
    "spec.kubernetes.release.version": lambda v: {"kubernetes": {"install": True, "release": {"version": v}}},
    "spec.kubernetes.K8sFeatureGates[0]": lambda v: {"kubernetes": {"install": True, "K8sFeatureGates": [v]}},
    "spec.kubernetes.K8sEndpointHost": lambda v: {"kubernetes": {"install": True, "K8sEndpointHost": v}},
    "spec.kubernetes.CalicoVersion": lambda v: {"kubernetes": {"install": True, "CalicoVersion": v}},
    "spec.kubernetes.git.ref": lambda v: {
        "kubernetes": {"install": True, "source": "git", "git": {"ref": v}}
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
    "spec.packageRepositories.dnf[0].key": lambda v: {
        "packageRepositories": {"dnf": [{"url": "https://a.com/r", "key": v}]}
    },
    "spec.downloadMirror": lambda v: {"downloadMirror": v},
}


def _doc(spec: dict[str, Any]) -> str:
    return yaml.safe_dump(
        {"apiVersion": "tether.dev/v1alpha1", "kind": "Environment", "metadata": {"name": "h"}, "spec": spec}
    )


def _check(field: str, value: str) -> None:
    try:
        loaded = load_document(_doc(FIELDS[field](value)))
    except SpecError as exc:
        found = exc.problems
    else:
        found = []
    if found:
        prefix = field.split("[")[0].rsplit(".", 1)[0]
        assert any(p.startswith(prefix) for p in found), (field, found)
        return
    for os_key in ("ubuntu-22.04", "rocky-9"):
        for role in ("control-plane", "worker"):
            plan = render(loaded.spec, NodeContext(role, facts_for(os_key)))
            for step in plan.steps:
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
@given(field=st.sampled_from(sorted(FIELDS)), value=hostile)
def test_hostile_values_are_rejected_or_inert(field: str, value: str) -> None:
    _check(field, value)


def test_every_payload_in_every_field() -> None:
    for field in FIELDS:
        for value in PAYLOADS:
            _check(field, value)


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
