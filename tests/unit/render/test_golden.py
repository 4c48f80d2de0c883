"""Golden plans for every component x source x OS family.

Regenerate after an intended change with ``.venv/bin/python -m tests.unit.render.regen`` and
review the diff.
"""

from __future__ import annotations

import pytest

from tests.unit.render import scenarios

REGEN = "regenerate with: .venv/bin/python -m tests.unit.render.regen"


@pytest.mark.parametrize(("name", "os_key"), scenarios.cases(), ids=lambda v: str(v))
def test_plan_matches_golden(name: str, os_key: str) -> None:
    text, libraries = scenarios.golden_text(scenarios.plan_for(name, os_key))
    path = scenarios.golden_path(name, os_key)
    assert path.exists(), f"no golden file {path.name}; {REGEN}"
    assert text == path.read_text(), f"{path.name} differs; {REGEN}"
    for lib_name, lib in libraries.items():
        lib_path = scenarios.GOLDEN / lib_name
        assert lib_path.exists() and lib_path.read_text() == lib, f"{lib_name} differs; {REGEN}"


def test_no_stale_golden_files() -> None:
    expected = {scenarios.golden_path(n, o).name for n, o in scenarios.cases()}
    present = {p.name for p in scenarios.GOLDEN.glob("*.txt")}
    assert present == expected, REGEN


def test_matrix_covers_every_component_source_and_family() -> None:
    seen = set()
    for name, os_key in scenarios.cases():
        for step in scenarios.plan_for(name, os_key).steps:
            seen.add((step.component, step.requested.get("source", ""), step.script.split("for ", 1)[1][:6]))
    components = {c for c, _, _ in seen}
    assert {"kernel", "nvidia-driver", "containerd", "docker", "cri-dockerd", "crio"} <= components
    assert {"nvidia-container-toolkit", "kubernetes", "calico", "kind", "microk8s", "custom"} <= components
    for component, sources in {
        "nvidia-driver": {"package", "runfile", "git"},
        "containerd": {"package", "git", "latest"},
        "docker": {"package", "git", "latest"},
        "crio": {"package", "git", "latest"},
        "nvidia-container-toolkit": {"package", "git", "latest"},
        "kubernetes": {"release", "git", "latest"},
        "kind": {"release", "git", "latest"},
        "custom": {"inline", "url"},
    }.items():
        for family in ("debian", "rhel", "amazon"):
            have = {s for c, s, f in seen if c == component and f.startswith(family)}
            assert sources <= have, (component, family, have)
