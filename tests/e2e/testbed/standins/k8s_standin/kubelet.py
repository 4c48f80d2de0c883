"""kubelet stand-in: registers its Node and posts status every few seconds while it runs.

Like the real kubelet it crash-loops (exit 1, systemd restarts it) until kubeadm has written
/etc/kubernetes/kubelet.conf, and it reports NotReady while the container runtime socket is unreachable.
The API server turns Ready into Unknown when the heartbeats stop (the kubelet or its node is down).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from k8s_standin import VERSION, common
from k8s_standin.common import ApiError, Unreachable

HEARTBEAT_S = float(os.environ.get("K8S_STANDIN_HEARTBEAT", "2"))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kubelet")
    parser.add_argument("--kubeconfig", default="/etc/kubernetes/kubelet.conf")
    parser.add_argument("--bootstrap-kubeconfig")
    parser.add_argument("--config", default="/var/lib/kubelet/config.yaml")
    parser.add_argument("--container-runtime-endpoint", default=common.DEFAULT_CRI_SOCKET)
    parser.add_argument("--hostname-override")
    parser.add_argument("--node-ip")
    parser.add_argument("--version", action="store_true")
    args, _unknown = parser.parse_known_args(argv)
    if args.version:
        print(f"Kubernetes {VERSION}")
        return 0
    if not Path(args.config).exists() or not Path(args.kubeconfig).exists():
        print(
            f'E run.go:72] "command failed" err="failed to load kubelet config file, path: {args.config}, '
            f'error: open {args.config}: no such file or directory"',
            file=sys.stderr,
        )
        return 1
    name = (args.hostname_override or common.hostname()).lower()
    print(f"kubelet stand-in {VERSION} for node {name} (tether test fixture)", flush=True)
    registered = False
    while True:
        try:
            api = common.KubeConfig(Path(args.kubeconfig)).api(timeout=5)
            if not registered:
                register(api, name, args.node_ip)
                registered = True
            heartbeat(api, name, args)
        except ApiError as exc:
            print(f"API error: {exc}", flush=True)
            if exc.status == 404:
                registered = False
        except (Unreachable, OSError) as exc:
            print(f"unable to reach the API server: {exc}", flush=True)
        time.sleep(HEARTBEAT_S)


def register(api: common.Api, name: str, node_ip: str | None) -> None:
    labels = {
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
    }
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": status(name, node_ip),
    }
    try:
        api.request("POST", "/api/v1/nodes", body)
        print(f"Successfully registered node {name}", flush=True)
    except ApiError as exc:
        if exc.status != 409:
            raise


def heartbeat(api: common.Api, name: str, args: argparse.Namespace) -> None:
    ready, reason = runtime_ready(args.container_runtime_endpoint)
    body = {"status": {**status(name, args.node_ip), "ready": ready, "reason": reason}}
    api.request(
        "PATCH", f"/api/v1/nodes/{name}/status", body, {"Content-Type": "application/merge-patch+json"}
    )


def runtime_ready(endpoint: str) -> tuple[bool, str]:
    path = endpoint.removeprefix("unix://")
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(2)
            sock.connect(path)
    except OSError as exc:
        return False, f"container runtime is down: {path}: {exc.strerror}"
    return True, ""


def status(name: str, node_ip: str | None) -> dict[str, Any]:
    return {
        "addresses": [
            {"type": "InternalIP", "address": node_ip or common.node_ip()},
            {"type": "Hostname", "address": name},
        ],
        "nodeInfo": {
            "kubeletVersion": VERSION,
            "kubeProxyVersion": VERSION,
            "containerRuntimeVersion": runtime_version(),
            "osImage": os_image(),
            "kernelVersion": platform.release(),
            "operatingSystem": "linux",
            "architecture": "amd64",
            "machineID": _read("/etc/machine-id"),
            "systemUUID": _read("/etc/machine-id"),
            "bootID": _read("/proc/sys/kernel/random/boot_id"),
        },
    }


def runtime_version() -> str:
    with contextlib.suppress(OSError):
        out = subprocess.run(
            ["containerd", "--version"], capture_output=True, text=True, timeout=5
        ).stdout.split()
        if len(out) >= 3:
            return f"containerd://{out[2]}"
    return "unknown://unknown"


def os_image() -> str:
    for line in _read("/etc/os-release").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip('"')
    return "Linux"


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""
