"""Issue 13: an agent given several controller replicas (``--controller A,B``) fails over.

- Two replicas on one PostgreSQL store (one CA, one key file): replica A is killed with kill -9
  while the agent runs a step; the agent re-attaches to B, finishes its plan, and B holds its
  events 1..N with no gap or duplicate (the outbox resends from B's Welcome ``stored_seq``).
- One controller and an unreachable first address: the agent enrolls and streams through the
  second, and its state directory remembers the live one first.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import apply_env, ca_hash, events, token, wait_state
from tests.integration.harness import Agent, Controller, wait_for
from tether.controller.adminconf import AdminConfig

pytestmark = pytest.mark.integration

TICKERS = """\
    - name: ticker
      inline: |
        for i in $(seq 1 60); do echo "tick $i"; sleep 0.1; done
    - name: ticker-two
      inline: |
        for i in $(seq 1 30); do echo "tock $i"; sleep 0.1; done
"""


class ReplicaAgent(Agent):
    """An agent dialling ``addresses`` (comma-separated, in order) instead of one controller's."""

    def __init__(self, workdir: Path, name: str, controller: Controller, addresses: str) -> None:
        super().__init__(workdir, name, controller)
        self.addresses = addresses

    def _argv(self, *extra: str) -> list[str]:
        argv = super()._argv(*extra)
        argv[argv.index("--controller") + 1] = self.addresses
        return argv

    def remembered(self) -> list[str]:
        return list(json.loads((self.state_dir / "node.json").read_text())["controllers"])


def replica(workdir: Path, store_url: str, key_file: Path) -> Controller:
    workdir.mkdir(parents=True, exist_ok=True)
    c = Controller(workdir, extra_args=("--store", store_url, "--store-key-file", str(key_file)))
    c.start()
    return c


def admin_conf_for(source: Controller, target: Controller) -> None:
    """Every replica serves the same CA: the first replica's admin.conf, pointed at ``target``."""
    conf = AdminConfig.read(source.config)
    target.data_dir.mkdir(parents=True, exist_ok=True)
    dataclasses.replace(conf, controller=target.address).write(target.config)


def assert_contiguous(evs: list[dict[str, object]]) -> None:
    seqs = [int(str(e["seq"])) for e in evs]
    assert seqs == list(range(1, len(seqs) + 1)), seqs


@pytest.fixture
def replicas(tmp_path: Path, pg_database: str) -> Iterator[tuple[Controller, Controller]]:
    key = tmp_path / "store.key"
    a = replica(tmp_path / "a", pg_database, key)  # the first creates the CA and the key file
    b = replica(tmp_path / "b", pg_database, key)
    yield a, b
    b.kill()
    a.kill()


def test_kill_9_of_the_replica_mid_step_the_agent_finishes_on_the_other(
    replicas: tuple[Controller, Controller], tmp_path: Path
) -> None:
    a, b = replicas
    admin_conf_for(a, b)
    apply_env(a, tmp_path, "chatty", TICKERS)
    agent = ReplicaAgent(tmp_path, "n1", a, f"{a.address},{b.address}")
    try:
        agent.start(token(a, "chatty"), ca_hash(a))
        wait_for(
            lambda: any(e["step"] == "custom-ticker" and e["kind"] == "output" for e in events(a, "n1")),
            timeout=60,
            what="output to flow through replica A",
        )
        a.kill(signal.SIGKILL)
        wait_state(b, ["n1"], "provisioned", timeout=90)
        evs = events(b, "n1")
        assert_contiguous(evs)
        lines = [line for e in evs for line in e["lines"]]  # type: ignore[attr-defined]
        assert lines == [f"tick {i}" for i in range(1, 61)] + [f"tock {i}" for i in range(1, 31)]
        started = [e["step"] for e in evs if e["kind"] == "started"]
        assert started.count("custom-ticker") == started.count("custom-ticker-two") == 1  # none ran twice
        wait_for(lambda: '"outbox_pending": 0' in agent.status(), what="the outbox to drain")
        assert agent.remembered()[0] == b.address  # the survivor welcomed it: first from now on
        log = agent.log_path.read_text()
        assert f'"controller": "{b.address}", "stored_seq"' in log  # streaming to B
        # B's Welcome listed the live replicas, B first: that list replaced the remembered one.
        assert f'"controllers": "{b.address},' in log
    finally:
        agent.kill()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_agent_moves_to_the_next_address_when_its_controller_dies_mid_step(
    controller: Controller, tmp_path: Path
) -> None:
    """No PostgreSQL needed: the same data directory served again at the second address stands in
    for a replica B on the same store (the same CA, the same events)."""
    apply_env(controller, tmp_path, "chatty", TICKERS)
    first, second = controller.address, f"127.0.0.1:{free_port()}"
    agent = ReplicaAgent(tmp_path, "n1", controller, f"{first},{second}")
    try:
        agent.start(token(controller, "chatty"), ca_hash(controller))
        wait_for(
            lambda: any(
                e["step"] == "custom-ticker" and e["kind"] == "output" for e in events(controller, "n1")
            ),
            timeout=60,
            what="output to flow",
        )
        controller.kill(signal.SIGKILL)
        controller.start(int(second.rpartition(":")[2]))
        wait_state(controller, ["n1"], "provisioned", timeout=90)
        evs = events(controller, "n1")
        assert_contiguous(evs)
        lines = [line for e in evs for line in e["lines"]]  # type: ignore[attr-defined]
        assert lines == [f"tick {i}" for i in range(1, 61)] + [f"tock {i}" for i in range(1, 31)]
        assert agent.remembered()[0] == second
        assert f'"controller": "{second}", "stored_seq"' in agent.log_path.read_text()
    finally:
        agent.kill()


def test_an_unreachable_first_address_is_skipped_for_enrolling_and_streaming(
    controller: Controller, tmp_path: Path
) -> None:
    apply_env(controller, tmp_path, "quick", "    - name: hello\n      inline: echo hello\n")
    dead = "127.0.0.1:1"  # nothing listens on port 1
    agent = ReplicaAgent(tmp_path, "n1", controller, f"{dead},{controller.address}")
    try:
        agent.start(token(controller, "quick"), ca_hash(controller))
        wait_state(controller, ["n1"], "provisioned", timeout=60)
        assert_contiguous(events(controller, "n1"))
        # Enrolled through the live one: remembered first; the other is kept for later.
        assert agent.remembered()[0] == controller.address
        assert dead in agent.remembered()
        agent.kill()
        # A restart dials the dead address first again (the operator's order) and moves on.
        before = agent.log_path.read_text().count('"event": "streaming"')
        agent.start()
        wait_for(
            lambda: agent.log_path.read_text().count('"event": "streaming"') > before,
            timeout=30,
            what="the restarted agent to stream again",
        )
        restarted = agent.log_path.read_text().splitlines()[-20:]
        assert any(f'"controller": "{dead}"' in line and "stream lost" in line for line in restarted)
    finally:
        agent.kill()
