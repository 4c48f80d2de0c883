"""kubeadm init (stand-in): a real CA, the API server stand-in, kubelet, bootstrap token, join commands."""

from __future__ import annotations

import argparse
import hashlib
import json
import secrets
import time
from typing import Any

from k8s_standin import VERSION, common, objects
from k8s_standin.common import PKI, STATE_DIR
from k8s_standin.kubeadm_base import (
    ADMIN_CONF,
    KUBELET_CONF,
    MANIFEST,
    NO_MIX_INIT,
    Failure,
    apiserver_sans,
    base_checks,
    check_mix,
    dig,
    file_check,
    load_config,
    mark_control_plane,
    parse_duration,
    port_check,
    preflight,
    start_apiserver,
    start_kubelet,
    wait_node_registered,
    write_kubeconfigs,
)


def cmd_init(args: argparse.Namespace) -> int:
    if getattr(args, "phase_cmd", None):
        return int(args.func(args) or 0)
    check_mix(args, NO_MIX_INIT)
    cfg = load_config(args.config)
    icfg, ccfg = cfg.get("InitConfiguration", {}), cfg.get("ClusterConfiguration", {})
    node = (args.node_name or dig(icfg, "nodeRegistration", "name") or common.hostname()).lower()
    cri = args.cri_socket or dig(icfg, "nodeRegistration", "criSocket") or common.DEFAULT_CRI_SOCKET
    advertise = (
        args.apiserver_advertise_address
        or dig(icfg, "localAPIEndpoint", "advertiseAddress")
        or common.node_ip()
    )
    port = args.apiserver_bind_port or dig(icfg, "localAPIEndpoint", "bindPort") or common.API_PORT
    endpoint = args.control_plane_endpoint or ccfg.get("controlPlaneEndpoint") or f"{advertise}:{port}"
    ep_host, ep_port = common.split_endpoint(endpoint, port)
    endpoint = f"{ep_host}:{ep_port}"
    extra_sans = [s for s in (args.apiserver_cert_extra_sans or "").split(",") if s] or list(
        dig(ccfg, "apiServer", "certSANs", default=[]) or []
    )
    version = args.kubernetes_version or ccfg.get("kubernetesVersion") or VERSION
    pod_cidr = args.pod_network_cidr or dig(ccfg, "networking", "podSubnet")
    svc_cidr = args.service_cidr or dig(ccfg, "networking", "serviceSubnet") or "10.96.0.0/12"
    tokens_cfg = icfg.get("bootstrapTokens") or [{}]
    token = args.token or tokens_cfg[0].get("token") or common.new_token()
    if not common.TOKEN_RE.match(token):
        raise Failure(
            f'the bootstrap token "{token}" was not of the form "^([a-z0-9]{{6}})\\.([a-z0-9]{{16}})$"'
        )
    ttl = parse_duration(args.token_ttl or tokens_cfg[0].get("ttl") or "24h0m0s")
    ignored = args.ignore_preflight_errors + list(
        dig(icfg, "nodeRegistration", "ignorePreflightErrors", default=[]) or []
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
            port_check(port),
            file_check(MANIFEST),
            file_check(ADMIN_CONF),
            file_check(KUBELET_CONF),
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
    objects.kubeadm_addons(state, now)
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
