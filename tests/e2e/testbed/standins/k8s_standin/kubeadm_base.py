"""Shared by the kubeadm stand-in's commands: paths, errors, config, preflight, control-plane setup."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from k8s_standin import common, miniyaml
from k8s_standin.common import KUBE, KUBELET_DIR, PKI, STATE_DIR, Api, ApiError, Unreachable

APISERVER_BIN = "/usr/lib/kubeadm-standin/kube-apiserver-standin"
APISERVER_UNIT = Path("/etc/systemd/system/kube-apiserver-standin.service")
MANIFEST = KUBE / "manifests/kube-apiserver.yaml"
ADMIN_CONF = KUBE / "admin.conf"
KUBELET_CONF = KUBE / "kubelet.conf"
CP_LABELS = (
    "node-role.kubernetes.io/control-plane",
    "node.kubernetes.io/exclude-from-external-load-balancers",
)
CP_TAINT = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}
DISCOVERY_TIMEOUT = float(os.environ.get("K8S_STANDIN_DISCOVERY_TIMEOUT", "60"))
NODE_WAIT = float(os.environ.get("K8S_STANDIN_NODE_WAIT", "60"))
# flags that real kubeadm refuses to combine with --config
NO_MIX_INIT = (
    "control_plane_endpoint",
    "apiserver_advertise_address",
    "apiserver_cert_extra_sans",
    "pod_network_cidr",
    "service_cidr",
    "cri_socket",
    "node_name",
    "token",
    "kubernetes_version",
)
NO_MIX_JOIN = (
    "token",
    "discovery_token",
    "tls_bootstrap_token",
    "discovery_token_ca_cert_hash",
    "cri_socket",
    "node_name",
    "apiserver_advertise_address",
    "certificate_key",
    "control_plane",
    "endpoint",
)


class Failure(Exception):
    """A kubeadm error: printed to stderr, exit status 1."""


def parse_duration(text: str) -> float:
    """Go durations as kubeadm takes them: 24h0m0s, 2h, 30m, 90s, 0."""
    if text in ("0", "0s"):
        return 0.0
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|m|s)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise Failure(f'invalid argument "{text}" for "--ttl" flag: time: invalid duration "{text}"')
    scale = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(float(n) * scale[u] for n, u in parts)


def load_config(path: str | None) -> dict[str, dict[str, Any]]:
    """kubeadm --config: documents by kind (Init/Cluster/JoinConfiguration; others ignored)."""
    if not path:
        return {}
    try:
        docs = miniyaml.load_all(Path(path).read_text())
    except OSError as exc:
        raise Failure(f"unable to read config from {path!r} : {exc}") from exc
    out: dict[str, dict[str, Any]] = {}
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind"):
            if not str(doc.get("apiVersion", "")).startswith(
                ("kubeadm.k8s.io/", "kubelet.config.k8s.io/", "kubeproxy.config.k8s.io/")
            ):
                raise Failure(f"unknown apiVersion {doc.get('apiVersion')!r} for kind {doc['kind']!r}")
            out[doc["kind"]] = doc
    return out


def check_mix(args: argparse.Namespace, names: tuple[str, ...]) -> None:
    if not args.config:
        return
    mixed = [n.replace("_", "-") for n in names if getattr(args, n, None) not in (None, False, [], "")]
    if mixed:
        raise Failure(f"can not mix '--config' with arguments [{' '.join(mixed)}]")


def dig(doc: dict[str, Any], *path: str, default: Any = None) -> Any:
    for key in path:
        if not isinstance(doc, dict) or key not in doc:
            return default
        doc = doc[key]
    return doc


# ------------------------------------------------------------------ preflight


def preflight(checks: list[tuple[str, str | None, bool]], ignored: list[str]) -> None:
    """``checks``: (name, error or None, ignorable). Ignored errors print as warnings, as in kubeadm."""
    ignore = {i.strip().lower() for item in ignored for i in item.split(",") if i.strip()}
    print("[preflight] Running pre-flight checks")
    fatal = []
    for name, error, ignorable in checks:
        if error is None:
            continue
        if ignorable and ("all" in ignore or name.lower() in ignore):
            print(f"\t[WARNING {name}]: {error}", file=sys.stderr)
        else:
            fatal.append(f"\t[ERROR {name}]: {error}")
    if fatal:
        raise Failure(
            "error execution phase preflight: [preflight] Some fatal errors occurred:\n"
            + "\n".join(fatal)
            + "\n"
            "[preflight] If you know what you are doing, you can make a check non-fatal with "
            "`--ignore-preflight-errors=...`"
        )


def base_checks(cri_socket: str) -> list[tuple[str, str | None, bool]]:
    sock = cri_socket.removeprefix("unix://")
    cri_ok = False
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as s:
        s.settimeout(2)
        s.connect(sock)
        cri_ok = True
    return [
        ("IsPrivilegedUser", None if os.geteuid() == 0 else "user is not running as root", False),
        (
            "CRI",
            None
            if cri_ok
            else f"container runtime is not running: validate service connection: "
            f'validate CRI v1 runtime API for endpoint "{cri_socket}": rpc error: code = Unavailable '
            f'desc = connection error: desc = "transport: Error while dialing: dial unix {sock}: connect: '
            'no such file or directory"',
            True,
        ),
        ("FileExisting-crictl", None if shutil.which("crictl") else "crictl not found in system path", True),
        (
            "KubeletVersion",
            None
            if shutil.which("kubelet")
            else 'couldn\'t get kubelet version: exec: "kubelet": executable file not found in $PATH',
            True,
        ),
        (
            "Service-Kubelet",
            None
            if kubelet_enabled()
            else "kubelet service is not enabled, please run 'systemctl enable kubelet.service'",
            True,
        ),
    ]


def kubelet_enabled() -> bool:
    return subprocess.run(["systemctl", "is-enabled", "-q", "kubelet"], capture_output=True).returncode == 0


def file_check(path: Path) -> tuple[str, str | None, bool]:
    """kubeadm's FileAvailable check; the stand-in never lets it be ignored (run 'kubeadm reset' first)."""
    name = "FileAvailable-" + str(path).replace("/", "-")
    return (name, f"{path} already exists" if path.exists() else None, False)


def port_check(port: int) -> tuple[str, str | None, bool]:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
            busy = None
        except OSError:
            busy = f"Port {port} is in use"
    return (f"Port-{port}", busy, True)


def apiserver_sans(
    node: str, advertise: str, endpoint_host: str, extra: list[str], svc_cidr: str
) -> list[str]:
    first_svc = svc_cidr.split("/")[0].rsplit(".", 1)[0] + ".1"
    return list(
        dict.fromkeys(
            [
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
                node,
                "localhost",
                first_svc,
                advertise,
                "127.0.0.1",
                endpoint_host,
                *extra,
            ]
        )
    )


def write_kubeconfigs(node: str, server: str, admin: bool) -> None:
    print(f'[kubeconfig] Using kubeconfig folder "{KUBE}"')
    ca_pem = (PKI / "ca.crt").read_bytes()
    tmp = STATE_DIR / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    todo = [
        ("admin.conf", "kubernetes-admin", "/O=kubeadm:cluster-admins/CN=kubernetes-admin"),
        ("super-admin.conf", "kubernetes-super-admin", "/O=system:masters/CN=kubernetes-super-admin"),
    ]
    if admin:
        for filename, user, subject in todo:
            print(f'[kubeconfig] Writing "{filename}" kubeconfig file')
            key = tmp / f"{filename}.key"
            cert = common.sign(common.new_key_and_csr(key, subject), PKI / "ca.crt", PKI / "ca.key")
            common.write_private(
                KUBE / filename, common.kubeconfig(server, ca_pem, user, cert, key.read_bytes())
            )
            key.unlink()
    print('[kubeconfig] Writing "kubelet.conf" kubeconfig file')
    key = tmp / "kubelet.key"
    cert = common.sign(
        common.new_key_and_csr(key, f"/O=system:nodes/CN=system:node:{node}"), PKI / "ca.crt", PKI / "ca.key"
    )
    common.write_private(
        KUBELET_CONF, common.kubeconfig(server, ca_pem, f"system:node:{node}", cert, key.read_bytes())
    )
    key.unlink()


def start_apiserver(node: str, advertise: str, port: int) -> None:
    print('[control-plane] Creating static Pod manifest for "kube-apiserver"')
    MANIFEST.parent.mkdir(parents=True, exist_ok=True)
    MANIFEST.write_text(
        "# tether TEST FIXTURE: the stand-in API server runs "
        "as kube-apiserver-standin.service, not a static Pod\n"
        f"apiVersion: v1\nkind: Pod\nmetadata:\n  name: kube-apiserver-{node}\n  namespace: kube-system\n"
    )
    APISERVER_UNIT.write_text(
        "# tether TEST FIXTURE: the kube-apiserver stand-in "
        "(not Kubernetes), written by the kubeadm stand-in\n"
        "[Unit]\nDescription=kube-apiserver stand-in (tether test fixture)\n"
        "Wants=network-online.target\nAfter=network-online.target\n\n"
        f"[Service]\nExecStart={APISERVER_BIN} --name {node} "
        f"--advertise-address {advertise} --secure-port {port}\n"
        "Restart=always\nRestartSec=1\n\n[Install]\nWantedBy=multi-user.target\n"
    )
    systemctl("daemon-reload")
    systemctl("enable", "--now", APISERVER_UNIT.name)
    print(
        "[wait-control-plane] Waiting for the kubelet to boot "
        "up the control plane as static Pods from directory "
        f'"{MANIFEST.parent}"'
    )
    started = time.monotonic()
    api = Api(f"https://127.0.0.1:{port}", (PKI / "ca.crt").read_bytes(), timeout=2)
    while True:
        try:
            api.raw("GET", "/healthz", None, {})
            break
        except (Unreachable, ssl.SSLError) as exc:
            if time.monotonic() - started > 60:
                raise Failure(
                    f"error execution phase wait-control-plane: the API server is not healthy: {exc}"
                ) from exc
            time.sleep(0.2)
    print(f"[api-check] The API server is healthy after {time.monotonic() - started:.3f}s")


def start_kubelet(node: str, cri: str, server: str) -> None:
    KUBELET_DIR.mkdir(parents=True, exist_ok=True)
    print(
        "[kubelet-start] Writing kubelet environment file "
        f'with flags to file "{KUBELET_DIR}/kubeadm-flags.env"'
    )
    flags = f"--container-runtime-endpoint={cri} --pod-infra-container-image=registry.k8s.io/pause:3.10"
    if node != common.hostname():
        flags += f" --hostname-override={node}"
    (KUBELET_DIR / "kubeadm-flags.env").write_text(f'KUBELET_KUBEADM_ARGS="{flags}"\n')
    print(f'[kubelet-start] Writing kubelet configuration to file "{KUBELET_DIR}/config.yaml"')
    (KUBELET_DIR / "config.yaml").write_text(
        "# tether TEST FIXTURE (kubelet stand-in)\napiVersion: kubelet.config.k8s.io/v1beta1\n"
        "kind: KubeletConfiguration\ncgroupDriver: systemd\n"
    )
    print("[kubelet-start] Starting the kubelet")
    if subprocess.run(["systemctl", "restart", "kubelet"], capture_output=True).returncode != 0:
        print("[kubelet-start] WARNING: unable to start the kubelet service", file=sys.stderr)


def wait_node_registered(node: str) -> None:
    """Wait until the kubelet has registered its Node (with kubelet.conf's identity)."""
    print(f"[kubelet-check] Waiting for a healthy kubelet. This can take up to {NODE_WAIT:.0f}s")
    started = time.monotonic()
    api = common.KubeConfig(KUBELET_CONF).api(timeout=3)
    last = ""
    while time.monotonic() - started < NODE_WAIT:
        try:
            api.request("GET", f"/api/v1/nodes/{node}")
            print(f"[kubelet-check] The kubelet is healthy after {time.monotonic() - started:.3f}s")
            return
        except (ApiError, Unreachable, ssl.SSLError) as exc:
            last = str(exc)
        time.sleep(0.3)
    raise Failure(
        "error execution phase kubelet-start: timed out waiting "
        "for the condition: the kubelet did not register "
        f"node {node!r} ({last}); check 'systemctl status kubelet' and 'journalctl -xeu kubelet'"
    )


def mark_control_plane(node: str) -> None:
    print(
        f"[mark-control-plane] Marking the node {node} as "
        f"control-plane by adding the labels: [{' '.join(CP_LABELS)}]"
    )
    print(
        f"[mark-control-plane] Marking the node {node} as control-plane by adding the taints "
        f"[{CP_TAINT['key']}:{CP_TAINT['effect']}]"
    )
    api = common.KubeConfig(ADMIN_CONF).api()
    current = api.request("GET", f"/api/v1/nodes/{node}")
    taints = [t for t in current["spec"].get("taints", []) if t["key"] != CP_TAINT["key"]] + [CP_TAINT]
    api.request(
        "PATCH",
        f"/api/v1/nodes/{node}",
        {"metadata": {"labels": dict.fromkeys(CP_LABELS, "")}, "spec": {"taints": taints}},
        {"Content-Type": "application/merge-patch+json"},
    )


def systemctl(*args: str) -> None:
    result = subprocess.run(["systemctl", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise Failure(f"systemctl {' '.join(args)} failed: {result.stderr.strip()}")
