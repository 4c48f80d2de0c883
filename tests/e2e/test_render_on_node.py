"""Rendered steps run for real on a testbed node: preflight, the spec's package repository (the
testbed's signed local apt repo), the Debian path of the containerd step, and a custom template.
Each step runs twice: the second run must change nothing (idempotency)."""

from __future__ import annotations

import re
import shlex
import urllib.request
from collections.abc import Callable

import pytest
import yaml

from tests.e2e.testbed.testbed import Testbed
from tether.controller.render import NodeContext, render
from tether.controller.render.targets import facts_for
from tether.controller.spec import load_document
from tether.nodeagent.model import Step

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def _spec(bed: Testbed) -> str:
    services = bed.state["services"]
    url = re.search(r"(https?://\S+)", services["apt_source_trusted"])
    assert url is not None
    with urllib.request.urlopen(services["apt_repo_key_url"], timeout=10) as reply:
        key = reply.read().decode()
    doc = {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "Environment",
        "metadata": {"name": "e2e-render"},
        "spec": {
            "packageRepositories": {"apt": [{"url": url.group(1), "key": key}]},
            "containerRuntime": {"install": True, "name": "containerd", "package": {"name": "containerd"}},
            "customTemplates": [
                {
                    "name": "marker",
                    "phase": "post-install",
                    "inline": 'printf "%s\\n" "$MESSAGE" >/var/lib/tether-e2e-marker',
                    "env": {"MESSAGE": "hello $(id)"},
                }
            ],
        },
    }
    return yaml.safe_dump(doc)


def _runner(bed: Testbed, node: str) -> Callable[[Step], tuple[int, str, dict[str, str]]]:
    def run(step: Step) -> tuple[int, str, dict[str, str]]:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in step.env.items() if "\n" not in v)
        files = {k: v for k, v in step.env.items() if "\n" in v}
        prefix = "".join(f'export {k}="$(cat /run/tether-e2e-{k})"; ' for k in files)
        for k, v in files.items():
            bed.exec(node, f"cat >/run/tether-e2e-{k}", input=v)
        bed.exec(node, "cat >/run/tether-e2e-step.sh", input=step.script)
        result = bed.exec(
            node,
            f"{prefix}rm -f /run/tether-e2e-prov; env {env} TETHER_PROVENANCE=/run/tether-e2e-prov "
            "bash /run/tether-e2e-step.sh",
            check=False,
            timeout=600,
        )
        prov = bed.exec(node, "cat /run/tether-e2e-prov 2>/dev/null || true").stdout
        observed = dict(line.split("=", 1) for line in prov.splitlines() if "=" in line)
        return result.returncode, result.stdout + result.stderr, observed

    return run


def test_containerd_and_custom_template_on_a_debian_node(fresh_testbed: Callable[..., Testbed]) -> None:
    bed = fresh_testbed(1)
    node = bed.nodes[0].name
    loaded = load_document(_spec(bed))
    plan = render(loaded.spec, NodeContext("worker", facts_for("debian-12")))
    assert [s.name for s in plan.steps] == [
        "preflight",
        "package-repositories",
        "containerd",
        "custom-marker",
    ]
    run = _runner(bed, node)
    for step in plan.steps:
        code, output, observed = run(step)
        assert code == 0, f"{step.name} failed:\n{output[-4000:]}"
        if step.name == "containerd":
            assert observed["containerd.version"]
            assert observed["containerd.package"].startswith("containerd=")
    config = bed.exec(node, "sha256sum /etc/containerd/config.toml").stdout
    assert "SystemdCgroup = true" in bed.exec(node, "cat /etc/containerd/config.toml").stdout
    assert bed.exec(node, "cat /var/lib/tether-e2e-marker").stdout == "hello $(id)\n"
    # Idempotent: running the steps again changes nothing.
    for step in plan.steps:
        code, output, _ = run(step)
        assert code == 0, f"{step.name} failed on the second run:\n{output[-4000:]}"
        assert "wrote /etc" not in output, (step.name, output)
    assert bed.exec(node, "sha256sum /etc/containerd/config.toml").stdout == config
