"""Issue 13, faults: two controller replicas on one PostgreSQL database, several real agents
(each given both addresses) running real bash steps, and the failures the issue names.

- kill -9 of one replica while its agents are mid-step: every agent re-attaches to the survivor
  and finishes its plan; each node's events (``tetherctl events -o json`` on the survivor) are
  1..N, no gap or duplicate.
- PostgreSQL crash-restarted while the agents stream output: nothing acknowledged to an agent is
  lost, the replicas recover by themselves (a change through one still reaches an agent streaming
  to the other), the plans finish.
- PostgreSQL down for 30 s: the agents run their steps to the end and keep the events in their
  outboxes; an admin call that writes fails with one line saying the store is unavailable; when
  the database is back the outboxes drain, the events are contiguous and the admin call works.

Each agent's first step prints a numbered line every 50 ms until the test creates the gate file,
so a fault always lands mid-step with output flowing, however slow the machine. Waits look through
the admin API in this process (the SDK tetherctl uses) and at the agents' own state (what
``tether-agent status`` prints), not through a process per look.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import ca_hash, events
from tests.integration.harness import BIN, Agent, Controller, wait_for
from tests.integration.test_agent_failover import ReplicaAgent, assert_contiguous
from tests.pgscratch import ScratchCluster
from tether.controller import wire
from tether.controller.client import Client
from tether.controller.client.errors import NotFoundError
from tether.nodeagent.session import state_summary

pytestmark = pytest.mark.integration

AFTER = 10  # lines each step prints once its gate is open
TICKER, TAIL = "custom-ticker", "custom-tail"


def env_doc(path: Path, gate: Path, name: str = "lab") -> str:
    """A plan of two steps: ``ticker`` prints ``tick 1..K`` until ``gate`` exists, then
    ``after 1..10``; ``tail`` prints ``tail 1..10``. Written to ``path``; returned."""
    path.write_text(
        "apiVersion: holodeck.nvidia.com/v1alpha1\nkind: Environment\n"
        f"metadata: {{name: {name}}}\nspec:\n  customTemplates:\n"
        "    - name: ticker\n"
        "      inline: |\n"
        "        i=0\n"
        f'        while [ ! -e "{gate}" ]; do i=$((i+1)); echo "tick $i"; sleep 0.05; done\n'
        f'        for j in $(seq 1 {AFTER}); do echo "after $j"; done\n'
        "    - name: tail\n"
        "      inline: |\n"
        f'        for j in $(seq 1 {AFTER}); do echo "tail $j"; sleep 0.02; done\n'
    )
    return path.read_text()


class Admin:
    """One replica's admin API, in this process (the SDK), as admin.conf of its data dir names it."""

    def __init__(self, c: Controller) -> None:
        self.client = Client.from_admin_conf(c.config, timeout=30)

    def events(self, node: str) -> list[dict[str, Any]]:
        """Every event of ``node``, as ``tetherctl events -o json`` has them (times aside)."""
        out: list[dict[str, Any]] = []
        while True:
            request = wire.admin.ListEventsRequest(node=node, after_seq=out[-1]["seq"] if out else 0)
            page = self.client.call(self.client.stub.ListEvents, request)
            if not page.events:
                return out
            out.extend(wire.event_from_pb(m).to_json() for m in page.events)

    def provisioned(self, names: list[str]) -> bool:
        states = {n.name: n.state for n in self.client.list_nodes()}
        return all(states.get(name) == "provisioned" for name in names)

    def connected(self, names: list[str]) -> bool:
        connected = {n.name: n.connected for n in self.client.list_nodes()}
        return all(connected.get(name) for name in names)

    def reran(self, node: str, before: int) -> bool:
        """``node``'s tail step succeeded after its first ``before`` events."""
        return any(e["step"] == TAIL and e["kind"] == "succeeded" for e in self.events(node)[before:])

    def ticking(self, node: str) -> bool:
        with contextlib.suppress(NotFoundError):  # not enrolled yet
            return any(e["step"] == TICKER and e["kind"] == "output" for e in self.events(node))
        return False


def check_events(evs: list[dict[str, Any]], node: str) -> None:
    """``node``'s events: 1..N, each step started once and succeeded, and every line the steps
    printed, once, in order."""
    assert_contiguous(evs)
    started = [e["step"] for e in evs if e["kind"] == "started"]
    assert len(started) == len(set(started)) and {TICKER, TAIL} <= set(started), (node, started)
    assert [e["step"] for e in evs if e["kind"] == "succeeded"] == started, (node, evs[-3:])
    ticker = [line for e in evs if e["step"] == TICKER for line in e.get("lines", [])]
    ticks = sum(1 for line in ticker if line.startswith("tick "))
    assert ticks > 0 and ticker == [f"tick {i}" for i in range(1, ticks + 1)] + [
        f"after {j}" for j in range(1, AFTER + 1)
    ], (node, ticker)
    tail = [line for e in evs if e["step"] == TAIL for line in e.get("lines", [])]
    assert tail == [f"tail {j}" for j in range(1, AFTER + 1)], (node, tail)


def status(agent: Agent) -> dict[str, Any]:
    """What ``tether-agent status`` prints for ``agent``: its outbox, its steps, its controllers."""
    return state_summary(agent.state_dir)


def until(agent: Agent, check: Callable[[dict[str, Any]], bool], what: str, timeout: float = 60) -> None:
    wait_for(lambda: check(status(agent)), timeout=timeout, what=f"{agent.name}: {what}")


def drained(s: dict[str, Any]) -> bool:
    return s["outbox_pending"] == 0


def finished(s: dict[str, Any]) -> bool:
    return bool(s["steps"]) and all(step["state"] == "succeeded" for step in s["steps"])


def streaming_to(agent: Agent) -> str:
    """The replica ``agent`` streams to now (the first of its controllers, as it remembers them
    after each Welcome)."""
    return str(status(agent)["controllers"][0])


@dataclasses.dataclass
class Fleet:
    a: Controller
    b: Controller
    admin_a: Admin
    admin_b: Admin
    agents: list[ReplicaAgent]
    gate: Path

    @property
    def names(self) -> list[str]:
        return [agent.name for agent in self.agents]


@pytest.fixture
def fleet_size() -> int:
    """How many agents ``fleet`` starts (a test overrides it with ``parametrize``)."""
    return 2


@pytest.fixture
def fleet(tmp_path: Path, pg_database: str, fleet_size: int) -> Iterator[Fleet]:
    """Replicas A and B of one store (each data dir holds an admin.conf pointed at it) and
    ``fleet_size`` agents on environment ``lab``: the even ones enrolled through A and given
    ``A,B``, the odd ones through B and given ``B,A``; all streaming, their ticker steps running
    until the test creates the gate file."""
    key = tmp_path / "store.key"
    replicas: list[Controller] = []
    admins: list[Admin] = []
    agents: list[ReplicaAgent] = []
    try:
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            c = Controller(tmp_path / name, extra_args=("--store", pg_database, "--store-key-file", str(key)))
            replicas.append(c)
            c.start()  # one after the other: the first creates the key file and the CA
        a, b = replicas
        admins += [Admin(a), Admin(b)]
        admin_a, admin_b = admins
        gate = tmp_path / "gate"
        admin_a.client.apply_environment(env_doc(tmp_path / "lab.yaml", gate))
        secret = admin_a.client.create_token("lab", uses=fleet_size).token
        for i in range(fleet_size):
            first, second = (a, b) if i % 2 == 0 else (b, a)
            agent = ReplicaAgent(tmp_path, f"n{i}", first, f"{first.address},{second.address}")
            agents.append(agent)
            agent.start(secret, ca_hash(a))
        for agent in agents:
            wait_for(lambda: admin_a.ticking(agent.name), timeout=120, what=f"{agent.name} to print")  # noqa: B023
        yield Fleet(a, b, admin_a, admin_b, agents, gate)
    finally:
        (tmp_path / "gate").touch()
        for agent in agents:
            agent.kill()
        for admin in admins:
            admin.client.close()
        for c in replicas:
            c.kill()


# -- kill -9 of a replica -------------------------------------------------------------------------


@pytest.mark.parametrize("fleet_size", [4])
def test_kill_9_of_a_replica_mid_step_every_agent_finishes_on_the_survivor(fleet: Fleet) -> None:
    a, b = fleet.a, fleet.b
    on_a = [agent for agent in fleet.agents if agent.controller is a]
    assert len(on_a) == 2
    for agent in fleet.agents:  # each streams to the replica it enrolled through
        assert streaming_to(agent) == agent.controller.address, agent.name

    a.kill(signal.SIGKILL)  # mid-step: every ticker is still printing
    time.sleep(1.0)  # output goes on into the outboxes while A's agents look for the survivor
    fleet.gate.touch()
    wait_for(lambda: fleet.admin_b.provisioned(fleet.names), timeout=120, what="every node provisioned")
    for agent in fleet.agents:
        until(agent, drained, "its outbox to drain")
        check_events(events(b, agent.name), agent.name)  # as an admin reads them from the survivor
    for agent in on_a:
        assert streaming_to(agent) == b.address, agent.name  # re-attached to the survivor
    assert fleet.admin_b.connected(fleet.names)


# -- PostgreSQL restarted -----------------------------------------------------------------------


def test_postgresql_restarted_while_agents_stream_loses_nothing_acknowledged(
    fleet: Fleet, pg_cluster: ScratchCluster
) -> None:
    acked = {agent.name: status(agent)["acked_seq"] for agent in fleet.agents}
    assert all(acked.values()), acked  # events were acknowledged before the crash
    pg_cluster.restart("immediate")  # a crash: whatever was not committed is gone
    for agent in fleet.agents:  # output is acknowledged again, through either replica
        done = acked[agent.name] + 20
        until(agent, lambda s, done=done: s["acked_seq"] > done, "output acknowledged again")  # type: ignore[misc]
    fleet.gate.touch()
    wait_for(lambda: fleet.admin_a.provisioned(fleet.names), timeout=120, what="every node provisioned")
    for agent in fleet.agents:
        until(agent, drained, "its outbox to drain")
        for admin in (fleet.admin_a, fleet.admin_b):
            check_events(admin.events(agent.name), agent.name)
    # The replicas came back by themselves: both write, and hear each other (LISTEN/NOTIFY): a
    # rerun asked of the replica an agent does not stream to reaches it.
    for admin in (fleet.admin_a, fleet.admin_b):
        assert admin.client.create_token("lab").token
    for agent in fleet.agents:
        other = fleet.admin_b if streaming_to(agent) == fleet.a.address else fleet.admin_a
        before = len(other.events(agent.name))
        other.client.call(
            other.client.stub.RerunSteps, wire.admin.RerunStepsRequest(node=agent.name, steps=[TAIL])
        )
        wait_for(
            functools.partial(other.reran, agent.name, before),
            timeout=30,
            what=f"the rerun through the other replica to reach {agent.name}",
        )
        assert_contiguous(other.events(agent.name))


# -- PostgreSQL down for 30 s -------------------------------------------------------------------

OUTAGE_S = 30.0
WRITES = (("env", "apply", "-f", "other.yaml"), ("token", "create", "--env", "lab"))


def user_dir(c: Controller, root: Path) -> Path:
    """A fresh working directory for an admin of ``c``: its admin.conf (0600) and a document."""
    workdir = root / c.data_dir.parent.name
    workdir.mkdir(parents=True)
    conf = workdir / "admin.conf"
    conf.write_bytes(c.config.read_bytes())
    conf.chmod(0o600)
    env_doc(workdir / "other.yaml", root / "never", name="other")
    return workdir


def user_ctl(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """tetherctl as a user runs it: in ``workdir``, naming its files there by relative paths."""
    env = {k: v for k, v in os.environ.items() if k != "TETHER_CONFIG"}
    env["HOME"] = str(workdir)
    return subprocess.run(
        [str(BIN / "tetherctl"), "--config", "admin.conf", *args],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_postgresql_down_for_30_s_agents_keep_their_outboxes_and_everything_resumes(
    fleet: Fleet, pg_cluster: ScratchCluster, tmp_path: Path
) -> None:
    users = [user_dir(c, tmp_path / "users") for c in (fleet.a, fleet.b)]
    calls = [(workdir, args) for workdir in users for args in WRITES]
    pg_cluster.stop("fast")
    down = time.monotonic()
    try:
        acked = {agent.name: status(agent)["acked_seq"] for agent in fleet.agents}
        # The agents go on: output piles up in their outboxes, nothing more is acknowledged ...
        for agent in fleet.agents:
            until(agent, lambda s: s["outbox_pending"] > 20, "its outbox to fill", timeout=30)
        fleet.gate.touch()
        for agent in fleet.agents:  # ... and they run their steps to the end
            until(agent, finished, "its steps to finish offline", timeout=30)
        with ThreadPoolExecutor(len(calls)) as pool:  # admin calls that write, on both replicas
            outs = list(pool.map(lambda call: user_ctl(call[0], *call[1]), calls))
        for (_, args), out in zip(calls, outs, strict=True):  # fail, with one line
            assert out.returncode != 0, (args, out.stdout)
            lines = out.stderr.strip().splitlines()
            assert len(lines) == 1 and "store unavailable" in lines[0], (args, out.stderr)
        for agent in fleet.agents:
            s = status(agent)
            assert s["acked_seq"] == acked[agent.name], (agent.name, s)
            assert s["outbox_pending"] == s["next_seq"] - 1 - s["acked_seq"] > 20, (agent.name, s)
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down)))
    finally:
        pg_cluster.start()
    for agent in fleet.agents:  # everything resumes by itself
        until(agent, drained, "its outbox to drain", timeout=90)
    wait_for(lambda: fleet.admin_a.provisioned(fleet.names), timeout=60, what="every node provisioned")
    for agent in fleet.agents:
        for admin in (fleet.admin_a, fleet.admin_b):
            check_events(admin.events(agent.name), agent.name)
    for workdir, args in calls:
        out = user_ctl(workdir, *args)
        assert out.returncode == 0 and out.stdout.strip(), (args, out.stderr)
