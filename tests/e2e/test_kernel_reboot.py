"""Issue 14: the kernel step's reboot on a real systemd node (holodeck's kernel pin reboots and resumes).

A real controller listens on the testbed bridge; ``tetherctl bootstrap`` adopts one node (the agent under
systemd, its default ``--reboot-command``: ``systemctl reboot``). The environment pins
``spec.kernel.version`` to the test-fixture kernel of the testbed's local apt repo
(``testbed/kernelpkgs.py``: ``linux-image-<KERNEL>``, ``linux-headers-<KERNEL>`` and a boot-chain
stand-in for update-grub, update-initramfs, the boot loader and ``uname -r``), with a custom step before
the kernel (pre-install) and one after it (post-install). The production kernel and kernel-verify
scripts run unchanged: apt installs the packages, the step makes the kernel grub's default and asks for
the reboot; kernel-verify passes only if the node then booted grub's default (``uname -r``).

Shown from the controller's events, the agent's step journal and the node:

* the kernel step's INFO "rebooting to finish the step", then the node really reboots (the testbed's
  nspawn exits 133 once and comes back; a new boot id; the old boot's /run is gone), then the step's
  SUCCEEDED "node rebooted; step complete" with no step started in between;
* kernel-verify ran once, on the new boot: its only STARTED event (time-stamped by the agent when it
  queued it) is later than the new boot's init started, so the old boot's agent (dead by then) did not
  start it; and the agent's step journal on the node records its result under the new boot id (the
  agent's boot id is read once, when its process starts, and no process outlives a boot). It finds the
  pinned kernel running. The journal puts the kernel step's resume and the after-step on the new boot id
  and the before-step on the old one, and the after-step prints the new boot id itself;
* nothing before the kernel step runs again: each step has exactly one STARTED event, none is skipped
  or failed, the before-step ran once on the old boot id; events are numbered 1..N without a gap;
* the controller's facts for the node carry the new boot id.

The before-step holds the reboot back until the test has seen ``tetherctl bootstrap`` return (the test
then creates ``GO`` on the node): a node that rebooted while the bootstrap still did its SSH work would
cut it short. The step fails, saying why, when that signal does not come within ``GO_WAIT`` seconds.
"""

from __future__ import annotations

import datetime as dt
import json
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.test_cluster import Lab
from tests.e2e.testbed import kernelpkgs
from tests.e2e.testbed.testbed import Testbed
from tests.integration.harness import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

NODE = "node1"
ENV = "kernel-pin"
KERNEL = kernelpkgs.KERNEL
STEPS = [
    "preflight",
    "package-repositories",
    "custom-before-kernel",
    "kernel",
    "kernel-verify",
    "custom-after-kernel",
]
BOOTS = "/var/lib/tether-e2e/boots"  # one line per run of the custom steps: "<step> <boot id>"
GO = "/run/tether-e2e-go"  # the test creates it once `tetherctl bootstrap` has returned (gone at reboot)
GO_WAIT = 300  # seconds the before-step waits for GO, then fails
AGENT_DB = "/var/lib/tether/state.db"  # the agent's state: its step journal records each step's boot id

BEFORE = f"""\
boot=$(cat /proc/sys/kernel/random/boot_id)
echo "before-kernel on boot $boot"
mkdir -p {Path(BOOTS).parent}
echo "before-kernel $boot" >>{BOOTS}
# (test only) the next step reboots the node: not before the test says tetherctl bootstrap returned
deadline=$((SECONDS + {GO_WAIT}))
until [ -e {GO} ]; do
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "ERROR: no {GO} after {GO_WAIT} s: the test never said tetherctl bootstrap returned" >&2
    exit 1
  fi
  sleep 0.5
done
echo "tetherctl bootstrap has returned ({GO}); the kernel step may reboot"
"""

AFTER = f"""\
boot=$(cat /proc/sys/kernel/random/boot_id)
echo "after-kernel on boot $boot, kernel $(uname -r)"
echo "after-kernel $boot" >>{BOOTS}
"""


def environment(bed: Testbed) -> str:
    desc = bed.describe()
    with urllib.request.urlopen(desc["apt_repo_key_url"], timeout=10) as reply:
        key = reply.read().decode()
    doc = {
        "apiVersion": "holodeck.nvidia.com/v1alpha1",
        "kind": "Environment",
        "metadata": {"name": ENV},
        "spec": {
            "packageRepositories": {"apt": [{"url": desc["apt_repo_url"], "key": key}]},
            "kernel": {"version": KERNEL},
            "customTemplates": [
                {"name": "before-kernel", "phase": "pre-install", "inline": BEFORE},
                {"name": "after-kernel", "phase": "post-install", "inline": AFTER},
            ],
        },
    }
    return str(yaml.safe_dump(doc, sort_keys=False))


@pytest.fixture
def lab(fresh_testbed: Callable[..., Testbed], tmp_path: Path) -> Iterator[Lab]:
    made = Lab(fresh_testbed(1), tmp_path)
    yield made
    made.close()


def seconds(rfc3339: str) -> float:
    return dt.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def boot_id(bed: Testbed) -> str:
    return bed.exec(NODE, "cat /proc/sys/kernel/random/boot_id").stdout.strip()


def boot_started(bed: Testbed) -> float:
    """When this boot's init started (epoch seconds): systemd's userspace timestamp, on the monotonic
    clock the node shares with the host, converted on the node in one go."""
    script = (
        "import subprocess, time\n"
        "mono = subprocess.run(['systemctl', 'show', '-p', 'UserspaceTimestampMonotonic', '--value'],\n"
        "                      capture_output=True, text=True, check=True).stdout.strip()\n"
        "print(time.time() - (time.monotonic() - int(mono) / 1e6))\n"
    )
    return float(bed.exec(NODE, ["python3", "-c", script]).stdout)


def journal(bed: Testbed) -> dict[str, tuple[str, str]]:
    """The agent's step journal on the node, read-only: ``{step: (state, boot id of its last record)}``
    (a step's current entry is its newest row, as in ``nodeagent/journal.py``)."""
    script = (
        "import json, sqlite3\n"
        f"db = sqlite3.connect('file:{AGENT_DB}?mode=ro', uri=True)\n"
        "rows = db.execute('SELECT step, state, boot_id FROM journal j WHERE NOT EXISTS'\n"
        "                  ' (SELECT 1 FROM journal o WHERE o.step = j.step AND o.rowid > j.rowid)')\n"
        "print(json.dumps({step: [state, boot] for step, state, boot in rows}))\n"
    )
    found = json.loads(bed.exec(NODE, ["python3", "-c", script]).stdout)
    return {step: (state, boot) for step, (state, boot) in found.items()}


def describe(lab: Lab) -> dict[str, Any]:
    return json.loads(lab.ctl("node", "describe", NODE, "-o", "json").stdout)  # type: ignore[no-any-return]


def provisioned(lab: Lab) -> dict[str, Any]:
    def ready() -> dict[str, Any]:
        nodes = {n["name"]: n for n in json.loads(lab.ctl("node", "list", "-o", "json").stdout)}
        node = nodes.get(NODE) or {}
        if node.get("state") == "failed":
            pytest.fail(f"{NODE} failed\n{lab.summary([NODE])}")
        return node if node.get("connected") and node.get("state") == "provisioned" else {}

    try:
        return wait_for(ready, timeout=240, interval=1, what=f"{NODE} connected and provisioned")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{lab.summary([NODE])}") from None


@dataclass(frozen=True)
class Events:
    """The node's events as the controller has them."""

    all: list[dict[str, Any]]

    @property
    def summary(self) -> str:
        """One line per event but output (for failure messages)."""
        return "\n".join(
            f"{e['seq']:>3} {e['time']} {e['step'] or '-':<22} {e['kind']:<9} {e['message']}"
            for e in self.all
            if e["kind"] != "output"
        )

    def of(self, step: str, kind: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.all if e["step"] == step and (kind is None or e["kind"] == kind)]

    def only(self, step: str, kind: str) -> dict[str, Any]:
        found = self.of(step, kind)
        assert len(found) == 1, f"{step}: {len(found)} {kind} events\n{self.summary}"
        return found[0]

    def text(self, step: str) -> str:
        """The step's messages and output lines."""
        return "\n".join(line for e in self.of(step) for line in [e["message"], *e["lines"]] if line)


@dataclass(frozen=True)
class Boots:
    first: str  # the boot id before the plan
    new: str  # the boot id once the node is provisioned
    new_started: float  # when the new boot's init started (epoch seconds)


def check_each_step_once(lab: Lab, events: Events) -> None:
    """Events numbered 1..N without a gap; the plan's steps, each started exactly once; nothing failed
    or was skipped."""
    assert [e["seq"] for e in events.all] == list(range(1, len(events.all) + 1)), events.summary
    assert [s["name"] for s in describe(lab)["steps"]] == STEPS
    for step in STEPS:
        started = events.of(step, "started")
        assert len(started) == 1, f"{step} started {len(started)} times\n{events.summary}"
    assert not [e for e in events.all if e["kind"] in ("failed", "skipped")], events.summary


def check_kernel_step(events: Events) -> tuple[dict[str, Any], dict[str, Any]]:
    """Installed, asked for the reboot (INFO), and succeeded only after the boot, with nothing in
    between; returns the INFO and the SUCCEEDED events."""
    kernel = [e for e in events.of("kernel") if e["kind"] != "output"]
    assert [e["kind"] for e in kernel] == ["started", "info", "succeeded"], events.summary
    rebooting, done = kernel[1], kernel[2]
    assert rebooting["message"] == "rebooting to finish the step", rebooting
    assert done["message"] == "node rebooted; step complete", done
    output = events.text("kernel")
    assert f"kernel {KERNEL} installed and set as the boot default" in output, output[-3000:]
    between = [e for e in events.all if rebooting["seq"] < e["seq"] < done["seq"] and e["kind"] != "output"]
    assert between == [], events.summary  # nothing ran between the reboot request and the resume
    return rebooting, done


def check_rebooted_once(
    lab: Lab, boots: Boots, events: Events, rebooting: dict[str, Any], done: dict[str, Any]
) -> None:
    """The node really rebooted, once, between the reboot request and the resume: a new boot id, the
    testbed's nspawn exited 133 one time, the old boot's /run is gone, the controller's facts say so."""
    assert boots.new != boots.first
    console = (lab.bed.node(NODE).dir / "console.log").read_text(errors="replace")
    assert console.count("systemd-nspawn exited with status 133") == 1, console[-3000:]
    assert lab.bed.exec(NODE, f"test -e {GO}", check=False).returncode == 1, f"{GO} outlived the reboot"
    facts = describe(lab).get("facts") or {}
    assert facts.get("boot_id") == boots.new, facts
    assert seconds(rebooting["time"]) < boots.new_started <= seconds(done["time"]), (
        boots.new_started,
        events.summary,
    )


def check_kernel_verify_on_new_boot(
    events: Events, boots: Boots, steps: dict[str, tuple[str, str]], done: dict[str, Any]
) -> None:
    """kernel-verify ran once, after the resume, on the new boot, and found the pinned kernel."""
    started = events.only("kernel-verify", "started")
    succeeded = events.only("kernel-verify", "succeeded")
    assert done["seq"] < started["seq"] < succeeded["seq"], events.summary
    # Its one start was queued after the new boot's init started: not by the old boot's agent.
    assert boots.new_started <= seconds(started["time"]), (boots.new_started, events.summary)
    # And the agent recorded its result on the new boot id.
    assert steps.get("kernel-verify") == ("succeeded", boots.new), (steps, boots)
    assert succeeded["observed"].get("kernel.version") == KERNEL, succeeded
    output = events.text("kernel-verify")
    assert f"kernel {KERNEL} is running" in output, output


def check_custom_steps(bed: Testbed, events: Events, boots: Boots, steps: dict[str, tuple[str, str]]) -> None:
    """before-kernel ran once, on the first boot; the kernel step's resume and after-kernel (after
    kernel-verify) on the new one; the agent's journal agrees with what the steps saw."""
    before = events.text("custom-before-kernel")
    after = events.text("custom-after-kernel")
    assert f"before-kernel on boot {boots.first}" in before, before
    assert f"tetherctl bootstrap has returned ({GO})" in before, before  # it waited for the signal
    assert f"after-kernel on boot {boots.new}, kernel {KERNEL}" in after, after
    assert bed.exec(NODE, f"cat {BOOTS}").stdout.splitlines() == [
        f"before-kernel {boots.first}",
        f"after-kernel {boots.new}",
    ]
    after_started = events.only("custom-after-kernel", "started")
    assert after_started["seq"] > events.only("kernel-verify", "succeeded")["seq"], events.summary
    assert steps.get("custom-before-kernel") == ("succeeded", boots.first), (steps, boots)
    assert steps.get("kernel") == ("succeeded", boots.new), (steps, boots)
    assert steps.get("custom-after-kernel") == ("succeeded", boots.new), (steps, boots)


def check_boot_chain(bed: Testbed, host_kernel: str) -> None:
    """The fixture's boot chain: grub's default names the pinned kernel; this boot "runs" it."""
    assert bed.exec(NODE, "uname -r").stdout.strip() == KERNEL
    assert bed.exec(NODE, "/usr/bin/uname -r").stdout.strip() == host_kernel
    grub = bed.exec(NODE, "cat /etc/default/grub.d/99-tether-kernel.cfg").stdout
    assert f"gnulinux-{KERNEL}-advanced-" in grub, grub


def test_the_kernel_step_reboots_the_node_and_the_plan_resumes_after_boot(lab: Lab) -> None:
    bed = lab.bed
    host_kernel = bed.exec(NODE, "uname -r").stdout.strip()
    assert host_kernel != KERNEL
    first_boot = boot_id(bed)

    lab.apply(environment(bed), ENV)
    lab.bootstrap(ENV, {NODE: "worker"})
    bed.exec(NODE, f"touch {GO}")  # tetherctl bootstrap returned: the before-step lets the reboot come
    provisioned(lab)

    events = Events(lab.events(NODE))
    boots = Boots(first=first_boot, new=boot_id(bed), new_started=boot_started(bed))
    steps = journal(bed)
    check_each_step_once(lab, events)
    rebooting, done = check_kernel_step(events)
    check_rebooted_once(lab, boots, events, rebooting, done)
    check_kernel_verify_on_new_boot(events, boots, steps, done)
    check_custom_steps(bed, events, boots, steps)
    check_boot_chain(bed, host_kernel)
    print(f"\n{events.summary}\nboot {boots.first} -> {boots.new}, new boot at {boots.new_started:.3f}")
