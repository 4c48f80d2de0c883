"""kubeadm reset, token create/list/delete, init phase upload-certs, version (stand-in)."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import re
import secrets
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from k8s_standin import VERSION, common, miniyaml
from k8s_standin.common import KUBE, KUBELET_DIR, PKI, STATE_DIR, ApiError, Unreachable
from k8s_standin.kubeadm_base import (
    ADMIN_CONF,
    APISERVER_UNIT,
    Failure,
    base_checks,
    dig,
    load_config,
    parse_duration,
)


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
    info = common.version_info()
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


def cmd_config_images(args: argparse.Namespace) -> int:
    """kubeadm config images list|pull: the control-plane images of the version; pull goes through the CRI
    (the stand-in only checks that the runtime answers, and pulls nothing)."""
    cfg = load_config(args.config)
    ccfg, icfg = cfg.get("ClusterConfiguration", {}), cfg.get("InitConfiguration", {})
    version = args.kubernetes_version or ccfg.get("kubernetesVersion") or VERSION
    repo = args.image_repository or ccfg.get("imageRepository") or "registry.k8s.io"
    images = [f"{repo}/{c}:{version}" for c in CONTROL_PLANE_IMAGES]
    images += [f"{repo}/coredns/coredns:v1.11.3", f"{repo}/pause:3.10", f"{repo}/etcd:3.5.15-0"]
    if args.action == "list":
        if args.output == "json":
            print(
                json.dumps(
                    {"kind": "Images", "apiVersion": "output.kubeadm.k8s.io/v1alpha3", "images": images}
                )
            )
        else:
            print("\n".join(images))
        return 0
    cri = args.cri_socket or dig(icfg, "nodeRegistration", "criSocket") or common.DEFAULT_CRI_SOCKET
    error = next(e for name, e, _ in base_checks(cri) if name == "CRI")
    if error is not None:
        detail = error.removeprefix("container runtime is not running: ")
        raise Failure(f"failed to create new CRI image service: {detail}")
    for image in images:
        print(f"[config/images] Pulled {image}")
    return 0


CONTROL_PLANE_IMAGES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy")
