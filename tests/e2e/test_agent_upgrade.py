"""Issue 11's agent upgrade on real systemd nodes: three bootstrapped nodes are moved to another agent
version by ``tetherctl agent upgrade``; one node's staged bundle is damaged on its disk before the new
agent starts (its ``nodeagent/main.py`` no longer imports), so that new agent cannot start. Seen: two
nodes run the new version, and the third has gone back to the old one by itself (the launcher,
after the failed starts) and reports it in its hello (``rolled_back_from``, which the controller
keeps as the node's ``agent_rolled_back_from``, and the rollout counts it failed).
"""

from __future__ import annotations

import functools
import json
import os
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.testbed.testbed import Testbed
from tests.integration.agent_bundles import build_version
from tests.integration.harness import BIN, Controller, wait_for
from tether import nodeagent
from tether.bootstrap.bundle import default_cache_dir

pytestmark = pytest.mark.e2e
V2 = "0.1.0+e2e.2"
AGENTS = "/opt/tether/agent"
# On node3: once the old agent has switched `current` to the new bundle (and before systemd starts
# it), its main module is damaged on disk.
DAMAGE = (
    f"while ! [ -f {AGENTS}/upgrade.pending ]; do sleep 0.1; done; "
    f"b=$(sed -n 's/^to_bundle=//p' {AGENTS}/upgrade.pending); "
    f"echo 'raise ImportError(\"damaged on disk\")' > {AGENTS}/$b/lib/tether/nodeagent/main.py"
)


@pytest.fixture(scope="module")
def bed(testbed_factory: Callable[..., Testbed]) -> Iterator[Testbed]:
    testbed = testbed_factory(3)
    yield testbed
    assert testbed.down() == []


@pytest.fixture(scope="module")
def controller(bed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    workdir = tmp_path_factory.mktemp("upgrade-e2e")
    os.environ.setdefault("TETHER_BUNDLE_CACHE", str(default_cache_dir()))
    c = Controller(workdir, bed.describe()["bridge_ip"])
    bundle = build_version(V2, workdir)
    argv = ["agent-bundle", "add", str(bundle), "--data-dir", str(c.data_dir)]
    add = subprocess.run(
        [str(BIN / "tether-controller"), *argv],
        capture_output=True,
        text=True,
        check=False,
    )
    assert add.returncode == 0, add.stderr
    c.start()
    doc = workdir / "lab.yaml"
    doc.write_text(
        "apiVersion: holodeck.nvidia.com/v1alpha1\nkind: Environment\nmetadata:\n  name: lab\n"
        "spec:\n  rollout:\n    maxParallel: 3\n    maxFailures: 1\n"
        "  customTemplates:\n    - name: hello\n      inline: echo hello from $(hostname)\n"
    )
    c.ctl("env", "apply", "-f", str(doc))
    yield c
    c.kill()


def nodes(controller: Controller) -> dict[str, dict[str, Any]]:
    return {n["name"]: n for n in json.loads(controller.ctl("node", "list", "-o", "json").stdout)}


def only_running_bundle(bed: Testbed, name: str, running: str) -> bool:
    return sorted(bed.exec(name, f"ls -A {AGENTS}").stdout.split()) == sorted(["current", running])


def bootstrap(bed: Testbed, controller: Controller, workdir: Path) -> None:
    desc = bed.describe()
    inventory = workdir / "nodes.yaml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "defaults": {
                    "env": "lab",
                    "role": "worker",
                    "identity": desc["ssh_key"],
                    "known_hosts": desc["known_hosts"],
                },
                "nodes": [{"ssh": f"root@{n['ip']}", "name": n["name"]} for n in desc["nodes"]],
            }
        )
    )
    env = {**os.environ, "TETHER_CONFIG": str(controller.config)}
    argv = [str(BIN / "tetherctl"), "bootstrap", "--controller", controller.address]
    argv += ["--inventory", str(inventory)]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


# Three bootstraps, an upgrade and a rollback: minutes on a loaded 2-core machine (its waits, not
# pytest's default 300 s, bound it, so a failure says what it waited for).
@pytest.mark.timeout(720)
def test_three_nodes_upgrade_and_the_one_with_a_broken_bundle_rolls_back_by_itself(
    bed: Testbed, controller: Controller, tmp_path: Path
) -> None:
    bootstrap(bed, controller, tmp_path)
    names = ("node1", "node2", "node3")
    wait_for(
        lambda: all(nodes(controller).get(n, {}).get("state") == "provisioned" for n in names),
        120,
        what="three nodes provisioned",
    )
    assert {nodes(controller)[n]["agent_version"] for n in names} == {nodeagent.__version__}
    bed.exec("node3", ["systemd-run", "--unit=damage-bundle", "/bin/sh", "-c", DAMAGE])

    controller.ctl("agent", "upgrade", "--env", "lab", "--version", V2)

    def settled() -> dict[str, dict[str, Any]] | None:
        current = nodes(controller)
        versions = {n: current[n]["agent_version"] for n in names}
        back = rolled_back(controller, "node3")
        if versions["node1"] == versions["node2"] == V2 and back == V2:
            return current
        states = {n: (current[n]["state"], current[n]["connected"]) for n in names}
        raise AssertionError(f"versions {versions}, node3 rolled back from {back!r}, states {states}")

    current = wait_for(settled, 300, interval=2, what="two nodes on the new version, node3 rolled back")
    assert current is not None
    assert current["node3"]["agent_version"] == nodeagent.__version__
    assert current["node3"]["connected"]
    for name in ("node1", "node2"):
        assert current[name]["connected"] and rolled_back(controller, name) == ""
        running = bed.exec(name, f"readlink {AGENTS}/current").stdout.strip()
        # The new agent commits (removes the old bundle and the upgrade records) once its first
        # health report is out, a moment after the hello that told the controller its version.
        wait_for(
            functools.partial(only_running_bundle, bed, name, running),
            30,
            what=f"{name}: the upgrade committed (only the running bundle left)",
        )
    record = bed.exec("node3", f"cat {AGENTS}/upgrade.rolledback").stdout
    assert f"version={V2}" in record and "did not start" in record
    assert bed.exec("node3", "systemctl is-active tether-agent").stdout.strip() == "active"
    journal = bed.exec("node3", "journalctl -u tether-agent --no-pager -o cat").stdout
    assert "damaged on disk" in journal and "rolled back to bundle" in journal
    wait_for(
        lambda: (
            f"agent upgrade to {V2} rolled back"
            in controller.ctl("events", "--node", "node3", "-o", "json").stdout
        ),
        60,
        what="node3's rolled-back event",
    )
    events = controller.ctl("events", "--node", "node3", "-o", "json").stdout
    assert f"agent upgrade to {V2} rolled back" in events
    wait_for(
        lambda: "rolled back" in controller.ctl("rollout", "status", "--env", "lab").stdout,
        60,
        what="the rollout status to show node3 rolled back",
    )
    status = controller.ctl("rollout", "status", "--env", "lab").stdout
    assert "node3" in status and "rolled back" in status  # the rollout counts it failed


def rolled_back(controller: Controller, name: str) -> str:
    with closing(sqlite3.connect(controller.data_dir / "tether.db")) as db:
        row = db.execute("SELECT agent_rolled_back_from FROM nodes WHERE name=?", (name,)).fetchone()
    return str(row[0]) if row else ""
