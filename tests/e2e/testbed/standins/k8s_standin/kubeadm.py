"""kubeadm stand-in: init, join, reset, token, upload-certs, version, with kubeadm's observable behaviour.

What tether depends on is real: a CA made with openssl, bootstrap tokens in kubeadm's form with TTLs,
``--discovery-token-ca-cert-hash`` checked against the CA's public key, tokens checked by the API server
(JWS-signed cluster-info, then TLS bootstrap), certificate keys that expire after 2 h, control-plane joins
that download the CA and start their own API server. Every call is logged (secrets as SHA-256) to
/var/log/kubeadm-standin/kubeadm.log. Auth failures fail fast instead of retrying until a timeout.
"""

from __future__ import annotations

import argparse
import secrets
import sys
from typing import Any

from k8s_standin import common
from k8s_standin.kubeadm_admin import (
    cmd_config_images,
    cmd_reset,
    cmd_token_create,
    cmd_token_delete,
    cmd_token_list,
    cmd_upload_certs,
    cmd_version,
)
from k8s_standin.kubeadm_base import ADMIN_CONF, Failure
from k8s_standin.kubeadm_init import cmd_init
from k8s_standin.kubeadm_join import cmd_join


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

    cfg = sub.add_parser("config")
    cfg_sub = cfg.add_subparsers(dest="config_cmd", required=True, parser_class=Parser)
    images = cfg_sub.add_parser("images")
    images_sub = images.add_subparsers(dest="images_cmd", required=True, parser_class=Parser)
    for action in ("pull", "list"):
        p = images_sub.add_parser(action)
        p.add_argument("--config")
        p.add_argument("--kubernetes-version")
        p.add_argument("--image-repository")
        p.add_argument("--cri-socket")
        p.add_argument("--output", "-o", default="text")
        p.add_argument("--v", "-v", dest="verbosity")
        p.set_defaults(func=cmd_config_images, action=action)

    version = sub.add_parser("version")
    version.add_argument("--output", "-o", default="")
    version.set_defaults(func=cmd_version)
    return parser
