"""Every validated field refuses a trailing newline (issue 10, item 14).

``re.match`` with ``$`` accepts ``"6.8.0-1015-aws\\n"``: ``$`` also matches before a final
newline. Each case below loads once with a good value (so the field really is validated at that
path) and once with the same value plus ``"\\n"``, which must be a problem at that path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tether.controller.spec import SpecError, load_document

SHA = "sha256:" + "ab" * 32
Build = Callable[[str], dict[str, Any]]

CASES: list[tuple[str, str, Build]] = [
    ("spec.kernel.version", "6.8.0-1015-aws", lambda v: {"kernel": {"version": v}}),
    (
        "spec.containerRuntime.package.version",
        "1.7.27-1",
        lambda v: {"containerRuntime": {"install": True, "package": {"version": v}}},
    ),
    (
        "spec.nvidiaDriver.package.branch",
        "570",
        lambda v: {"nvidiaDriver": {"install": True, "package": {"branch": v}}},
    ),
    (
        "spec.kubernetes.release.version",
        "v1.31.1",
        lambda v: {"kubernetes": {"install": True, "release": {"version": v}}},
    ),
    (
        "spec.kubernetes.CrictlVersion",
        "v1.31.1",
        lambda v: {"kubernetes": {"install": True, "CrictlVersion": v}},
    ),
    (
        "spec.kubernetes.K8sFeatureGates[0]",
        "DynamicResourceAllocation=true",
        lambda v: {"kubernetes": {"install": True, "K8sFeatureGates": [v]}},
    ),
    ("spec.downloadMirror", "https://mirror.example.com/files", lambda v: {"downloadMirror": v}),
    (
        "spec.customTemplates[0].url",
        "https://example.com/s.sh",
        lambda v: {"customTemplates": [{"name": "t", "url": v, "checksum": SHA}]},
    ),
    (
        "spec.customTemplates[0].checksum",
        SHA,
        lambda v: {"customTemplates": [{"name": "t", "url": "https://e.com/s.sh", "checksum": v}]},
    ),
    (
        "spec.kubernetes.K8sEndpointHost",
        "api.example.com",
        lambda v: {"kubernetes": {"install": True, "K8sEndpointHost": v}},
    ),
    (
        "spec.cluster.highAvailability.endpoint",
        "lb.example.com",
        lambda v: {
            "kubernetes": {"install": True},
            "cluster": {"controlPlane": {"count": 3}, "highAvailability": {"enabled": True, "endpoint": v}},
        },
    ),
    (
        "spec.cluster.workers.labels.team",
        "gpu-a",
        lambda v: {
            "kubernetes": {"install": True},
            "cluster": {"workers": {"count": 1, "labels": {"team": v}}},
        },
    ),
    (
        "spec.nvidiaDriver.git.ref",
        "release-570",
        lambda v: {"nvidiaDriver": {"install": True, "source": "git", "git": {"ref": v}}},
    ),
    (
        "spec.containerRuntime.package.name",
        "containerd.io",
        lambda v: {"containerRuntime": {"install": True, "package": {"name": v}}},
    ),
    (
        "spec.packageRepositories.apt[0].suite",
        "stable",
        lambda v: {
            "packageRepositories": {
                "apt": [{"url": "https://a.com/d", "suite": v, "components": ["main"], "trusted": True}]
            }
        },
    ),
    (
        "spec.customTemplates[0].name",
        "node-setup",
        lambda v: {"customTemplates": [{"name": v, "inline": "true"}]},
    ),
]


def _doc(spec: dict[str, Any], name: str = "env") -> str:
    doc = {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "Environment",
        "metadata": {"name": name},
        "spec": spec,
    }
    return yaml.safe_dump(doc)


def _problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as err:
        load_document(text)
    return err.value.problems


@pytest.mark.parametrize(("path", "good", "build"), CASES, ids=[c[0] for c in CASES])
def test_a_trailing_newline_is_refused(path: str, good: str, build: Build) -> None:
    load_document(_doc(build(good)))  # the good value loads: the field is there and checked
    assert any(p.startswith(f"{path}:") for p in _problems(_doc(build(good + "\n"))))


@pytest.mark.parametrize("name", ["env\n", "a-b\n"])
def test_metadata_name_with_a_trailing_newline_is_refused(name: str) -> None:
    load_document(_doc({}, name="env"))
    assert any(p.startswith("metadata.name:") for p in _problems(_doc({}, name=name)))
