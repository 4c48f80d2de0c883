"""Issue 14: the kernel step's reboot on a real systemd node (holodeck's kernel pin reboots and resumes).

A real controller listens on the testbed bridge; ``tetherctl bootstrap`` adopts one node (the agent under
systemd, its default ``--reboot-command``: ``systemctl reboot``). The environment pins
``spec.kernel.version`` to the test-fixture kernel of the testbed's local apt repo
(``testbed/kernelpkgs.py``: ``linux-image-<KERNEL>``, ``linux-headers-<KERNEL>`` and a boot-chain
stand-in for update-grub, update-initramfs, the boot loader and ``uname -r``), with a custom step before
the kernel (pre-install) and one after it (post-install). The production kernel and kernel-verify
scripts run unchanged: apt installs the packages, the step makes the kernel grub's default and asks for
the reboot; kernel-verify passes only if the node then booted grub's default (``uname -r``).

Shown from the controller's events and the node:

* the kernel step's INFO "rebooting to finish the step", then the node really reboots (the testbed's
  nspawn exits 133 once and comes back; a new boot id), then the step's SUCCEEDED "node rebooted; step
  complete" with no step started in between;
* kernel-verify starts after the new boot began (event time after the boot's start), on the new boot
  id, and finds the pinned kernel running; the step after it runs on the new boot id too;
* nothing before the kernel step runs again: each step has exactly one STARTED event, none is skipped
  or failed, the before-step ran once on the old boot id; events are numbered 1..N without a gap;
* the controller's facts for the node carry the new boot id.

The before-step waits for ``tetherctl bootstrap`` to have written its marker (the last thing it does
over SSH): a node that reboots a few seconds after enrolling would otherwise cut the bootstrap's
verification short (its SSH session to a rebooting machine).
"""

from __future__ import annotations

import datetime as dt
import json
import urllib.request
from collections.abc import Callable, Iterator
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

BEFORE = f"""\
boot=$(cat /proc/sys/kernel/random/boot_id)
echo "before-kernel on boot $boot"
mkdir -p {Path(BOOTS).parent}
echo "before-kernel $boot" >>{BOOTS}
# (test only) the next step reboots the node: let tetherctl bootstrap finish its SSH work first
for _ in $(seq 240); do
  grep -qs '"state": "installed"' /var/lib/tether/bootstrap.json && break
  sleep 0.5
done
sleep 1
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


def text(events: list[dict[str, Any]]) -> str:
    return "\n".join(line for e in events for line in [e["message"], *e["lines"]] if line)


def test_the_kernel_step_reboots_the_node_and_the_plan_resumes_after_boot(lab: Lab) -> None:
    bed = lab.bed
    host_kernel = bed.exec(NODE, "uname -r").stdout.strip()
    assert host_kernel != KERNEL
    first_boot = boot_id(bed)

    lab.apply(environment(bed), ENV)
    lab.bootstrap(ENV, {NODE: "worker"})
    provisioned(lab)

    events = lab.events(NODE)
    summary = "\n".join(
        f"{e['seq']:>3} {e['time']} {e['step'] or '-':<22} {e['kind']:<9} {e['message']}"
        for e in events
        if e["kind"] != "output"
    )
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1)), summary
    assert [s["name"] for s in describe(lab)["steps"]] == STEPS

    # Every step started exactly once; nothing failed, nothing was skipped.
    for step in STEPS:
        started = [e for e in events if e["step"] == step and e["kind"] == "started"]
        assert len(started) == 1, f"{step} started {len(started)} times\n{summary}"
    assert not [e for e in events if e["kind"] in ("failed", "skipped")], summary

    def only(step: str, kind: str) -> dict[str, Any]:
        found = [e for e in events if e["step"] == step and e["kind"] == kind]
        assert len(found) == 1, f"{step}: {len(found)} {kind} events\n{summary}"
        return found[0]

    # The kernel step: installed, asked for the reboot (INFO), and succeeded only after the boot.
    kernel = [e for e in events if e["step"] == "kernel" and e["kind"] != "output"]
    assert [e["kind"] for e in kernel] == ["started", "info", "succeeded"], summary
    rebooting, done = kernel[1], kernel[2]
    assert rebooting["message"] == "rebooting to finish the step", rebooting
    assert done["message"] == "node rebooted; step complete", done
    kernel_output = text([e for e in events if e["step"] == "kernel"])
    assert f"kernel {KERNEL} installed and set as the boot default" in kernel_output, kernel_output[-3000:]
    between = [e for e in events if rebooting["seq"] < e["seq"] < done["seq"] and e["kind"] != "output"]
    assert between == [], summary  # nothing ran between the reboot request and the resume

    # The node really rebooted, once: a new boot id, and the testbed's nspawn exited 133 one time.
    new_boot = boot_id(bed)
    assert new_boot != first_boot
    console = (bed.node(NODE).dir / "console.log").read_text(errors="replace")
    assert console.count("systemd-nspawn exited with status 133") == 1, console[-3000:]
    booted_at = boot_started(bed)
    facts = describe(lab).get("facts") or {}
    assert facts.get("boot_id") == new_boot, facts

    # Order in time: the reboot request, the new boot, then the resume and kernel-verify.
    verify_started = only("kernel-verify", "started")
    verify_done = only("kernel-verify", "succeeded")
    assert seconds(rebooting["time"]) < booted_at <= seconds(done["time"]), (booted_at, summary)
    assert booted_at <= seconds(verify_started["time"]), (booted_at, summary)
    assert done["seq"] < verify_started["seq"] < verify_done["seq"], summary
    assert verify_done["observed"].get("kernel.version") == KERNEL, verify_done
    verify_output = text([e for e in events if e["step"] == "kernel-verify"])
    assert f"kernel {KERNEL} is running" in verify_output, verify_output

    # The custom steps: before-kernel ran once, on the first boot; after-kernel on the new one.
    before = text([e for e in events if e["step"] == "custom-before-kernel"])
    after = text([e for e in events if e["step"] == "custom-after-kernel"])
    assert f"before-kernel on boot {first_boot}" in before, before
    assert f"after-kernel on boot {new_boot}, kernel {KERNEL}" in after, after
    assert bed.exec(NODE, f"cat {BOOTS}").stdout.splitlines() == [
        f"before-kernel {first_boot}",
        f"after-kernel {new_boot}",
    ]
    assert only("custom-after-kernel", "started")["seq"] > verify_done["seq"], summary

    # The fixture's boot chain: grub's default names the pinned kernel; this boot "runs" it.
    assert bed.exec(NODE, "uname -r").stdout.strip() == KERNEL
    assert bed.exec(NODE, "/usr/bin/uname -r").stdout.strip() == host_kernel
    grub = bed.exec(NODE, "cat /etc/default/grub.d/99-tether-kernel.cfg").stdout
    assert f"gnulinux-{KERNEL}-advanced-" in grub, grub
    print(f"\n{summary}\nboot {first_boot} -> {new_boot}, new boot at {booted_at:.3f}")
