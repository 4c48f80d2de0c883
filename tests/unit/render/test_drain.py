"""spec.rollout.drain: the drain and uncordon gates around a cluster node's disruptive steps, and
the offline preview of a cluster position (tetherctl env render --cluster-position)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.unit.render import scenarios
from tether.controller.cli.main import main
from tether.controller.cluster.context import (
    DRAIN_GATE,
    GATE_DONE,
    GATE_MESSAGE,
    GATE_RESULT,
    UNCORDON_GATE,
    ClusterContext,
    Position,
    context_for,
    preview_context,
)
from tether.controller.render import NodeContext, render
from tether.controller.render.targets import facts_for
from tether.controller.spec import load_document
from tether.nodeagent.model import Plan

CLUSTER = (
    "  kubernetes: {install: true, installer: kubeadm, release: {version: v1.31.0}}\n"
    "  cluster: {controlPlane: {count: 3}, workers: {count: 2}}\n"
)
DISRUPTIVE = (
    "  kernel: {version: 6.8.0-1015-aws}\n"
    "  nvidiaDriver: {install: true}\n"
    "  containerRuntime: {install: true, package: {version: 1.7.27}}\n"
    "  nvidiaContainerToolkit: {install: true}\n"
    "  customTemplates:\n"
    "    - {name: rt, phase: post-runtime, inline: 'true'}\n"
    "    - {name: last, phase: post-install, inline: 'true'}\n"
)
WORKER = ClusterContext(Position.WORKER, upload_certs=True)


def doc(body: str = DISRUPTIVE, *, drain: bool = True, cluster: str = CLUSTER) -> str:
    rollout = f"  rollout: {{drain: {str(drain).lower()}}}\n"
    return scenarios.HEAD + body + cluster + rollout


def plan_of(text: str, cluster: ClusterContext | None = WORKER, gpu: bool = True) -> Plan:
    role = cluster.position.role if cluster else "worker"
    return render(load_document(text).spec, NodeContext(role, facts_for("ubuntu-22.04", gpu=gpu), cluster))


def digests(plan: Plan) -> dict[str, str]:
    return {s.name: s.digest for s in plan.steps}


def test_the_disruptive_steps_run_between_a_drain_and_an_uncordon_gate() -> None:
    plan = plan_of(doc())
    assert [(s.name, s.gate) for s in plan.steps] == [
        ("preflight", ""), ("drain", DRAIN_GATE), ("kernel", ""), ("kernel-verify", ""),
        ("nvidia-driver", ""), ("containerd", ""), ("custom-rt", ""), ("nvidia-container-toolkit", ""),
        ("uncordon", UNCORDON_GATE), ("kubeadm", ""), ("kubeadm-join", "cluster-join"), ("custom-last", ""),
    ]  # fmt: skip
    drain = plan.step("drain")
    assert drain is not None and drain.retries == 1 and not drain.secret_env and not drain.env
    for name in ("kernel", "kernel-verify", "nvidia-driver", "containerd", "nvidia-container-toolkit"):
        assert f"#   {name} {digests(plan)[name]}\n" in drain.script  # the wrapped steps, by digest
    assert "custom-rt" not in drain.script  # inside the window, but not disruptive


def test_without_drain_or_outside_a_cluster_nothing_is_wrapped() -> None:
    off = plan_of(doc(drain=False))
    assert "drain" not in digests(off) and "uncordon" not in digests(off)
    # The same plan, step for step, as a spec that never mentions a rollout.
    plain = plan_of(scenarios.HEAD + DISRUPTIVE + CLUSTER)
    assert digests(off) == digests(plain)
    # With drain on: the other steps keep their digests, only the two gates are added.
    on = digests(plan_of(doc()))
    assert {k: v for k, v in on.items() if k not in ("drain", "uncordon")} == digests(plain)
    # Single-node Kubernetes (no cluster context) and a cluster spec rendered without a position.
    single = doc(cluster="  kubernetes: {install: true, installer: kubeadm}\n")
    assert "drain" not in digests(plan_of(single, None))
    assert "drain" not in digests(plan_of(doc(), None))
    # A node with nothing disruptive (no GPU, no kernel, no runtime) has nothing to drain around.
    assert "drain" not in digests(plan_of(doc("  nvidiaDriver: {install: true}\n"), gpu=False))


def test_the_gates_run_again_exactly_when_a_wrapped_step_changes() -> None:
    before = digests(plan_of(doc()))
    runtime = digests(plan_of(doc(DISRUPTIVE.replace("1.7.27", "1.7.28"))))
    assert runtime["containerd"] != before["containerd"]
    assert runtime["drain"] != before["drain"] and runtime["uncordon"] != before["uncordon"]
    # Steps outside the disruptive ones change, the gates do not.
    custom = DISRUPTIVE.replace(
        "name: rt, phase: post-runtime, inline: 'true'", "name: rt, phase: post-runtime, inline: 'echo'"
    )
    custom = custom.replace(
        "name: last, phase: post-install, inline: 'true'", "name: last, phase: post-install, inline: 'ls'"
    )
    other = digests(plan_of(doc(custom)))
    assert other["custom-rt"] != before["custom-rt"] and other["custom-last"] != before["custom-last"]
    k8s = digests(plan_of(doc().replace("v1.31.0", "v1.31.4")))
    assert k8s["kubeadm"] != before["kubeadm"]
    for changed in (other, k8s):
        assert changed["drain"] == before["drain"] and changed["uncordon"] == before["uncordon"]
    # Control planes wrap their own steps the same way (a control plane's drain is its own).
    cp = digests(plan_of(doc(), context_for(load_document(doc()).spec.cluster, Position.INIT)))  # type: ignore[arg-type]
    assert "drain" in cp and "kubeadm-init" in cp


def _run(tmp_path: Path, script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "gate.sh"
    path.write_text(script)
    return subprocess.run(
        ["bash", str(path)], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", **env}, check=False
    )


@pytest.mark.parametrize("name", ["drain", "uncordon"])
def test_the_gate_step_succeeds_or_fails_with_what_the_controller_released(tmp_path: Path, name: str) -> None:
    step = plan_of(doc()).step(name)
    assert step is not None
    assert subprocess.run(["bash", "-n", "-c", step.script], check=False).returncode == 0
    ok = _run(
        tmp_path, step.script, {GATE_RESULT: GATE_DONE, GATE_MESSAGE: "w-1: kubectl drain done (on cp-1)"}
    )
    assert ok.returncode == 0 and ok.stdout == "w-1: kubectl drain done (on cp-1)\n"
    reason = "kubectl drain of w-1 failed on cp-1: exit code 1: error: cannot evict pod"
    failed = _run(tmp_path, step.script, {GATE_RESULT: "failed", GATE_MESSAGE: reason})
    assert failed.returncode == 1 and failed.stderr == f"ERROR: {reason}\n"
    bare = _run(tmp_path, step.script, {})
    assert bare.returncode == 1 and "without a result" in bare.stderr


# -- the offline preview of a cluster position -----------------------------------------------------


def test_a_preview_gets_the_context_the_orchestrator_gives_that_position() -> None:
    ha = scenarios.HEAD + (
        "  kubernetes: {install: true, installer: kubeadm}\n"
        "  cluster:\n    controlPlane: {count: 3, dedicated: true}\n"
        "    highAvailability: {enabled: true, endpoint: lb.example}\n"
    )
    spec = load_document(ha).spec
    got = preview_context(spec, "control-plane")
    assert got == ClusterContext(Position.CONTROL_PLANE, True, "lb.example:6443", True)
    assert preview_context(spec, "") is None
    with pytest.raises(ValueError, match="unknown cluster position 'leader'"):
        preview_context(spec, "leader")
    kind = load_document(
        scenarios.HEAD + "  kubernetes: {install: true, installer: kind}\n"
        "  containerRuntime: {install: true, name: docker}\n"
    ).spec
    with pytest.raises(ValueError, match="needs Kubernetes installed by kubeadm"):
        preview_context(kind, "worker")
    # Without spec.cluster, kubeadm makes a cluster of one: its positions are those of any cluster.
    single = load_document(scenarios.HEAD + "  kubernetes: {install: true}\n").spec
    assert preview_context(single, "init") == ClusterContext(Position.INIT)


def _render(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    path = tmp_path / "env.yaml"
    path.write_text(doc())
    code = main(["env", "render", "-f", str(path), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_env_render_previews_the_cluster_steps_of_a_position(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, worker, _ = _render(tmp_path, capsys, "--cluster-position", "worker")
    assert code == 0
    assert "# plan for environment matrix, role worker" in worker
    assert "kubeadm-join (phase kubernetes, timeout 1200s, gate=cluster-join)" in worker
    assert "drain (phase kernel, timeout 60s, gate=cluster-drain)" in worker
    assert "kubectl uncordon" in worker and "kubeadm-init" not in worker
    code, init, _ = _render(tmp_path, capsys, "--cluster-position", "init")
    assert code == 0 and "role control-plane" in init
    assert "# --- 11 kubeadm-init (phase kubernetes" in init and "kubeadm-join" not in init
    code, cp, _ = _render(tmp_path, capsys, "--cluster-position", "control-plane")
    assert code == 0 and "kubeadm-join" in cp and "env JOIN_CERT_KEY=<secret" in cp
    # Without a position: the base steps only, as before.
    code, base, _ = _render(tmp_path, capsys)
    assert (
        code == 0
        and "kubeadm-join" not in base
        and "kubeadm-init" not in base
        and "cluster-drain" not in base
    )
    code, _, err = _render(tmp_path, capsys, "--cluster-position", "worker", "--role", "control-plane")
    assert code != 0 and "leave out --role control-plane" in err


def test_env_render_refuses_a_position_without_a_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "env.yaml"
    kind = (
        "  kubernetes: {install: true, installer: kind}\n  containerRuntime: {install: true, name: docker}\n"
    )
    path.write_text(scenarios.HEAD + kind)
    assert main(["env", "render", "-f", str(path), "--cluster-position", "worker"]) != 0
    assert "needs Kubernetes installed by kubeadm" in capsys.readouterr().err
