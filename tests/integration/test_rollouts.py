"""Issue 11: a new generation is a rollout under the environment's policy (real controller on
loopback, real agents, real bash).

Measured from the nodes' own step events: how many ran the changed step at once, which nodes
started it at all; and the CLI contract of ``env diff``, ``rollout ...`` and ``wait``.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import ca_hash, events, token, wait_state
from tests.integration.harness import Agent, Controller, wait_for

STEP = "custom-driver"  # the changed step: a customTemplate named driver


def write_env(path: Path, name: str, version: str, *, rollout: str = "", script: str = "") -> Path:
    """An environment whose one step records the version it installs (or runs ``script``)."""
    body = script or f"echo installed {version}"
    doc = (
        "apiVersion: holodeck.nvidia.com/v1alpha1\nkind: Environment\n"
        f"metadata:\n  name: {name}\nspec:\n"
        + (f"  rollout:\n{rollout}" if rollout else "")
        + "  customTemplates:\n"
        "    - name: driver\n"
        "      inline: |\n"
        f"        # version {version}\n" + "".join(f"        {line}\n" for line in body.splitlines())
    )
    path.write_text(doc)
    return path


@pytest.fixture
def fleet(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> Callable[..., list[Agent]]:
    """``fleet(n, first_doc)``: apply the document, start ``n`` agents on it, wait until provisioned."""

    def make(n: int, doc: Path, env: str = "gpu") -> list[Agent]:
        controller.ctl("env", "apply", "-f", str(doc))
        tok = token(controller, env, "--uses", str(n))
        made = [agents(f"node-{i}") for i in range(1, n + 1)]
        for a in made:
            a.start(tok, ca_hash(controller))
        wait_state(controller, [a.name for a in made], "provisioned", timeout=90)
        return made

    return make


def rollout(controller: Controller, env: str = "gpu") -> dict[str, Any]:
    out = controller.ctl("rollout", "status", "--env", env, "-o", "json")
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def runs_of(controller: Controller, node: str, generation: int) -> list[tuple[int, int]]:
    """(started, finished) times in ms of the changed step on ``node`` at ``generation``."""
    started: int | None = None
    spans = []
    for e in events(controller, node):
        if e["step"] != STEP or e["plan_generation"] != generation:
            continue
        if e["kind"] == "started":
            started = ms(str(e["time"]))
        elif e["kind"] in ("succeeded", "failed") and started is not None:
            spans.append((started, ms(str(e["time"]))))
            started = None
    return spans


def ms(rfc3339: str) -> int:
    """An event's RFC 3339 time (``2024-05-01T12:00:00.123Z``) in ms since the epoch."""
    return round(dt.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp() * 1000)


def most_at_once(spans: list[tuple[int, int]]) -> int:
    edges = sorted([(s, 1) for s, _ in spans] + [(f, -1) for _, f in spans], key=lambda x: (x[0], x[1]))
    now = peak = 0
    for _, d in edges:
        now += d
        peak = max(peak, now)
    return peak


def generation(controller: Controller, env: str = "gpu") -> int:
    return int(json.loads(controller.ctl("env", "get", env, "-o", "json").stdout)["generation"])


def test_max_parallel_two_never_runs_more_than_two_nodes_at_once(
    controller: Controller, fleet: Callable[..., list[Agent]], tmp_path: Path
) -> None:
    policy = "    maxParallel: 2\n"
    nodes = fleet(6, write_env(tmp_path / "a.yaml", "gpu", "550", rollout=policy))
    controller.ctl(
        "env",
        "apply",
        "-f",
        str(write_env(tmp_path / "b.yaml", "gpu", "560", rollout=policy, script="sleep 1.5")),
    )
    gen = generation(controller)
    wait_for(lambda: rollout(controller)["state"] == "complete", 90, what="the rollout to complete")
    spans = [span for a in nodes for span in runs_of(controller, a.name, gen)]
    assert len(spans) == 6, spans  # every node ran the changed step once
    assert most_at_once(spans) == 2, spans  # in batches of two, never more
    status = rollout(controller)
    assert (status["updated"], status["running"], status["pending"], status["failed"]) == (6, 0, 0, 0)
    assert status["generation"] == gen
    assert isinstance(status["generation"], int)


def test_max_failures_one_halts_after_the_second_failed_node(
    controller: Controller, fleet: Callable[..., list[Agent]], tmp_path: Path
) -> None:
    policy = "    maxParallel: 1\n    maxFailures: 1\n"
    nodes = fleet(4, write_env(tmp_path / "a.yaml", "gpu", "550", rollout=policy))
    controller.ctl(
        "env",
        "apply",
        "-f",
        str(write_env(tmp_path / "b.yaml", "gpu", "560", rollout=policy, script="exit 3")),
    )
    gen = generation(controller)
    wait_for(lambda: rollout(controller)["state"] == "halted", 60, what="the rollout to halt")
    time.sleep(3)  # long enough for a third node to start, were it admitted
    status = rollout(controller)
    assert (status["failed"], status["pending"], status["running"]) == (2, 2, 0), status
    assert "maxFailures" in status["reason"]
    started = [a.name for a in nodes if runs_of(controller, a.name, gen)]
    assert len(started) == 2, started  # nothing else started
    for n in status["nodes"]:
        if n["state"] == "failed":
            assert n["step"] == STEP
    # wait ends at once, naming a failed node and its step, or the halted rollout.
    out = controller.ctl("wait", "--env", "gpu", "--for", "provisioned", "--timeout", "30s", check=False)
    assert out.returncode == 1, out
    assert "halted" in out.stderr and STEP in out.stderr
    # The pending nodes still run the old generation's plan.
    listed = {n["name"]: n for n in json.loads(controller.ctl("node", "list", "-o", "json").stdout)}
    for n in status["nodes"]:
        if n["state"] == "pending":
            assert int(listed[n["name"]]["plan_generation"]) == gen - 1


def test_canary_pause_resume_and_wait_exit_codes(
    controller: Controller,
    fleet: Callable[..., list[Agent]],
    agents: Callable[[str], Agent],
    tmp_path: Path,
) -> None:
    policy = "    canary: 1\n"
    fleet(3, write_env(tmp_path / "a.yaml", "gpu", "550", rollout=policy))
    controller.ctl("env", "apply", "-f", str(write_env(tmp_path / "b.yaml", "gpu", "560", rollout=policy)))
    wait_for(lambda: rollout(controller)["state"] == "paused", 60, what="the canary pause")
    status = rollout(controller)
    assert (status["updated"], status["pending"]) == (1, 2), status
    assert "canary" in status["reason"]
    # A node that enrolls now gets the current generation at once, paused or not.
    fresh = agents("fresh")
    fresh.start(token(controller, "gpu"), ca_hash(controller))
    assert (
        controller.ctl(
            "wait", "--node", "fresh", "--for", "provisioned", "--timeout", "60s", timeout=120
        ).returncode
        == 0
    )
    assert runs_of(controller, "fresh", generation(controller))
    assert rollout(controller)["pending"] == 2
    # Not done while paused: wait times out with exit 2 and says what it waits for.
    out = controller.ctl("wait", "--env", "gpu", "--for", "provisioned", "--timeout", "3s", check=False)
    assert out.returncode == 2, out
    assert "timed out" in out.stderr and "2 not yet on the current generation" in out.stderr
    controller.ctl("rollout", "resume", "--env", "gpu")
    out = controller.ctl(
        "wait", "--env", "gpu", "--for", "provisioned", "--timeout", "60s", check=False, timeout=120
    )
    assert out.returncode == 0, out
    assert rollout(controller)["state"] == "complete"
    # A named node works too, and an unknown command state is refused.
    assert controller.ctl("wait", "--node", "node-1", "node-2", "--for", "provisioned").returncode == 0
    out = controller.ctl("rollout", "pause", "--env", "gpu", check=False)
    assert out.returncode != 0 and "complete" in out.stderr


def test_abort_keeps_the_rest_on_their_generation_and_undo_goes_back(
    controller: Controller, fleet: Callable[..., list[Agent]], tmp_path: Path
) -> None:
    policy = "    maxParallel: 1\n"
    nodes = fleet(3, write_env(tmp_path / "a.yaml", "gpu", "550", rollout=policy))
    gen_a = generation(controller)
    b = write_env(tmp_path / "b.yaml", "gpu", "560", rollout=policy, script="sleep 10")
    controller.ctl("env", "apply", "-f", str(b))
    gen_b = generation(controller)
    wait_for(lambda: rollout(controller)["running"] == 1, 30, what="the first node to be admitted")
    controller.ctl("rollout", "abort", "--env", "gpu")
    status = rollout(controller)
    assert status["state"] == "halted" and "aborted" in status["reason"]
    moved = [n["name"] for n in status["nodes"] if n["state"] != "pending"]
    assert len(moved) == 1  # the step takes 10 s: the abort came while the first node ran it
    wait_for(lambda: rollout(controller)["running"] == 0, 40, what="the admitted node to finish")
    time.sleep(2)
    status = rollout(controller)
    assert status["pending"] == 2 and status["state"] == "halted", status
    assert [a.name for a in nodes if runs_of(controller, a.name, gen_b)] == moved

    # Undo: a new generation holding A's document, under the same policy; the moved node runs A's
    # step again, the others had A all along (nothing re-runs there).
    out = controller.ctl("rollout", "undo", "--env", "gpu")
    assert "generation" in out.stdout
    gen_c = generation(controller)
    assert gen_c == gen_b + 1
    got = json.loads(controller.ctl("env", "get", "gpu", "-o", "json").stdout)
    assert got["document"] == (tmp_path / "a.yaml").read_text()
    wait_for(lambda: rollout(controller)["state"] == "complete", 60, what="the undo to complete")
    assert rollout(controller)["policy"]["max_parallel"] == "1"
    reran = [a.name for a in nodes if runs_of(controller, a.name, gen_c)]
    assert reran == moved
    assert generation(controller) == gen_c and gen_a < gen_b


def test_a_controller_restart_mid_rollout_resumes_it(
    controller: Controller, fleet: Callable[..., list[Agent]], tmp_path: Path
) -> None:
    policy = "    maxParallel: 1\n"
    nodes = fleet(3, write_env(tmp_path / "a.yaml", "gpu", "550", rollout=policy))
    controller.ctl(
        "env",
        "apply",
        "-f",
        str(write_env(tmp_path / "b.yaml", "gpu", "560", rollout=policy, script="sleep 2")),
    )
    gen = generation(controller)
    wait_for(lambda: rollout(controller)["running"] == 1, 30, what="the first node to be admitted")
    controller.kill()
    controller.start()  # the same port: the agents reconnect
    wait_for(lambda: rollout(controller)["state"] == "complete", 90, what="the resumed rollout to complete")
    spans = [span for a in nodes for span in runs_of(controller, a.name, gen)]
    assert most_at_once(spans) == 1, spans
    assert len({a.name for a in nodes if runs_of(controller, a.name, gen)}) == 3


def test_env_diff_and_dry_run(
    controller: Controller, fleet: Callable[..., list[Agent]], tmp_path: Path
) -> None:
    a = write_env(tmp_path / "a.yaml", "gpu", "550")
    fleet(2, a)
    same = controller.ctl("env", "diff", "-f", str(a), check=False)
    assert same.returncode == 0, same
    b = write_env(tmp_path / "b.yaml", "gpu", "560")
    out = controller.ctl("env", "diff", "-f", str(b), "-o", "json", check=False)
    assert out.returncode == 1, out
    doc = json.loads(out.stdout)
    assert doc["environment"] == "gpu"
    assert sorted(n["name"] for n in doc["nodes"]) == ["node-1", "node-2"]
    for n in doc["nodes"]:
        assert n["steps"] == [{"name": STEP, "change": "changed"}]
    text = controller.ctl("env", "apply", "--dry-run", "-f", str(b)).stdout
    assert f"~ {STEP} (changed)" in text and "2 of 2 node(s) would change" in text
    assert generation(controller) == 1  # nothing stored
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: holodeck.nvidia.com/v1alpha1\nkind: Environment\n"
        "metadata: {name: gpu}\nspec: {kernel: 3}\n"
    )
    assert controller.ctl("env", "diff", "-f", str(bad), check=False).returncode == 2


def test_events_until_done_ends_with_the_rollout(
    controller: Controller, fleet: Callable[..., list[Agent]], tmp_path: Path
) -> None:
    fleet(2, write_env(tmp_path / "a.yaml", "gpu", "550"))
    until_done = ["events", "--env", "gpu", "--follow", "--until-done"]
    # Already provisioned: it ends at once.
    assert controller.ctl(*until_done, timeout=30, check=False).returncode == 0
    failing = write_env(tmp_path / "b.yaml", "gpu", "560", script="sleep 1; exit 4")
    controller.ctl("env", "apply", "-f", str(failing))
    out = controller.ctl(*until_done, timeout=60, check=False)
    assert out.returncode == 1, out
    assert STEP in out.stderr and "failed" in out.stderr
    assert f"started   {STEP}" in out.stdout  # the events were shown until then


def test_agent_upgrade_is_a_rollout_of_a_version_the_controller_holds(
    controller: Controller, fleet: Callable[..., list[Agent]], tmp_path: Path
) -> None:
    fleet(1, write_env(tmp_path / "a.yaml", "gpu", "550"))
    unknown = controller.ctl("agent", "upgrade", "--env", "gpu", "--version", "9.9.9", check=False)
    assert unknown.returncode != 0 and "no agent bundle of version '9.9.9'" in unknown.stderr
    before = generation(controller)
    out = controller.ctl("agent", "upgrade", "--env", "gpu", timeout=180)  # the controller's own version
    assert "agent 0.1.0" in out.stdout
    status = rollout(controller)
    assert status["agent_version"] == "0.1.0" and status["generation"] == before + 1
    env = json.loads(controller.ctl("env", "get", "gpu", "-o", "json").stdout)
    assert env["agent_version"] == "0.1.0"
    listed = json.loads(controller.ctl("agent", "bundles", "-o", "json").stdout)
    assert [b["version"] for b in listed] == ["0.1.0"] and len(listed[0]["sha256"]) == 64
