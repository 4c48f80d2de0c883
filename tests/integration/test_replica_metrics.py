"""``serve --store URL --store-key-file F --metrics-listen``: every replica on PostgreSQL serves its
metrics and probes (real processes, a real agent, the scratch cluster).

- the fleet gauges come from the store's view: a node streaming to the other replica counts as
  provisioned, not offline, on both; each replica says whether it leads and how many are live;
- /readyz asks the database: "FAIL store: store unavailable: ..." while PostgreSQL is down, ok
  again once it is back; /metrics still answers meanwhile (from memory).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import ca_hash, token, wait_state
from tests.integration.harness import Agent, Controller, wait_for
from tests.integration.test_metrics import Samples, get, promtool_check, samples
from tests.pgscratch import ScratchCluster

pytestmark = pytest.mark.integration

Metered = tuple[Controller, str]  # a replica and its metrics address


def start_replica(workdir: Path, url: str, key: Path) -> Metered:
    workdir.mkdir()
    c = Controller(
        workdir,
        extra_args=("--store", url, "--store-key-file", str(key), "--metrics-listen", "127.0.0.1:0"),
    )
    c.start()
    assert c.proc is not None and c.proc.stdout is not None
    line = c.proc.stdout.readline()
    m = re.fullmatch(r"metrics on (127\.0\.0\.1:\d+)\n", line)
    if not m:
        c.kill()
        raise AssertionError(f"expected 'metrics on HOST:PORT' after the listening line, got {line!r}")
    return c, f"http://{m.group(1)}"


@pytest.fixture
def pair(tmp_path: Path, pg_database: str) -> Iterator[tuple[Metered, Metered]]:
    made: list[Metered] = []
    try:
        for name in ("a", "b"):  # one after the other: the first writes the key file
            made.append(start_replica(tmp_path / name, pg_database, tmp_path / "store.key"))
        yield made[0], made[1]
    finally:
        for c, _ in made:
            c.kill()


def scrape(base: str) -> Samples:
    status, text = get(f"{base}/metrics")
    assert status == 200, text
    return samples(text)


def write_env(path: Path) -> Path:
    path.write_text(
        "apiVersion: holodeck.nvidia.com/v1alpha1\nkind: Environment\nmetadata: {name: e}\nspec:\n"
        "  customTemplates:\n    - name: driver\n      inline: |\n        echo installed\n"
    )
    return path


E = (("environment", "e"),)
PROVISIONED = ("tether_nodes", (*E, ("state", "provisioned")))
OFFLINE = ("tether_nodes", (*E, ("state", "offline")))
LEADER = ("tether_replica_leader", ())
LIVE = ("tether_replicas_live", ())
AGENTS = ("tether_agents_connected", ())


@pytest.mark.timeout(300)
def test_both_replicas_count_a_node_streaming_to_one_and_say_who_leads(
    pair: tuple[Metered, Metered], tmp_path: Path
) -> None:
    (a, a_base), (b, b_base) = pair
    a.ctl("env", "apply", "-f", str(write_env(tmp_path / "e.yaml")))
    agent = Agent(tmp_path, "node-1", b)  # its stream is b's
    agent.start(token(a, "e"), ca_hash(a))
    try:
        wait_state(a, ["node-1"], "provisioned", timeout=90)  # as a's `node list` shows it

        def counted(base: str) -> Samples | None:
            got = scrape(base)
            return got if got.get(PROVISIONED) == 1 and got.get(LIVE) == 2 else None

        on_a = wait_for(lambda: counted(a_base), 30, what="a's metrics: node-1 provisioned, 2 replicas")
        on_b = wait_for(lambda: counted(b_base), 30, what="b's metrics: node-1 provisioned, 2 replicas")
        for got in (on_a, on_b):
            assert got[OFFLINE] == 0
        assert on_a[AGENTS] == 0 and on_b[AGENTS] == 1  # each replica its own streams
        wait_for(lambda: scrape(a_base)[LEADER] + scrape(b_base)[LEADER] == 1, 30, what="exactly one leader")
        for base in (a_base, b_base):
            status, text = get(f"{base}/metrics")
            assert status == 200
            promtool_check(text)
            status, body = get(f"{base}/readyz")
            assert status == 200 and "ok store" in body and "info leader:" in body, body
        leading = a_base if scrape(a_base)[LEADER] == 1 else b_base
        assert "info leader: this replica leads" in get(f"{leading}/readyz")[1]
    finally:
        agent.kill()


@pytest.mark.timeout(300)
def test_readiness_fails_while_the_database_is_down_and_recovers(
    tmp_path: Path, pg_database: str, pg_cluster: ScratchCluster
) -> None:
    c, base = start_replica(tmp_path / "a", pg_database, tmp_path / "store.key")
    try:
        status, body = get(f"{base}/readyz")
        assert status == 200 and "ok store" in body and f"ok grpc {c.address}" in body, body
        wait_for(lambda: scrape(base).get(LEADER) == 1, 30, what="the one replica leads")
        assert scrape(base)[LIVE] == 1
        pg_cluster.stop()
        try:

            def failing() -> str | None:
                status, body = get(f"{base}/readyz")
                return body if status == 503 else None

            body = wait_for(failing, 30, what="/readyz to fail while PostgreSQL is down")
            store_line = next(line for line in body.splitlines() if "store" in line)
            assert store_line.startswith("FAIL store: store unavailable: "), body
            assert "ok event loop" in body and f"ok grpc {c.address}" in body  # only the store fails
            assert get(f"{base}/healthz") == (200, "ok event loop\n")
            assert scrape(base)[AGENTS] == 0  # /metrics answers from memory meanwhile
        finally:
            pg_cluster.start()

        def ready() -> str | None:
            status, body = get(f"{base}/readyz")
            return body if status == 200 else None

        body = wait_for(ready, 60, what="/readyz to pass once PostgreSQL is back")
        assert "ok store" in body
    finally:
        c.kill()
