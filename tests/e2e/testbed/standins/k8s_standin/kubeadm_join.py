"""kubeadm join (stand-in): token discovery with the CA pinned by hash, TLS bootstrap, control-plane joins."""

from __future__ import annotations

import argparse
import json
import re
import ssl
import sys
import time

from k8s_standin import common, miniyaml
from k8s_standin.common import PKI, STATE_DIR, Api, ApiError, Unreachable
from k8s_standin.kubeadm_base import (
    ADMIN_CONF,
    DISCOVERY_TIMEOUT,
    KUBELET_CONF,
    MANIFEST,
    NO_MIX_JOIN,
    Failure,
    apiserver_sans,
    base_checks,
    check_mix,
    dig,
    file_check,
    load_config,
    mark_control_plane,
    port_check,
    preflight,
    start_apiserver,
    start_kubelet,
    wait_node_registered,
    write_kubeconfigs,
)


def cmd_join(args: argparse.Namespace) -> int:
    check_mix(args, NO_MIX_JOIN)
    cfg = load_config(args.config).get("JoinConfiguration", {})
    bt = dig(cfg, "discovery", "bootstrapToken", default={}) or {}
    endpoint = args.endpoint or bt.get("apiServerEndpoint")
    if args.discovery_file or dig(cfg, "discovery", "file"):
        raise Failure("the kubeadm stand-in supports token discovery only")
    token = args.discovery_token or args.token or bt.get("token")
    tls_token = args.tls_bootstrap_token or args.token or dig(cfg, "discovery", "tlsBootstrapToken") or token
    hashes = args.discovery_token_ca_cert_hash or list(bt.get("caCertHashes") or [])
    unsafe = args.discovery_token_unsafe_skip_ca_verification or bool(bt.get("unsafeSkipCAVerification"))
    control_plane = args.control_plane or "controlPlane" in cfg
    cert_key = args.certificate_key or dig(cfg, "controlPlane", "certificateKey")
    node = (args.node_name or dig(cfg, "nodeRegistration", "name") or common.hostname()).lower()
    cri = args.cri_socket or dig(cfg, "nodeRegistration", "criSocket") or common.DEFAULT_CRI_SOCKET
    advertise = (
        args.apiserver_advertise_address
        or dig(cfg, "controlPlane", "localAPIEndpoint", "advertiseAddress")
        or common.node_ip()
    )
    port = (
        args.apiserver_bind_port
        or dig(cfg, "controlPlane", "localAPIEndpoint", "bindPort")
        or common.API_PORT
    )
    ignored = args.ignore_preflight_errors + list(
        dig(cfg, "nodeRegistration", "ignorePreflightErrors", default=[]) or []
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
        certificate_key=common.redact(cert_key) if control_plane and cert_key else None,
    )

    checks = [*base_checks(cri), file_check(KUBELET_CONF), file_check(PKI / "ca.crt")]
    if control_plane:
        checks += [port_check(port), file_check(MANIFEST)]
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
