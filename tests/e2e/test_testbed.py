"""The real-node testbed does what the other e2e tests rely on (issue 4's "done means").

Over real SSH to real systemd nodes: nodes boot to ``running`` with distinct host keys; the local repo
installs containerd and the stand-in kubeadm and ``ctr run`` starts a locally built image; the stand-in
kubeadm's init -> join round trip works and refuses a wrong CA hash, wrong/expired tokens and a wrong
certificate key; nodes reboot with their identity; ``down`` leaves nothing behind, also after ``up`` was
killed with SIGKILL; two testbeds never share a bridge or subnet.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import asyncssh
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from tests.e2e.testbed.residue import residue
from tests.e2e.testbed.state import State
from tests.e2e.testbed.testbed import Testbed, TestbedError

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
REPO = Path(__file__).resolve().parents[2]
ADMIN = "--kubeconfig /etc/kubernetes/admin.conf"
INSTALL = "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends"


@pytest.fixture(scope="module")
def bed(testbed_factory: Callable[..., Testbed]) -> Iterator[Testbed]:
    """This module's own 3 nodes (its tests install packages and form a cluster) with a load balancer."""
    testbed = testbed_factory(3, lb=True)
    yield testbed
    assert testbed.down() == []


def _parallel(fn: Callable[[str], object], names: list[str]) -> list[object]:
    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
        return list(pool.map(fn, names))


def _ca_hash(pem: bytes) -> str:
    """kubeadm's CA pin, computed independently of the stand-in: sha256 over the SubjectPublicKeyInfo DER."""
    spki = (
        x509.load_pem_x509_certificate(pem)
        .public_key()
        .public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return "sha256:" + hashlib.sha256(spki).hexdigest()


async def test_nodes_boot_to_running_over_ssh(bed: Testbed) -> None:
    async def check(name: str) -> tuple[str, str, str]:
        node = bed.node(name)
        async with asyncssh.connect(node.ip, **bed.asyncssh_options(name)) as conn:
            state = await conn.run("systemctl is-system-running", check=False)
            host = await conn.run("hostname", check=True)
            addr = await conn.run("ip -4 -o addr show dev host0", check=True)
        return str(state.stdout).strip(), str(host.stdout).strip(), str(addr.stdout)

    results = await asyncio.gather(*(check(n.name) for n in bed.nodes))
    for node, (state, host, addr) in zip(bed.nodes, results, strict=True):
        assert state == "running", f"{node.name}: {state}"
        assert host == node.name
        assert f"inet {node.ip}/24" in addr


async def test_each_node_has_its_own_host_key(bed: Testbed) -> None:
    desc = bed.describe()
    keys = [n["host_key"] for n in desc["nodes"]]
    assert len(set(keys)) == len(keys) == 3
    for node in desc["nodes"]:
        # what the server really presents is the key the JSON announces
        key = await asyncssh.get_server_host_key(node["ip"])
        assert key is not None
        assert key.export_public_key().decode().split()[:2] == node["host_key"].split()[:2]
    wrong = bed.asyncssh_options("node1")
    wrong["known_hosts"] = asyncssh.import_known_hosts(f"{bed.node('node1').ip} {keys[1]}\n")
    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        async with asyncssh.connect(bed.node("node1").ip, **wrong):
            pass
    machine_ids = {bed.exec(n.name, "cat /etc/machine-id").stdout.strip() for n in bed.nodes}
    assert len(machine_ids) == 3


async def test_test_user_logs_in_with_password_and_has_sudo(bed: Testbed) -> None:
    user = bed.describe()["user"]
    node = bed.node("node2")
    async with asyncssh.connect(
        node.ip, **bed.asyncssh_options("node2", user["name"], user["password"])
    ) as conn:
        result = await conn.run("id -un; sudo -n id -u", check=True)
    assert str(result.stdout).split() == [user["name"], "0"]
    bad = bed.asyncssh_options("node2", user["name"], user["password"] + "x")
    with pytest.raises(asyncssh.PermissionDenied):
        async with asyncssh.connect(node.ip, **bad):
            pass


def test_exec_runs_inside_the_node_without_ssh(bed: Testbed) -> None:
    result = bed.exec("node3", "hostname; cat /proc/1/comm; ip -4 -o addr show dev host0")
    lines = result.stdout.splitlines()
    assert lines[0] == "node3"
    assert lines[1] == "systemd"  # PID 1 of the node's own PID namespace
    assert f"inet {bed.node('node3').ip}/24" in lines[2]
    assert bed.exec("node3", "exit 3", check=False).returncode == 3


def test_local_repo_installs_containerd_and_kubeadm_and_ctr_runs_a_local_image(bed: Testbed) -> None:
    sv = bed.describe()
    # the repo is signed: without its key apt refuses it
    unsigned = bed.ssh(
        "node3",
        f"echo '{sv['apt_source']}' > /etc/apt/sources.list.d/t.list && apt-get update -q",
        check=False,
    )
    assert unsigned.returncode != 0 or "NO_PUBKEY" in unsigned.stdout + unsigned.stderr
    bed.ssh("node3", "rm /etc/apt/sources.list.d/t.list")
    update = bed.ssh("node3", bed.apt_setup_command())
    assert "InRelease" in update.stdout
    bed.ssh("node3", f"{INSTALL} containerd kubeadm")
    versions = bed.ssh(
        "node3",
        "kubeadm version -o short; dpkg-query -W -f='${Status} ${Version}\\n' containerd; "
        "systemctl is-active containerd",
    ).stdout.split("\n")
    assert versions[0] == sv["kubernetes_version"]
    assert versions[1].startswith("install ok installed 1.6")
    assert versions[2] == "active"
    image = sv["images"]["busybox"]
    out = bed.ssh(
        "node3",
        f"curl -fsS -o /tmp/bb.tar {image['url']} && ctr images import /tmp/bb.tar >/dev/null && "
        f"ctr run --rm {image['ref']} t1 /bin/sh -c 'echo hello "
        "from $(hostname) in runc; cat /proc/self/cgroup'",
    ).stdout
    assert "hello from" in out and "in runc" in out
    assert "/default/t1" in out  # the container got its own cgroup from runc


def test_download_mirror_serves_files_with_checksums(bed: Testbed) -> None:
    sv = bed.describe()
    rel = next(p for p in sv["mirror_files"] if p.endswith("calico/v3.31.5/manifests/tigera-operator.yaml"))
    out = bed.ssh(
        "node1",
        f"curl -fsS {sv['download_mirror_url']}/{rel} | sha256sum; "
        f"curl -fsS {sv['download_mirror_url']}/SHA256SUMS",
    ).stdout
    assert out.split()[0] == sv["mirror_files"][rel]
    assert f"{sv['mirror_files'][rel]}  {rel}" in out


def test_kubeadm_stand_in_init_join_round_trip(bed: Testbed) -> None:
    names = [n.name for n in bed.nodes]
    _parallel(
        lambda n: bed.ssh(
            n, f"{bed.apt_setup_command()} >/dev/null && {INSTALL} containerd kubeadm kubelet kubectl"
        ),
        names,
    )
    lb = bed.describe()["lb_endpoint"]
    lb_host = lb.split(":")[0]
    init = bed.ssh(
        "node1",
        f"kubeadm init --control-plane-endpoint {lb} --apiserver-cert-extra-sans {lb_host} "
        "--pod-network-cidr 192.168.0.0/16 --upload-certs",
    )
    token = re.search(r"--token ([a-z0-9]{6}\.[a-z0-9]{16})", init.stdout)
    printed_hash = re.search(r"--discovery-token-ca-cert-hash (sha256:[0-9a-f]{64})", init.stdout)
    cert_key = re.search(r"--certificate-key ([0-9a-f]{64})", init.stdout)
    assert token and printed_hash and cert_key, init.stdout
    ca_pem = bed.ssh("node1", "cat /etc/kubernetes/pki/ca.crt").stdout.encode()
    assert printed_hash.group(1) == _ca_hash(ca_pem)
    assert (
        bed.ssh(
            "node1", "test -s /etc/kubernetes/admin.conf && systemctl is-active kube-apiserver-standin"
        ).returncode
        == 0
    )
    join = (
        f"kubeadm join {lb} --token {token.group(1)} --discovery-token-ca-cert-hash {printed_hash.group(1)}"
    )

    wrong_hash = bed.ssh("node2", join.replace(printed_hash.group(1), "sha256:" + "0" * 64), check=False)
    assert wrong_hash.returncode != 0
    assert f'none of the public keys "{printed_hash.group(1)}" are pinned' in wrong_hash.stderr
    wrong_token = bed.ssh("node2", join.replace(token.group(1), "abcdef.0123456789abcdef"), check=False)
    assert wrong_token.returncode != 0 and 'for token ID "abcdef"' in wrong_token.stderr
    bed.ssh("node1", f"kubeadm token create --ttl 1h --description expiring {ADMIN}")
    bed.expire_join_material("node1", certificate_key=False)
    expired = bed.ssh("node2", join, check=False)  # the init token has expired too
    assert expired.returncode != 0 and "could not find a JWS signature" in expired.stderr
    assert bed.ssh("node1", "kubeadm token list").stdout.strip() == ""
    assert bed.ssh("node2", "test ! -e /etc/kubernetes/kubelet.conf").returncode == 0

    fresh = bed.ssh("node1", "kubeadm token create --print-join-command").stdout.strip()
    assert fresh.startswith(f"kubeadm join {lb} --token ") and printed_hash.group(1) in fresh
    worker = bed.ssh("node2", fresh)
    assert "This node has joined the cluster" in worker.stdout
    assert bed.ssh("node2", "cat /etc/kubernetes/pki/ca.crt").stdout.encode() == ca_pem
    assert 'server: "https://' + lb in bed.ssh("node2", "cat /etc/kubernetes/kubelet.conf").stdout
    again = bed.ssh("node2", fresh, check=False)
    assert again.returncode != 0 and "/etc/kubernetes/kubelet.conf already exists" in again.stderr

    bad_key = bed.ssh("node3", f"{fresh} --control-plane --certificate-key {'1' * 64}", check=False)
    assert bad_key.returncode != 0 and "message authentication failed" in bad_key.stderr
    bed.ssh("node3", "kubeadm reset -f")
    new_key = (
        bed.ssh("node1", "kubeadm init phase upload-certs --upload-certs").stdout.strip().splitlines()[-1]
    )
    assert re.fullmatch(r"[0-9a-f]{64}", new_key) and new_key != cert_key.group(1)
    stale_key = bed.ssh(
        "node3", f"{fresh} --control-plane --certificate-key {cert_key.group(1)}", check=False
    )
    assert stale_key.returncode != 0, "a replaced certificate key must not work"
    bed.ssh("node3", "kubeadm reset -f")
    cp = bed.ssh("node3", f"{fresh} --control-plane --certificate-key {new_key}")
    assert "a new control plane instance was created" in cp.stdout

    # the second control plane serves the same cluster: every node, Ready, with kubeadm's roles and taints
    bed.ssh("node3", f"kubectl {ADMIN} wait --for=condition=Ready nodes --all --timeout=60s")
    nodes = json.loads(bed.ssh("node3", f"kubectl {ADMIN} get nodes -o json").stdout)["items"]
    by_name = {n["metadata"]["name"]: n for n in nodes}
    assert sorted(by_name) == ["node1", "node2", "node3"]
    for name, node in by_name.items():
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True"
        assert node["status"]["nodeInfo"]["kubeletVersion"] == bed.describe()["kubernetes_version"]
        ip = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
        assert ip == bed.node(name).ip
        is_cp = "node-role.kubernetes.io/control-plane" in node["metadata"]["labels"]
        assert is_cp == (name != "node2")
        taints = node["spec"].get("taints", [])
        assert (taints == [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]) == is_cp
    bed.ssh(
        "node1",
        f"kubectl {ADMIN} label node node2 node-role.kubernetes.io/worker= && "
        f"kubectl {ADMIN} taint node node1 node-role.kubernetes.io/control-plane:NoSchedule-",
    )
    wide = bed.ssh("node3", f"kubectl {ADMIN} get nodes -o wide --no-headers").stdout.splitlines()
    assert [line.split()[:3] for line in wide] == [
        ["node1", "Ready", "control-plane"],
        ["node2", "Ready", "worker"],
        ["node3", "Ready", "control-plane"],
    ]

    # the worker survives a reboot: kubelet comes back by itself and the node is Ready again
    bed.reboot("node2")
    bed.ssh("node2", "systemctl is-active kubelet")
    bed.ssh("node1", f"kubectl {ADMIN} wait --for=condition=Ready node/node2 --timeout=60s")
    log = bed.ssh("node2", "cat /var/log/kubeadm-standin/kubeadm.log").stdout
    assert token.group(1).split(".")[1] not in log, "the stand-in's log must not contain token secrets"

    # HA: with the first control plane down the endpoint still answers (node3 takes over), and node1
    # catches up with what changed meanwhile when it comes back
    bed.stop("node1")
    late = bed.ssh("node3", f"kubeadm token create --ttl 2h {ADMIN}").stdout.strip()
    assert "node1" in bed.ssh("node2", "kubectl --kubeconfig /etc/kubernetes/kubelet.conf get nodes").stdout
    bed.start("node1")
    assert late in bed.ssh("node1", "kubeadm token list").stdout


def test_reboot_keeps_identity_and_disk(bed: Testbed) -> None:
    before = bed.describe()["nodes"][0]
    bed.ssh("node1", "echo kept > /root/reboot-marker")
    boot_before = bed.ssh("node1", "journalctl --list-boots --no-pager | wc -l").stdout.strip()
    bed.reboot("node1")
    after = bed.describe()["nodes"][0]
    assert after["leader_pid"] != before["leader_pid"]
    out = bed.ssh(
        "node1", "cat /root/reboot-marker; hostname; cat /etc/machine-id; systemctl is-system-running --wait"
    )
    assert out.stdout.split() == ["kept", "node1", before["machine_id"], "running"]
    assert bed.ssh("node1", "grep -c ' node1$' /etc/hosts").stdout.strip() == "1"
    boots = bed.ssh("node1", "journalctl --list-boots --no-pager | wc -l").stdout.strip()
    assert int(boots) == int(boot_before) + 1


def test_link_down_cuts_a_node_off_and_link_up_restores_it(bed: Testbed) -> None:
    ip3 = bed.node("node3").ip
    assert bed.ssh("node1", f"ping -c1 -W2 {ip3}", check=False).returncode == 0
    bed.link_down("node3")
    try:
        assert bed.ssh("node1", f"ping -c1 -W1 {ip3}", check=False).returncode != 0
        with pytest.raises((TestbedError, subprocess.TimeoutExpired)):
            bed.wait_ssh("node3", timeout=3)
    finally:
        bed.link_up("node3")
    assert bed.wait_ssh("node3", timeout=30) == "running"


def test_stop_and_start_a_node(bed: Testbed) -> None:
    bed.stop("node3")
    assert not bed.running("node3")
    assert bed.ssh("node1", f"ping -c1 -W1 {bed.node('node3').ip}", check=False).returncode != 0
    bed.start("node3")
    assert bed.running("node3")
    assert bed.ssh("node3", "hostname").stdout.strip() == "node3"


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.e2e.testbed", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_cli_up_prints_json_and_down_removes_everything(bed: Testbed, tmp_path: Path) -> None:
    state = tmp_path / "cli"
    up = _cli("up", "--nodes", "2", "--state", str(state), "--lb")
    assert up.returncode == 0, up.stderr
    desc = json.loads(up.stdout)  # stdout is exactly one JSON object
    for key in (
        "bridge_ip",
        "apt_repo_url",
        "download_mirror_url",
        "ssh_key",
        "nodes",
        "apt_repo_key_url",
        "lb_endpoint",
    ):
        assert key in desc
    assert [set(n) >= {"name", "ip", "ssh_user", "host_key"} for n in desc["nodes"]] == [True, True]
    # a second testbed on the same machine gets its own bridge and subnet
    mine = bed.describe()
    assert desc["bridge"] != mine["bridge"] and desc["subnet"] != mine["subnet"]
    node = desc["nodes"][0]
    ssh = [
        "ssh",
        "-F",
        "/dev/null",
        "-i",
        desc["ssh_key"],
        "-o",
        f"UserKnownHostsFile={desc['known_hosts']}",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        f"{node['ssh_user']}@{node['ip']}",
    ]
    assert (
        subprocess.run([*ssh, "hostname"], capture_output=True, text=True, check=True).stdout.strip()
        == node["name"]
    )
    # the nodes outlived the `up` process; take the record before `down` deletes it
    record = State.load(state).data
    assert residue(record, state) != []
    down = _cli("down", "--state", str(state))
    assert down.returncode == 0, down.stderr
    assert residue(record, state) == []
    assert _cli("down", "--state", str(state)).returncode == 0  # idempotent


def test_down_cleans_up_after_up_was_killed(tmp_path: Path) -> None:
    state = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.testbed", "up", "--nodes", "2", "--state", str(state)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    record: dict[str, object] = {}
    while time.monotonic() < deadline:  # kill -9 once the nodes are starting
        if State.exists(state):
            record = State.load(state).data
            nodes = record.get("nodes") or {}
            if isinstance(nodes, dict) and len(nodes) == 2 and all(n.get("keeper") for n in nodes.values()):
                break
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    record = State.load(state).data
    assert residue(record, state) != [], "the kill came too late to test anything"
    down = _cli("down", "--state", str(state))
    assert down.returncode == 0, down.stderr
    assert residue(record, state) == []
