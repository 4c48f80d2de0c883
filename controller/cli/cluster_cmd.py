"""tetherctl cluster: health, kubeconfig export and join-material expiry for kubeadm clusters."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tether.controller import wire
from tether.controller.cli.client import CliError, Session
from tether.controller.cli.output import colour, emit, shape, table


def add_parser(sub: Any) -> None:
    cluster = sub.add_parser("cluster", help="kubeadm clusters").add_subparsers(dest="verb", required=True)
    h = cluster.add_parser("health", help="Progressing / Degraded / Available and every node's Ready state")
    h.add_argument("--env", dest="environment", required=True)
    h.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    h.set_defaults(func=health)
    k = cluster.add_parser("kubeconfig", help="print the cluster's admin kubeconfig (it holds credentials)")
    k.add_argument("--env", dest="environment", required=True)
    k.add_argument(
        "--server", default="", help="API address to write into it (default: the cluster endpoint)"
    )
    k.set_defaults(func=kubeconfig)
    x = cluster.add_parser(
        "expire-join-material", help="make the next join fetch fresh kubeadm join material"
    )
    x.add_argument("--env", dest="environment", required=True)
    x.set_defaults(func=expire)


def health(args: argparse.Namespace) -> int:
    h = Session(args).call(
        "GetClusterHealth", wire.admin.GetClusterHealthRequest(environment=args.environment)
    )
    if args.output != "table":
        emit(shape(h), args.output)
        return 0
    print(f"Environment:  {h.environment} ({'available' if h.available else 'not available'})")
    print(f"API server:   {h.api_server} at {h.endpoint or '-'} (initialised by {h.init_node or '-'})")
    for c in h.conditions:
        print(f"{c.type + ':':<13} {'True ' if c.status else 'False'} {c.reason}: {c.message}")
    table(
        [
            (
                n.name,
                n.role,
                colour("Ready" if n.ready else "NotReady"),
                n.version or "-",
                n.internal_ip or "-",
                n.agent_state,
                n.kubelet or "-",
            )
            for n in h.nodes
        ],
        ("NODE", "ROLE", "STATUS", "VERSION", "INTERNAL-IP", "AGENT", "KUBELET"),
    )
    return 0


def kubeconfig(args: argparse.Namespace) -> int:
    reply = Session(args).call(
        "GetKubeconfig", wire.admin.GetKubeconfigRequest(environment=args.environment, server=args.server)
    )
    if sys.stdout.isatty():
        print(
            "tetherctl: this kubeconfig grants cluster-admin; redirect it to a file with mode 0600",
            file=sys.stderr,
        )
    sys.stdout.write(reply.kubeconfig)
    return 0


def expire(args: argparse.Namespace) -> int:
    if not args.environment:
        raise CliError("--env is required")
    Session(args).call(
        "ExpireJoinMaterial", wire.admin.ExpireJoinMaterialRequest(environment=args.environment)
    )
    print(f"environment/{args.environment}: join material expired; the next join fetches fresh material")
    return 0
