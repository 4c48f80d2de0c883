"""Issue 13: controller replicas on one PostgreSQL database (real processes, real agents).

- ``tetherctl controller list`` (from a fresh working directory) shows both replicas, live, and
  exactly one leader; ``token create --print-join-command`` names both.
- kill -9 of the leader: the other replica takes the lease within seconds and the rollout it was
  driving goes on from the store, without a node being handed a step twice.
- control planes enrolling through both replicas at once: one init control plane is chosen.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import ca_hash, events, token, wait_state
from tests.integration.harness import BIN, Agent, Controller, wait_for
from tether.controller import __version__

pytestmark = pytest.mark.integration

LEASE_MOVES_S = 15.0  # the lease's try interval (2 s), the settle time (1 s), and slack for 2 cores


@pytest.fixture
def replicas(tmp_path: Path, pg_database: str) -> Iterator[tuple[Controller, Controller]]:
    """Two replicas of one store; each data dir holds an admin.conf pointed at its replica."""
    key = tmp_path / "store.key"
    made = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        c = Controller(tmp_path / name, extra_args=("--store", pg_database, "--store-key-file", str(key)))
        c.start()  # one after the other: the first creates the key file, the second reads it
        made.append(c)
    try:
        yield made[0], made[1]
    finally:
        for c in made:
            c.kill()


def ctl(config: Path, *args: str, cwd: Path | None = None) -> str:
    env = {**os.environ, "TETHER_CONFIG": str(config)}
    out = subprocess.run(
        [str(BIN / "tetherctl"), *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=60
    )
    assert out.returncode == 0, f"tetherctl {' '.join(args)}: {out.stderr}"
    return out.stdout


def listed(c: Controller, cwd: Path | None = None) -> list[dict[str, Any]]:
    return json.loads(ctl(c.config, "controller", "list", "-o", "json", cwd=cwd))  # type: ignore[no-any-return]


def leader_of(c: Controller) -> str:
    """The address of the replica ``c`` says leads ("" while none does)."""
    leaders = [r["address"] for r in listed(c) if r.get("leader") and r.get("live")]
    assert len(leaders) <= 1, leaders
    return leaders[0] if leaders else ""


def test_controller_list_shows_both_replicas_and_one_leader(
    replicas: tuple[Controller, Controller], tmp_path: Path
) -> None:
    a, b = replicas
    fresh = tmp_path / "fresh"
    fresh.mkdir()

    def both() -> list[dict[str, Any]] | None:
        rows = listed(a, cwd=fresh)
        return rows if len(rows) == 2 and sum(bool(r.get("leader")) for r in rows) == 1 else None

    rows = wait_for(both, timeout=20, what="both replicas listed, one leading")
    assert {r["address"] for r in rows} == {a.address, b.address}
    assert all(r["live"] and r["version"] == __version__ for r in rows)
    assert rows[0]["address"] == a.address  # the answering replica first
    assert leader_of(b) == leader_of(a)  # both say the same
    table = ctl(a.config, "controller", "list", cwd=fresh)
    assert "LEADER" in table and a.address in table and b.address in table
    ctl(a.config, "env", "apply", "-f", str(write_env(tmp_path / "e.yaml", "one")))
    join = ctl(a.config, "token", "create", "--env", "e", "--print-join-command").strip()
    assert f"--controller {a.address},{b.address} " in join


# -- the lease moves, and the rollout with it ---------------------------------------------------

STEP = "custom-driver"


def write_env(path: Path, version: str, *, script: str = "") -> Path:
    body = script or f"echo installed {version}"
    path.write_text(
        "apiVersion: holodeck.nvidia.com/v1alpha1\nkind: Environment\nmetadata: {name: e}\nspec:\n"
        "  rollout: {maxParallel: 1}\n"
        "  customTemplates:\n"
        "    - name: driver\n"
        "      inline: |\n"
        f"        # version {version}\n" + "".join(f"        {line}\n" for line in body.splitlines())
    )
    return path


def started_once(c: Controller, node: str, generation: int) -> int:
    evs = [e for e in events(c, node) if e["step"] == STEP and e["plan_generation"] == generation]
    return sum(1 for e in evs if e["kind"] == "started")


def test_kill_9_of_the_leader_moves_the_lease_and_the_rollout_goes_on(
    replicas: tuple[Controller, Controller], tmp_path: Path
) -> None:
    a, b = replicas
    wait_for(lambda: leader_of(a), timeout=20, what="a leader")
    leader, other = (a, b) if leader_of(a) == a.address else (b, a)
    ctl(other.config, "env", "apply", "-f", str(write_env(tmp_path / "v1.yaml", "1")))
    tok = token(other, "e", "--uses", "3")
    agents = [Agent(tmp_path, f"node-{i}", other) for i in range(1, 4)]  # streaming to the survivor
    try:
        for agent in agents:
            agent.start(tok, ca_hash(other))
        names = [agent.name for agent in agents]
        wait_state(other, names, "provisioned", timeout=90)
        # Generation 2 through the replica that does not lead: the leader drives it, one at a time.
        ctl(other.config, "env", "apply", "-f", str(write_env(tmp_path / "v2.yaml", "2", script="sleep 3")))
        wait_for(
            lambda: sum(started_once(other, n, 2) for n in names) >= 1,
            timeout=60,
            what="the first node to start generation 2",
        )
        leader.kill(signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: leader_of(other) == other.address, timeout=LEASE_MOVES_S, what="the lease to move")
        assert time.monotonic() - killed < LEASE_MOVES_S
        wait_for(lambda: rollout_state(other) == "complete", timeout=120, what="the rollout to complete")
        for n in names:
            assert started_once(other, n, 2) == 1, (n, events(other, n))  # no step handed twice
    finally:
        for agent in agents:
            agent.kill()


def rollout_state(c: Controller) -> str:
    return str(json.loads(ctl(c.config, "rollout", "status", "--env", "e", "-o", "json"))["state"])


# -- one init control plane ---------------------------------------------------------------------

CLUSTER = """\
apiVersion: holodeck.nvidia.com/v1alpha1
kind: Environment
metadata: {name: k}
spec:
  kubernetes: {install: true, installer: kubeadm}
  cluster:
    controlPlane: {count: 5}
    highAvailability: {enabled: true, endpoint: lb.example}
  customTemplates:
    - name: stop-here
      phase: pre-install
      inline: 'exit 3'
"""


def test_control_planes_enrolling_through_both_replicas_get_one_init_node(
    replicas: tuple[Controller, Controller], tmp_path: Path
) -> None:
    a, b = replicas
    (tmp_path / "k.yaml").write_text(CLUSTER)  # every plan fails first, before anything is installed
    ctl(a.config, "env", "apply", "-f", str(tmp_path / "k.yaml"))
    tok = token(a, "k", "--role", "control-plane", "--uses", "4")
    agents = [Agent(tmp_path, f"cp-{i}", (a, b)[i % 2]) for i in range(4)]
    try:
        starts = [threading.Thread(target=agent.start, args=(tok, ca_hash(a))) for agent in agents]
        for t in starts:
            t.start()
        for t in starts:
            t.join()
        names = [agent.name for agent in agents]
        wait_state(a, names, "failed", timeout=90)
        inits = [n for n in names if "kubeadm-init" in ctl(a.config, "plan", "--node", n)]
        assert len(inits) == 1, inits
        health = json.loads(ctl(b.config, "cluster", "health", "--env", "k", "-o", "json"))
        assert health["init_node"] == inits[0]  # the other replica says the same
    finally:
        for agent in agents:
            agent.kill()
