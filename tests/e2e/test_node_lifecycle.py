"""Issue 12's node lifecycle on real systemd nodes: a revoked agent stops, a reset node is clean.

A real controller listens on the testbed bridge; ``tetherctl bootstrap`` adopts the nodes (agents
under systemd, the unit from packaging/systemd). Proven here:

* ``tetherctl node revoke``: within seconds the unit is inactive (not failed), systemd does not
  start it again (``NRestarts`` stays), and the journal has the agent's one "was revoked" line;
* ``tetherctl node reset --wait``: the unit, /etc/tether, /var/lib/tether and /opt/tether are gone,
  no tether process runs, ``node list`` no longer shows the node, and a second bootstrap installs
  it afresh (a new enrollment);
* in a kubeadm cluster (stand-in kubeadm, 1 control plane + 1 worker), the worker's reset drains it,
  runs ``kubeadm reset -f`` on it, and the API server no longer lists it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_cluster import Lab, environment
from tests.e2e.testbed.testbed import Testbed
from tests.integration.harness import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
PLAIN_ENV = """\
apiVersion: holodeck.nvidia.com/v1alpha1
kind: Environment
metadata:
  name: life
spec:
  customTemplates:
    - name: hello
      inline: echo "provisioned $(hostname)" > /var/tmp/tether-hello
"""
LEFTOVERS = "/etc/tether /var/lib/tether /opt/tether /etc/systemd/system/tether-agent.service"


@pytest.fixture
def lab(fresh_testbed: Callable[..., Testbed], tmp_path: Path) -> Iterator[Lab]:
    made = Lab(fresh_testbed(2), tmp_path)
    yield made
    made.close()


def nodes(lab: Lab) -> dict[str, dict[str, Any]]:
    return {n["name"]: n for n in json.loads(lab.ctl("node", "list", "-o", "json").stdout)}


def provisioned(lab: Lab, name: str) -> dict[str, Any]:
    def ready() -> dict[str, Any]:
        n = nodes(lab).get(name) or {}
        return n if n.get("connected") and n.get("state") == "provisioned" else {}

    return wait_for(
        ready,
        timeout=120,
        interval=1,
        what=f"{name} connected and provisioned",
    )


def unit(bed: Testbed, name: str) -> dict[str, str]:
    """``systemctl show tether-agent``'s state properties on ``name``."""
    out = bed.exec(
        name,
        "systemctl show tether-agent -p ActiveState -p SubState -p Result -p NRestarts "
        "-p ExecMainStatus -p UnitFileState -p LoadState",
        check=False,
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def tether_processes(bed: Testbed, name: str) -> str:
    """Processes on ``name`` whose command line mentions tether (ps itself excluded)."""
    out = bed.exec(name, "ps -eo pid=,args=", check=False).stdout
    return "\n".join(line for line in out.splitlines() if "tether" in line and "ps -eo" not in line)


def where_is_the_agent(bed: Testbed, name: str) -> str:
    """The unit, tether's processes and files, and the journal's tail on ``name`` (failure messages)."""
    journal = bed.exec(name, "journalctl -u tether-agent --no-pager -o cat | tail -n 40", check=False).stdout
    files = bed.exec(name, f"ls -d {LEFTOVERS} 2>&1", check=False).stdout
    return f"unit: {unit(bed, name)}\nprocesses:\n{tether_processes(bed, name)}\nfiles:\n{files}\n{journal}"


def test_a_revoked_agent_stops_and_the_unit_leaves_it_stopped(lab: Lab) -> None:
    bed = lab.bed
    lab.apply(PLAIN_ENV, "life")
    lab.bootstrap("life", {"node1": "worker"})
    provisioned(lab, "node1")
    assert unit(bed, "node1")["ActiveState"] == "active"
    before = int(unit(bed, "node1")["NRestarts"])

    started = time.monotonic()
    lab.ctl("node", "revoke", "node1")

    def down() -> dict[str, str]:
        u = unit(bed, "node1")
        return u if u["ActiveState"] in ("inactive", "failed") else {}

    stopped = wait_for(
        down,
        timeout=60,
        interval=0.2,
        what="the revoked agent's unit to stop",
    )
    seconds = time.monotonic() - started
    print(f"\nrevoked agent stopped after {seconds:.1f}s: {stopped}")
    assert stopped["ActiveState"] == "inactive", stopped  # not failed
    assert stopped["ExecMainStatus"] == "77", stopped
    name = "node1"
    assert bed.exec(name, "systemctl is-active tether-agent", check=False).stdout.strip() == "inactive"
    for _ in range(15):  # RestartSec=5s: a restart would have come by now, twice
        time.sleep(1)
        now = unit(bed, name)
        assert now["ActiveState"] == "inactive" and int(now["NRestarts"]) == before, now
    assert tether_processes(bed, name) == ""
    journal = bed.exec(name, "journalctl -u tether-agent --no-pager -o cat").stdout
    revoked = [line for line in journal.splitlines() if "was revoked" in line]
    assert revoked == [
        "tether-agent: node node1 was revoked by the controller; enroll again with a new token"
    ], journal[-3000:]


def wait_agent_gone(bed: Testbed, name: str) -> None:
    """Until the reset agent has stopped and removed itself (it does so after its last event)."""

    def agent_gone() -> dict[str, str] | None:
        u = unit(bed, name)
        return u if u.get("ActiveState") == "inactive" and not tether_processes(bed, name) else None

    try:
        wait_for(agent_gone, timeout=60, interval=0.5, what="the agent to have removed itself")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{where_is_the_agent(bed, name)}") from None


def test_a_reset_node_is_clean_and_bootstraps_afresh(lab: Lab) -> None:
    bed, name = lab.bed, "node2"
    lab.apply(PLAIN_ENV, "life")
    lab.bootstrap("life", {name: "worker"})
    first = provisioned(lab, name)
    key = bed.exec(name, "sha256sum /var/lib/tether/key.pem").stdout

    out = lab.ctl("node", "reset", name, "--wait", "--wait-timeout", "2m")
    assert f"node/{name} reset: the node left and is forgotten" in out.stdout, out.stdout + out.stderr
    assert name not in nodes(lab)

    wait_agent_gone(bed, name)
    bed.exec(name, "systemctl daemon-reload")
    assert unit(bed, name)["LoadState"] == "not-found"  # its unit file is gone
    assert bed.exec(name, f"ls -d {LEFTOVERS} 2>/dev/null", check=False).stdout == ""
    assert "tether-agent" not in bed.exec(name, "systemctl list-units --all --no-legend").stdout

    def reset_journal() -> str:
        text = bed.exec(name, "journalctl -u tether-agent --no-pager -o cat").stdout
        return text if "Deactivated successfully." in text and "was reset: removed" in text else ""

    try:
        journal = wait_for(
            reset_journal, timeout=30, interval=0.5, what="the reset agent's last journal lines"
        )
    except AssertionError:
        journal = bed.exec(name, "journalctl -u tether-agent --no-pager -o cat").stdout
    assert f"tether-agent: node {name} was reset: removed tether-agent.service" in journal, journal[-3000:]
    assert "could not remove" not in journal, journal[-3000:]
    assert "tether-agent.service: Deactivated successfully." in journal, journal[-3000:]  # exit 78
    assert "Failed with result" not in journal, journal[-3000:]

    # A new machine to tether: the bootstrap installs it and it enrolls again, from scratch.
    lab.bootstrap("life", {name: "worker"})
    again = provisioned(lab, name)
    assert again["enrolled"] > first["enrolled"]  # RFC 3339 UTC: enrolled again, later
    assert bed.exec(name, "sha256sum /var/lib/tether/key.pem").stdout != key  # a new identity
    assert unit(bed, name)["ActiveState"] == "active"
    assert bed.exec(name, "cat /var/tmp/tether-hello").stdout.strip() == f"provisioned {name}"


def test_a_worker_reset_drains_it_runs_kubeadm_reset_and_deletes_its_node(lab: Lab) -> None:
    bed = lab.bed
    lab.apply(environment(bed, "k1", control_planes=1, workers=1), "k1")
    lab.bootstrap("k1", {"node1": "control-plane", "node2": "worker"})
    lab.wait_available("k1", ["node1", "node2"])
    assert "node2" in lab.kubectl_nodes("node1")

    out = lab.ctl("node", "reset", "node2", "--wait", "--wait-timeout", "4m", check=False)
    assert "node/node2 reset: the node left and is forgotten" in out.stdout, (
        f"{out.stdout}{out.stderr}\n{lab.summary(['node1', 'node2'])}\n{where_is_the_agent(bed, 'node2')}"
    )
    assert "node2" not in lab.kubectl_nodes("node1")  # kubectl delete node ran on the control plane
    assert set(nodes(lab)) == {"node1"}
    cordons = bed.exec("node1", "cat /var/log/kubeadm-standin/apiserver.log").stdout
    changes = [json.loads(line) for line in cordons.splitlines() if '"unschedulable"' in line]
    assert [c["value"] for c in changes if c["node"] == "node2"] == [True], cordons[-2000:]  # drained
    kubeadm_log = bed.exec("node2", "cat /var/log/kubeadm-standin/kubeadm.log").stdout
    calls = [json.loads(line)["argv"] for line in kubeadm_log.splitlines()]
    assert ["reset", "-f"] in calls, kubeadm_log[-2000:]
    assert bed.exec("node2", "ls -d /etc/kubernetes/kubelet.conf 2>/dev/null", check=False).stdout == ""
    wait_agent_gone(bed, "node2")  # the controller forgets it on its last event; then it removes itself
    assert bed.exec("node2", f"ls -d {LEFTOVERS} 2>/dev/null", check=False).stdout == ""
    health = lab.health("k1")  # not Available: the spec still asks for a worker
    assert [n["name"] for n in health["nodes"]] == ["node1"], health
