"""Preflight demands root only when the plan changes the system."""

from __future__ import annotations

from tether.controller.render import NodeContext, render
from tether.controller.render.targets import facts_for
from tether.controller.spec import load_document

HEAD = "apiVersion: tether.dev/v1alpha1\nkind: Environment\nmetadata: {name: e}\nspec:\n"


def preflight(spec: str) -> str:
    plan = render(load_document(HEAD + spec).spec, NodeContext("worker", facts_for("debian-12")))
    step = plan.step("preflight")
    assert step is not None
    return step.script


def test_custom_templates_alone_run_unprivileged() -> None:
    script = preflight("  customTemplates:\n    - {name: hello, inline: echo hi}\n")
    assert "run as root" not in script and "installing what the steps need" not in script


def test_system_components_need_root() -> None:
    assert "tether steps run as root" in preflight("  containerRuntime: {install: true, name: containerd}\n")
    assert "tether steps run as root" in preflight(
        "  customTemplates:\n    - {name: u, url: 'https://example.com/x.sh', checksum: 'sha256:"
        + "a" * 64
        + "'}\n"
    )
