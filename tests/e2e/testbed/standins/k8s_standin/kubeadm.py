"""kubeadm stand-in: init, join, reset, token, upload-certs, version, with kubeadm's observable behaviour.

What tether depends on is real: a CA made with openssl, bootstrap tokens in kubeadm's form with TTLs,
``--discovery-token-ca-cert-hash`` checked against the CA's public key, tokens checked by the API server
(JWS-signed cluster-info, then TLS bootstrap), certificate keys that expire after 2 h, control-plane joins
that download the CA and start their own API server. Every call is logged (secrets as SHA-256) to
/var/log/kubeadm-standin/kubeadm.log. Auth failures fail fast instead of retrying until a timeout.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from k8s_standin import VERSION, common, miniyaml
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


def main(argv: list[str]) -> int:
    common.log_invocation("kubeadm", argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except Failure as exc:
        print(str(exc), file=sys.stderr)
        print("To see the stack trace of this error execute with --v=5 or higher", file=sys.stderr)
        return 1


# ------------------------------------------------------------------ argument parsing


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # kubeadm prints the usage error and exits 1
        self.print_usage(sys.stderr)
        print(f"error: {message}", file=sys.stderr)
        sys.exit(1)


def _common_node_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config")
    p.add_argument("--cri-socket")
    p.add_argument("--node-name")
    p.add_argument("--ignore-preflight-errors", action="append", default=[])
    p.add_argument("--skip-phases", action="append", default=[])
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--v", "-v", dest="verbosity")
    p.add_argument("--rootfs")
    p.add_argument("--patches")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="kubeadm", description="kubeadm stand-in (tether TEST FIXTURE, not Kubernetes)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    init = sub.add_parser("init")
    _common_node_flags(init)
    init.add_argument("--control-plane-endpoint")
    init.add_argument("--apiserver-advertise-address")
    init.add_argument("--apiserver-bind-port", type=int)
    init.add_argument("--apiserver-cert-extra-sans")
    init.add_argument("--pod-network-cidr")
    init.add_argument("--service-cidr")
    init.add_argument("--service-dns-domain")
    init.add_argument("--kubernetes-version")
    init.add_argument("--image-repository")
    init.add_argument("--feature-gates")
    init.add_argument("--token")
    init.add_argument("--token-ttl")
    init.add_argument("--upload-certs", action="store_true")
    init.add_argument("--certificate-key")
    init.add_argument("--skip-token-print", action="store_true")
    init.add_argument("--skip-certificate-key-print", action="store_true")
    init.add_argument("--cert-dir")
    init.set_defaults(func=cmd_init)
    init_sub = init.add_subparsers(dest="phase_cmd", parser_class=Parser)
    phase = init_sub.add_parser("phase")
    phase_sub = phase.add_subparsers(dest="phase", required=True, parser_class=Parser)
    upload = phase_sub.add_parser("upload-certs")
    upload.add_argument("--upload-certs", action="store_true")
    upload.add_argument("--certificate-key")
    upload.add_argument("--skip-certificate-key-print", action="store_true")
    upload.add_argument("--config")
    upload.add_argument("--kubeconfig", default=str(ADMIN_CONF))
    upload.add_argument("--v", "-v", dest="verbosity")
    upload.set_defaults(func=cmd_upload_certs)

    join = sub.add_parser("join")
    _common_node_flags(join)
    join.add_argument("endpoint", nargs="?")
    join.add_argument("--token")
    join.add_argument("--discovery-token")
    join.add_argument("--tls-bootstrap-token")
    join.add_argument("--discovery-token-ca-cert-hash", action="append", default=[])
    join.add_argument("--discovery-token-unsafe-skip-ca-verification", action="store_true")
    join.add_argument("--discovery-file")
    join.add_argument("--control-plane", action="store_true")
    join.add_argument("--certificate-key")
    join.add_argument("--apiserver-advertise-address")
    join.add_argument("--apiserver-bind-port", type=int)
    join.set_defaults(func=cmd_join)

    reset = sub.add_parser("reset")
    reset.add_argument("--force", "-f", action="store_true")
    reset.add_argument("--cri-socket")
    reset.add_argument("--cleanup-tmp-dir", action="store_true")
    reset.add_argument("--ignore-preflight-errors", action="append", default=[])
    reset.add_argument("--kubeconfig", default=str(ADMIN_CONF))
    reset.add_argument("--v", "-v", dest="verbosity")
    reset.set_defaults(func=cmd_reset)

    token = sub.add_parser("token")
    token.add_argument("--kubeconfig", default=str(ADMIN_CONF))
    token.add_argument("--dry-run", action="store_true")
    token.add_argument("--v", "-v", dest="verbosity")
    token_sub = token.add_subparsers(dest="token_cmd", required=True, parser_class=Parser)
    create = token_sub.add_parser("create")
    create.add_argument("token", nargs="?")
    create.add_argument("--ttl", default="24h0m0s")
    create.add_argument("--print-join-command", action="store_true")
    create.add_argument("--certificate-key")
    create.add_argument("--description", default="")
    create.add_argument("--usages", default="signing,authentication")
    create.add_argument("--groups", default="system:bootstrappers:kubeadm:default-node-token")
    create.add_argument("--config")
    create.add_argument("--kubeconfig")
    create.set_defaults(func=cmd_token_create)
    lst = token_sub.add_parser("list")
    lst.add_argument("--output", "-o", default="text")
    lst.add_argument("--kubeconfig")
    lst.set_defaults(func=cmd_token_list)
    delete = token_sub.add_parser("delete")
    delete.add_argument("tokens", nargs="+")
    delete.add_argument("--kubeconfig")
    delete.set_defaults(func=cmd_token_delete)
    generate = token_sub.add_parser("generate")
    generate.set_defaults(func=lambda a: print(common.new_token()))

    certs = sub.add_parser("certs")
    certs_sub = certs.add_subparsers(dest="certs_cmd", required=True, parser_class=Parser)
    certkey = certs_sub.add_parser("certificate-key")
    certkey.set_defaults(func=lambda a: print(secrets.token_hex(32)))

    version = sub.add_parser("version")
    version.add_argument("--output", "-o", default="")
    version.set_defaults(func=cmd_version)
    return parser


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


def _get(doc: dict[str, Any], *path: str, default: Any = None) -> Any:
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
            if _kubelet_enabled()
            else "kubelet service is not enabled, please run 'systemctl enable kubelet.service'",
            True,
        ),
    ]


def _kubelet_enabled() -> bool:
    return subprocess.run(["systemctl", "is-enabled", "-q", "kubelet"], capture_output=True).returncode == 0


def _file_check(path: Path) -> tuple[str, str | None, bool]:
    """kubeadm's FileAvailable check; the stand-in never lets it be ignored (run 'kubeadm reset' first)."""
    name = "FileAvailable-" + str(path).replace("/", "-")
    return (name, f"{path} already exists" if path.exists() else None, False)


def _port_check(port: int) -> tuple[str, str | None, bool]:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
            busy = None
        except OSError:
            busy = f"Port {port} is in use"
    return (f"Port-{port}", busy, True)


# ------------------------------------------------------------------ init


def cmd_init(args: argparse.Namespace) -> int:
    if getattr(args, "phase_cmd", None):
        return int(args.func(args) or 0)
    check_mix(args, NO_MIX_INIT)
    cfg = load_config(args.config)
    icfg, ccfg = cfg.get("InitConfiguration", {}), cfg.get("ClusterConfiguration", {})
    node = (args.node_name or _get(icfg, "nodeRegistration", "name") or common.hostname()).lower()
    cri = args.cri_socket or _get(icfg, "nodeRegistration", "criSocket") or common.DEFAULT_CRI_SOCKET
    advertise = (
        args.apiserver_advertise_address
        or _get(icfg, "localAPIEndpoint", "advertiseAddress")
        or common.node_ip()
    )
    port = args.apiserver_bind_port or _get(icfg, "localAPIEndpoint", "bindPort") or common.API_PORT
    endpoint = args.control_plane_endpoint or ccfg.get("controlPlaneEndpoint") or f"{advertise}:{port}"
    ep_host, ep_port = common.split_endpoint(endpoint, port)
    endpoint = f"{ep_host}:{ep_port}"
    extra_sans = [s for s in (args.apiserver_cert_extra_sans or "").split(",") if s] or list(
        _get(ccfg, "apiServer", "certSANs", default=[]) or []
    )
    version = args.kubernetes_version or ccfg.get("kubernetesVersion") or VERSION
    pod_cidr = args.pod_network_cidr or _get(ccfg, "networking", "podSubnet")
    svc_cidr = args.service_cidr or _get(ccfg, "networking", "serviceSubnet") or "10.96.0.0/12"
    tokens_cfg = icfg.get("bootstrapTokens") or [{}]
    token = args.token or tokens_cfg[0].get("token") or common.new_token()
    if not common.TOKEN_RE.match(token):
        raise Failure(
            f'the bootstrap token "{token}" was not of the form "^([a-z0-9]{{6}})\\.([a-z0-9]{{16}})$"'
        )
    ttl = parse_duration(args.token_ttl or tokens_cfg[0].get("ttl") or "24h0m0s")
    ignored = args.ignore_preflight_errors + list(
        _get(icfg, "nodeRegistration", "ignorePreflightErrors", default=[]) or []
    )
    upload = args.upload_certs
    cert_key = args.certificate_key or icfg.get("certificateKey")
    common.log_invocation(
        "kubeadm",
        ["(effective)", "init"],
        node=node,
        advertise=advertise,
        endpoint=endpoint,
        extra_sans=extra_sans,
        pod_cidr=pod_cidr,
        cri_socket=cri,
        upload_certs=upload,
    )

    print(f"[init] Using Kubernetes version: {version}")
    preflight(
        [
            *base_checks(cri),
            _port_check(port),
            _file_check(MANIFEST),
            _file_check(ADMIN_CONF),
            _file_check(KUBELET_CONF),
        ],
        ignored,
    )
    print("[preflight] Pulling images required for setting up a Kubernetes cluster")
    print(f'[certs] Using certificateDir folder "{PKI}"')
    print('[certs] Generating "ca" certificate and key')
    common.new_ca(PKI / "ca.crt", PKI / "ca.key")
    sans = apiserver_sans(node, advertise, ep_host, extra_sans, svc_cidr)
    print('[certs] Generating "apiserver" certificate and key')
    print(
        "[certs] apiserver serving cert is signed for DNS names "
        f"[{' '.join(s for s in sans if not common._is_ip(s))}] "
        f"and IPs [{' '.join(s for s in sans if common._is_ip(s))}]"
    )
    common.issue(
        PKI / "apiserver.key",
        PKI / "apiserver.crt",
        "/CN=kube-apiserver",
        PKI / "ca.crt",
        PKI / "ca.key",
        sans,
    )
    print('[certs] Generating "sa" key and public key')
    common.openssl("genrsa", "-out", str(PKI / "sa.key"), "2048")
    common.openssl("rsa", "-in", str(PKI / "sa.key"), "-pubout", "-out", str(PKI / "sa.pub"))

    STATE_DIR.mkdir(parents=True, exist_ok=True)
    common.write_private(STATE_DIR / "peer.secret", secrets.token_hex(32))
    tid, tsecret = token.split(".")
    now = time.time()
    state: dict[str, Any] = {
        "revision": 1,
        "cluster": {
            "name": ccfg.get("clusterName", "kubernetes"),
            "controlPlaneEndpoint": endpoint,
            "version": version,
            "podSubnet": pod_cidr,
            "serviceSubnet": svc_cidr,
            "certSANs": extra_sans,
        },
        "members": [{"name": node, "address": f"{advertise}:{port}"}],
        "tokens": {
            tid: {
                "secret": tsecret,
                "expires": now + ttl if ttl > 0 else None,
                "usages": ["signing", "authentication"],
                "groups": ["system:bootstrappers:kubeadm:default-node-token"],
                "description": tokens_cfg[0].get("description")
                or "The default bootstrap token generated by 'kubeadm init'.",
                "created": now,
            }
        },
        "certificateKey": None,
        "nodes": {},
    }
    if upload:
        cert_key = cert_key or secrets.token_hex(32)
        state["certificateKey"] = {
            "sha256": hashlib.sha256(cert_key.encode()).hexdigest(),
            "expires": now + 7200,
        }
    common.write_private(STATE_DIR / "cluster.json", json.dumps(state))

    server = f"https://{endpoint}"
    write_kubeconfigs(node, server, admin=True)
    start_apiserver(node, advertise, port)
    start_kubelet(node, cri, server)
    wait_node_registered(node)
    mark_control_plane(node)
    print(f"[bootstrap-token] Using token: {token}")
    print("[bootstrap-token] Configuring bootstrap tokens, cluster-info ConfigMap, RBAC Roles")
    print("[addons] Applied essential addon: CoreDNS")
    print("[addons] Applied essential addon: kube-proxy")

    ca_hash = common.ca_cert_hash((PKI / "ca.crt").read_bytes())
    shown_token = "<value withheld>" if args.skip_token_print else token
    join = f"kubeadm join {endpoint} --token {shown_token} \\\n\t--discovery-token-ca-cert-hash {ca_hash}"
    print("\nYour Kubernetes control-plane has initialized successfully!\n")
    print("To start using your cluster, you need to run the following as a regular user:\n")
    print("  mkdir -p $HOME/.kube\n  sudo cp -i /etc/kubernetes/admin.conf $HOME/.kube/config")
    print("  sudo chown $(id -u):$(id -g) $HOME/.kube/config\n")
    print(
        "Alternatively, if you are the root user, you can "
        "run:\n\n  export KUBECONFIG=/etc/kubernetes/admin.conf\n"
    )
    print("You should now deploy a pod network to the cluster.")
    print('Run "kubectl apply -f [podnetwork].yaml" with one of the options listed at:')
    print("  https://kubernetes.io/docs/concepts/cluster-administration/addons/\n")
    if upload:
        print(
            '[upload-certs] Storing the certificates in Secret "kubeadm-certs" in the "kube-system" Namespace'
        )
        print("[upload-certs] Using certificate key:")
        print("<value withheld>" if args.skip_certificate_key_print else cert_key)
        shown_key = "<value withheld>" if args.skip_certificate_key_print else cert_key
        print(
            "You can now join any number of control-plane nodes "
            "running the following command on each as root:\n"
        )
        print(f"  {join} \\\n\t--control-plane --certificate-key {shown_key}\n")
        print("Please note that the certificate-key gives access to cluster sensitive data, keep it secret!")
        print("As a safeguard, uploaded-certs will be deleted in two hours; If necessary, you can use")
        print('"kubeadm init phase upload-certs --upload-certs" to reload certs afterward.\n')
    elif args.control_plane_endpoint or ccfg.get("controlPlaneEndpoint"):
        print("You can now join any number of control-plane nodes by copying certificate authorities")
        print("and service account keys on each node and then running the following as root:\n")
        print(f"  {join} \\\n\t--control-plane\n")
    print("Then you can join any number of worker nodes by running the following on each as root:\n")
    print(f"{join}")
    return 0


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


# ------------------------------------------------------------------ join


def cmd_join(args: argparse.Namespace) -> int:
    check_mix(args, NO_MIX_JOIN)
    cfg = load_config(args.config).get("JoinConfiguration", {})
    bt = _get(cfg, "discovery", "bootstrapToken", default={}) or {}
    endpoint = args.endpoint or bt.get("apiServerEndpoint")
    if args.discovery_file or _get(cfg, "discovery", "file"):
        raise Failure("the kubeadm stand-in supports token discovery only")
    token = args.discovery_token or args.token or bt.get("token")
    tls_token = args.tls_bootstrap_token or args.token or _get(cfg, "discovery", "tlsBootstrapToken") or token
    hashes = args.discovery_token_ca_cert_hash or list(bt.get("caCertHashes") or [])
    unsafe = args.discovery_token_unsafe_skip_ca_verification or bool(bt.get("unsafeSkipCAVerification"))
    control_plane = args.control_plane or "controlPlane" in cfg
    cert_key = args.certificate_key or _get(cfg, "controlPlane", "certificateKey")
    node = (args.node_name or _get(cfg, "nodeRegistration", "name") or common.hostname()).lower()
    cri = args.cri_socket or _get(cfg, "nodeRegistration", "criSocket") or common.DEFAULT_CRI_SOCKET
    advertise = (
        args.apiserver_advertise_address
        or _get(cfg, "controlPlane", "localAPIEndpoint", "advertiseAddress")
        or common.node_ip()
    )
    port = (
        args.apiserver_bind_port
        or _get(cfg, "controlPlane", "localAPIEndpoint", "bindPort")
        or common.API_PORT
    )
    ignored = args.ignore_preflight_errors + list(
        _get(cfg, "nodeRegistration", "ignorePreflightErrors", default=[]) or []
    )
    if not endpoint:
        raise Failure(
            "discovery.bootstrapToken.apiServerEndpoint: Required value: the API server endpoint is required"
        )
    if not token:
        raise Failure('discovery.bootstrapToken.token: Invalid value: "": the bootstrap token is invalid')
    for label, value in (("discovery", token), ("tlsBootstrapToken", tls_token)):
        if not common.TOKEN_RE.match(value):
            raise Failure(f'{label}: Invalid value: "{common.redact(value)}": the bootstrap token is invalid')
    if not hashes and not unsafe:
        raise Failure(
            'discovery.bootstrapToken: Invalid value: "": using '
            "token-based discovery without caCertHashes can be "
            "unsafe. Set unsafeSkipCAVerification as true in your kubeadm config file or pass "
            "--discovery-token-unsafe-skip-ca-verification flag to continue"
        )
    for value in hashes:
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", value):
            raise Failure(
                f'discovery.bootstrapToken.caCertHashes: Invalid value: "{value}": invalid hash format'
            )
    if control_plane and cert_key and not common.CERT_KEY_RE.match(cert_key):
        raise Failure(
            "error execution phase control-plane-prepare/download-certs: error downloading certs: "
            "error decoding certificate key: encoding/hex: invalid byte"
        )
    common.log_invocation(
        "kubeadm",
        ["(effective)", "join"],
        node=node,
        endpoint=endpoint,
        control_plane=control_plane,
        ca_cert_hashes=hashes,
        cri_socket=cri,
        advertise=advertise,
    )

    checks = [*base_checks(cri), _file_check(KUBELET_CONF), _file_check(PKI / "ca.crt")]
    if control_plane:
        checks += [_port_check(port), _file_check(MANIFEST)]
    preflight(checks, ignored)
    ep_host, ep_port = common.split_endpoint(endpoint)
    endpoint = f"{ep_host}:{ep_port}"
    ca_pem, server = discover(endpoint, token, hashes, unsafe)
    print(
        '[preflight] Reading configuration from the "kubeadm-config" ConfigMap in namespace "kube-system"...'
    )
    tmp = STATE_DIR / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    bootstrap_api = Api(server, ca_pem, token=tls_token)

    if control_plane:
        join_control_plane(bootstrap_api, node, advertise, port, cert_key, ca_pem, server, endpoint)

    print("[kubelet-start] Waiting for the kubelet to perform the TLS Bootstrap")
    key = tmp / "kubelet.key"
    csr = common.new_key_and_csr(key, f"/O=system:nodes/CN=system:node:{node}")
    try:
        cert = bootstrap_api.request(
            "POST", "/standin/v1/bootstrap", {"csr": csr.decode(), "nodeName": node}
        )["certificate"]
    except ApiError as exc:
        raise Failure(
            f"error execution phase kubelet-start: failed to create a kubelet client certificate with the "
            f"bootstrap token: {exc}"
        ) from exc
    except Unreachable as exc:
        raise Failure(f"error execution phase kubelet-start: {exc}") from exc
    PKI.mkdir(parents=True, exist_ok=True)
    if not (PKI / "ca.crt").exists():
        (PKI / "ca.crt").write_bytes(ca_pem)
    common.write_private(
        KUBELET_CONF,
        common.kubeconfig(server, ca_pem, f"system:node:{node}", cert.encode(), key.read_bytes()),
    )
    key.unlink()
    start_kubelet(node, cri, server)
    wait_node_registered(node)
    if control_plane:
        mark_control_plane(node)
        print("\nThis node has joined the cluster and a new control plane instance was created:\n")
        print("* Certificate signing request was sent to apiserver and approval was received.")
        print("* The Kubelet was informed of the new secure connection details.")
        print("* Control plane label and taint were applied to the new node.")
        print("* The Kubernetes control plane instances scaled up.")
        print("* A new etcd member was added to the local/stacked etcd cluster.\n")
        print(
            "To start administering your cluster from this node, "
            "you need to run the following as a regular user:\n"
        )
        print("\tmkdir -p $HOME/.kube\n\tsudo cp -i /etc/kubernetes/admin.conf $HOME/.kube/config")
        print("\tsudo chown $(id -u):$(id -g) $HOME/.kube/config\n")
        print("Run 'kubectl get nodes' to see this node join the cluster.\n")
    else:
        print("\nThis node has joined the cluster:")
        print("* Certificate signing request was sent to apiserver and a response was received.")
        print("* The Kubelet was informed of the new secure connection details.\n")
        print("Run 'kubectl get nodes' on the control-plane to see this node join the cluster.\n")
    return 0


def discover(endpoint: str, token: str, hashes: list[str], unsafe: bool) -> tuple[bytes, str]:
    """Token discovery: fetch cluster-info insecurely, check its JWS with the token and the CA by its hash."""
    tid, tsecret = token.split(".")
    insecure = Api(f"https://{endpoint}", None, insecure=True, timeout=5)
    started = time.monotonic()
    while True:
        try:
            info = insecure.request("GET", "/api/v1/namespaces/kube-public/configmaps/cluster-info")
            break
        except (Unreachable, ApiError) as exc:
            if time.monotonic() - started > DISCOVERY_TIMEOUT:
                raise Failure(
                    f"error execution phase preflight: couldn't validate the identity of the API Server: "
                    f'Get "https://{endpoint}/api/v1/namespaces/kube-public/configmaps/cluster-info'
                    f'?timeout=10s": {exc}'
                ) from exc
            print(f"[discovery] Failed to request cluster-info, will try again: {exc}", file=sys.stderr)
            time.sleep(1)
    data = info.get("data", {})
    kubeconfig = data.get("kubeconfig", "")
    jws = data.get(f"jws-kubeconfig-{tid}")
    if not jws:
        raise Failure(
            "error execution phase preflight: couldn't validate "
            "the identity of the API Server: could not find a "
            f'JWS signature in the cluster-info ConfigMap for token ID "{tid}"'
        )
    if not common.jws_verify(kubeconfig, jws, tid, tsecret):
        raise Failure(
            "error execution phase preflight: couldn't validate the identity of the API Server: failed to "
            "verify JWS signature of received cluster info object, can't trust this API Server"
        )
    cluster = (miniyaml.load(kubeconfig) or {}).get("clusters", [{}])[0].get("cluster", {})
    ca_pem = common.base64.b64decode(cluster.get("certificate-authority-data", ""))
    actual = common.ca_cert_hash(ca_pem)
    if not unsafe and actual not in hashes:
        raise Failure(
            "error execution phase preflight: couldn't validate "
            "the identity of the API Server: cluster CA found in "
            f'cluster-info ConfigMap is invalid: none of the public keys "{actual}" are pinned'
        )
    server = f"https://{endpoint}"
    try:  # the endpoint must present a certificate from that CA, valid for the endpoint's name
        Api(server, ca_pem, timeout=5).request("GET", "/version")
    except ssl.SSLCertVerificationError as exc:
        raise Failure(
            f"error execution phase preflight: couldn't validate the identity of the API Server: "
            f'Get "{server}/version": tls: failed to verify certificate: {exc.verify_message}'
        ) from exc
    except (Unreachable, ApiError) as exc:
        raise Failure(f"error execution phase preflight: {exc}") from exc
    print(
        "[discovery] Cluster info signature and contents are valid "
        "and TLS certificate validates against pinned roots, "
        f'will use API Server "{endpoint}"'
    )
    return ca_pem, server


def join_control_plane(
    api: Api,
    node: str,
    advertise: str,
    port: int,
    cert_key: str | None,
    ca_pem: bytes,
    server: str,
    endpoint: str,
) -> None:
    print("[preflight] Running pre-flight checks before initializing the new control plane instance")
    if not cert_key:
        if not (PKI / "ca.key").exists():
            raise Failure(
                "error execution phase preflight: \nOne or more "
                "conditions for hosting a new control plane instance "
                "is not satisfied.\n\n[failure loading certificate "
                "for CA: couldn't load the certificate file "
                f"{PKI}/ca.crt: open {PKI}/ca.crt: no such file or directory]\n\nPlease ensure that:\n"
                "* The cluster has a stable controlPlaneEndpoint address.\n"
                "* The certificates that must be shared among control plane instances are provided."
            )
        bundle = None
    else:
        print(
            "[download-certs] Downloading the certificates in "
            'Secret "kubeadm-certs" in the "kube-system" Namespace'
        )
        try:
            bundle = api.request("POST", "/standin/v1/download-certs", {"certificateKey": cert_key})
        except ApiError as exc:
            if exc.status == 404:
                reason = f"error downloading the secret: {exc}"
            elif exc.status == 403:
                reason = f"error decoding secret data with provided key: {exc}"
            else:
                reason = str(exc)
            raise Failure(
                "error execution phase control-plane-prepare/download-certs: "
                f"error downloading certs: {reason}"
            ) from exc
        PKI.mkdir(parents=True, exist_ok=True)
        for name, text in bundle["files"].items():
            path = PKI / name
            path.write_text(text)
            path.chmod(0o600 if name.endswith(".key") else 0o644)
    if (PKI / "ca.crt").read_bytes().strip() != ca_pem.strip():
        raise Failure(
            "error execution phase control-plane-prepare: the CA "
            "in /etc/kubernetes/pki does not match the cluster's"
        )
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    if bundle:
        common.write_private(STATE_DIR / "peer.secret", bundle["peerSecret"])
        common.write_private(STATE_DIR / "cluster.json", json.dumps(bundle["snapshot"]))
    cluster = (bundle or {}).get("snapshot", {}).get("cluster", {})
    ep_host = common.split_endpoint(endpoint)[0]
    print('[certs] Generating "apiserver" certificate and key')
    sans = apiserver_sans(
        node,
        advertise,
        ep_host,
        list(cluster.get("certSANs") or []),
        cluster.get("serviceSubnet") or "10.96.0.0/12",
    )
    common.issue(
        PKI / "apiserver.key",
        PKI / "apiserver.crt",
        "/CN=kube-apiserver",
        PKI / "ca.crt",
        PKI / "ca.key",
        sans,
    )
    write_kubeconfigs(node, server, admin=True)
    admin = common.KubeConfig(ADMIN_CONF).api()
    print("[control-plane-join] Adding this control plane to the cluster")
    admin.request("POST", "/standin/v1/members", {"name": node, "address": f"{advertise}:{port}"})
    start_apiserver(node, advertise, port)


# ------------------------------------------------------------------ reset


def cmd_reset(args: argparse.Namespace) -> int:
    if not args.force:
        print(
            "W1213 reset.go] [reset] WARNING: Changes made to this host "
            "by 'kubeadm init' or 'kubeadm join' will be reverted."
        )
        answer = ""
        with contextlib.suppress(EOFError):
            answer = input("[reset] Are you sure you want to proceed? [y/N]: ")
        if answer.strip().lower() != "y":
            raise Failure(
                "error execution phase preflight: won't proceed; "
                "the user didn't answer (Y|y) in order to continue"
            )
    print("[reset] Reading configuration from the cluster...")
    if ADMIN_CONF.exists() and APISERVER_UNIT.exists():
        with contextlib.suppress(Exception):
            common.KubeConfig(ADMIN_CONF).api(timeout=3).request(
                "DELETE", f"/standin/v1/members/{common.hostname()}"
            )
    print("[preflight] Running pre-flight checks")
    print("[reset] Stopping the kubelet service")
    subprocess.run(["systemctl", "stop", "kubelet"], capture_output=True)
    if APISERVER_UNIT.exists():
        subprocess.run(["systemctl", "disable", "--now", APISERVER_UNIT.name], capture_output=True)
        APISERVER_UNIT.unlink()
        subprocess.run(["systemctl", "daemon-reload"], capture_output=True)
    dirs = [KUBE / "manifests", KUBELET_DIR, PKI, STATE_DIR]
    print(f"[reset] Deleting contents of directories: [{' '.join(map(str, dirs))}]")
    for d in dirs:
        if d.is_dir():
            for child in d.iterdir():
                shutil.rmtree(child) if child.is_dir() else child.unlink()
    files = [
        KUBE / f
        for f in (
            "admin.conf",
            "super-admin.conf",
            "kubelet.conf",
            "bootstrap-kubelet.conf",
            "controller-manager.conf",
            "scheduler.conf",
        )
    ]
    print(f"[reset] Deleting files: [{' '.join(map(str, files))}]")
    for f in files:
        f.unlink(missing_ok=True)
    print("\nThe reset process does not clean CNI configuration. To do so, you must remove /etc/cni/net.d\n")
    return 0


# ------------------------------------------------------------------ token / upload-certs / version


def _admin(args: argparse.Namespace) -> common.KubeConfig:
    path = Path(args.kubeconfig or ADMIN_CONF)
    if not path.exists():
        raise Failure(f"failed to load admin kubeconfig: open {path}: no such file or directory")
    return common.KubeConfig(path)


def _call(kc: common.KubeConfig, method: str, path: str, body: Any = None) -> Any:
    try:
        return kc.api().request(method, path, body)
    except Unreachable as exc:
        raise Failure(f"failed to create API client: {exc}") from exc
    except ApiError as exc:
        raise Failure(str(exc)) from exc


def cmd_token_create(args: argparse.Namespace) -> int:
    kc = _admin(args)
    if args.token and not common.TOKEN_RE.match(args.token):
        raise Failure(
            f'the bootstrap token "{args.token}" was not of the form "^([a-z0-9]{{6}})\\.([a-z0-9]{{16}})$"'
        )
    body = {
        "token": args.token,
        "ttlSeconds": parse_duration(args.ttl),
        "usages": args.usages.split(","),
        "groups": args.groups.split(","),
        "description": args.description,
    }
    token = _call(kc, "POST", "/standin/v1/tokens", body)["token"]
    if not args.print_join_command:
        print(token)
        return 0
    state = _call(kc, "GET", "/standin/v1/state")
    ca_hash = common.ca_cert_hash(kc.ca_pem or b"")
    endpoint = state["cluster"]["controlPlaneEndpoint"]
    line = f"kubeadm join {endpoint} --token {token} --discovery-token-ca-cert-hash {ca_hash} "
    if args.certificate_key:
        line += f"--control-plane --certificate-key {args.certificate_key}"
    print(line)
    return 0


def cmd_token_list(args: argparse.Namespace) -> int:
    items = _call(_admin(args), "GET", "/standin/v1/tokens")["items"]
    if args.output == "json":
        for item in items:
            print(
                json.dumps(
                    {
                        "kind": "BootstrapToken",
                        "apiVersion": "output.kubeadm.k8s.io/v1alpha3",
                        **_token_out(item),
                    },
                    indent=4,
                )
            )
        return 0
    if not items:  # like kubeadm, no header without tokens
        return 0
    rows = [("TOKEN", "TTL", "EXPIRES", "USAGES", "DESCRIPTION", "EXTRA GROUPS")]
    for item in items:
        exp = item.get("expires")
        ttl = "<forever>" if not exp else _human(exp - time.time())
        rows.append(
            (
                item["token"],
                ttl,
                common.now_iso(exp) if exp else "<never>",
                ",".join(item["usages"]),
                item["description"] or "<none>",
                ",".join(item["groups"]),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    for r in rows:
        print("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return 0


def _token_out(item: dict[str, Any]) -> dict[str, Any]:
    return {
        "token": item["token"],
        "description": item["description"],
        "usages": item["usages"],
        "groups": item["groups"],
        "expires": common.now_iso(item["expires"]) if item.get("expires") else None,
    }


def _human(seconds: float) -> str:
    if seconds <= 0:
        return "<invalid>"
    if seconds >= 3600:
        return f"{int(seconds // 3600)}h"
    if seconds >= 60:
        return f"{int(seconds // 60)}m"
    return f"{int(seconds)}s"


def cmd_token_delete(args: argparse.Namespace) -> int:
    kc = _admin(args)
    for token in args.tokens:
        tid = token.split(".")[0]
        if not re.fullmatch(r"[a-z0-9]{6}", tid):
            raise Failure(
                'given token didn\'t match pattern "^([a-z0-9]{6})$" or "^([a-z0-9]{6})\\.([a-z0-9]{16})$"'
            )
        try:
            kc.api().request("DELETE", f"/standin/v1/tokens/{tid}")
        except ApiError as exc:
            raise Failure(f'failed to delete bootstrap token "{tid}": {exc}') from exc
        print(f'bootstrap token "{tid}" deleted')
    return 0


def cmd_upload_certs(args: argparse.Namespace) -> int:
    if not args.upload_certs:
        print("[upload-certs] Skipping phase. Please see --upload-certs")
        return 0
    kc = _admin(args)
    key = args.certificate_key or secrets.token_hex(32)
    if not common.CERT_KEY_RE.match(key):
        raise Failure(
            "error execution phase upload-certs: error decoding certificate key: encoding/hex: invalid byte"
        )
    _call(kc, "PUT", "/standin/v1/certificate-key", {"sha256": hashlib.sha256(key.encode()).hexdigest()})
    print('[upload-certs] Storing the certificates in Secret "kubeadm-certs" in the "kube-system" Namespace')
    print("[upload-certs] Using certificate key:")
    print("<value withheld>" if args.skip_certificate_key_print else key)
    return 0


def cmd_version(args: argparse.Namespace) -> int:
    major, minor = VERSION.lstrip("v").split(".")[:2]
    info = {
        "major": major,
        "minor": minor,
        "gitVersion": VERSION,
        "gitCommit": "standin",
        "gitTreeState": "clean",
        "buildDate": "2024-12-10T00:00:00Z",
        "goVersion": "go1.22.9",
        "compiler": "gc",
        "platform": "linux/amd64",
    }
    if args.output == "short":
        print(VERSION)
    elif args.output == "json":
        print(json.dumps({"clientVersion": info}, indent=2))
    elif args.output == "yaml":
        print(miniyaml.dump({"clientVersion": info}), end="")
    else:
        fields = ", ".join(f'{k[0].upper() + k[1:]}:"{v}"' for k, v in info.items())
        print(f"kubeadm version: &version.Info{{{fields}}}")
    return 0
