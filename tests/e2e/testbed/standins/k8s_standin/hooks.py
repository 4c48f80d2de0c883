"""kubeadm-standin: test hooks of the stand-in (not a kubeadm command).

``kubeadm-standin expire [--tokens] [--certificate-key]`` expires join material now (default: both);
``kubeadm-standin state`` prints the cluster state without secrets. Both use /etc/kubernetes/admin.conf.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from k8s_standin import common


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kubeadm-standin", description=__doc__)
    parser.add_argument("--kubeconfig", default=str(common.KUBE / "admin.conf"))
    sub = parser.add_subparsers(dest="cmd", required=True)
    expire = sub.add_parser("expire")
    expire.add_argument("--tokens", action="store_true")
    expire.add_argument("--certificate-key", action="store_true")
    sub.add_parser("state")
    args = parser.parse_args(argv)
    common.log_invocation("kubeadm-standin", argv)
    api = common.KubeConfig(Path(args.kubeconfig)).api()
    if args.cmd == "expire":
        both = not (args.tokens or args.certificate_key)
        body = {"tokens": both or args.tokens, "certificateKey": both or args.certificate_key}
        api.request("POST", "/standin/v1/expire", body)
        print(f"expired: {', '.join(k for k, v in body.items() if v)}")
    else:
        print(json.dumps(api.request("GET", "/standin/v1/state"), indent=2))
    return 0
