"""tetherctl cluster: health, kubeconfig export and join-material expiry for kubeadm clusters."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from tether.controller import wire
from tether.controller.cli.client import CliError, Session
from tether.controller.cli.output import colour, emit, shape, table
from tether.controller.spec import bounded_yaml, checks, load


def add_parser(sub: Any) -> None:
    cluster = sub.add_parser("cluster", help="kubeadm clusters").add_subparsers(dest="verb", required=True)
    h = cluster.add_parser("health", help="Progressing / Degraded / Available and every node's Ready state")
    h.add_argument("--env", dest="environment", required=True)
    h.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    h.set_defaults(func=health)
    k = cluster.add_parser("kubeconfig", help="print the cluster's admin kubeconfig (it holds credentials)")
    k.add_argument("--env", dest="environment", required=True)
    k.add_argument(
        "--server",
        default="",
        help="API address to write into it (default: K8sEndpointHost with kubernetes.remoteAccess, "
        "else the cluster endpoint)",
    )
    k.add_argument(
        "--file",
        default="",
        help="write it to this file, mode 0600 ('-': print it; default: the spec's kubernetes.kubeConfig, "
        "relative to the working directory, else print it)",
    )
    k.add_argument("--overwrite", action="store_true", help="replace a file that is already there")
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
    drifted = [(n.name, c) for n in h.nodes for c in n.conditions]
    if drifted:
        print("GPU conditions:")
        for name, c in drifted:
            print(f"  {name}: {c.type} ({c.reason}): {c.message}")
    return 0


def kubeconfig(args: argparse.Namespace) -> int:
    session = Session(args)
    reply = session.call(
        "GetKubeconfig", wire.admin.GetKubeconfigRequest(environment=args.environment, server=args.server)
    )
    target, origin = args.file, "--file"
    if not target:
        env = session.call("GetEnvironment", wire.admin.GetEnvironmentRequest(name=args.environment))
        target, origin = spec_kubeconfig_path(env.document), "spec.kubernetes.kubeConfig"
    if target and target != "-":
        path = Path(target)
        what = write_private(path, reply.kubeconfig, overwrite=args.overwrite, origin=origin)
        print(
            f"environment/{args.environment}: kubeconfig {what} {path} ({origin}, mode 0600); "
            "it grants cluster-admin",
            file=sys.stderr,
        )
        return 0
    if sys.stdout.isatty():
        print(
            "tetherctl: this kubeconfig grants cluster-admin; redirect it to a file with mode 0600",
            file=sys.stderr,
        )
    sys.stdout.write(reply.kubeconfig)
    return 0


def spec_kubeconfig_path(document: str) -> str:
    """holodeck's ``kubernetes.kubeConfig`` of an environment document ("" when it names none).

    The document is read as the controller reads it: a stream of several YAML documents is read
    for its one Environment, keys match in any case. A path tether would refuse (absolute, ``~``,
    ``..``: one stored before the rule was) is a ``CliError`` naming it, never silently ignored."""
    try:
        doc, _ = load.pick_environment(bounded_yaml.load_all(document))
    except (yaml.YAMLError, load.SpecError):
        return ""
    value = _field(_field(_field(doc, "spec"), "kubernetes"), "kubeConfig")
    if not value or not isinstance(value, str):
        return ""
    reason = checks.check_relative_path(value)
    if reason:
        raise CliError(
            f"spec.kubernetes.kubeConfig {value!r}: {reason}: give --file PATH (or --file - to print it)"
        )
    return value


def _field(mapping: Any, name: str) -> Any:
    """``mapping``'s ``name`` in any case (as the spec reader matches keys), else None."""
    if not isinstance(mapping, dict):
        return None
    return next((v for k, v in mapping.items() if str(k).lower() == name.lower()), None)


def write_private(path: Path, text: str, *, overwrite: bool, origin: str) -> str:
    """Write ``text`` to ``path`` (mode 0600, parents made); an existing file with other content is
    replaced only with ``overwrite``. Says what was done: written, replaced or unchanged."""
    if path.is_dir():
        raise CliError(f"{path} ({origin}) is a directory")
    if path.exists():
        if path.read_text(errors="replace") == text:
            os.chmod(path, 0o600)
            return "unchanged in"
        if not overwrite:
            raise CliError(
                f"{path} ({origin}) already exists and differs: pass --overwrite to replace it, "
                "or --file PATH / --file - to write it elsewhere"
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        replaced = path.exists()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return "replaced in" if replaced else "written to"


def expire(args: argparse.Namespace) -> int:
    if not args.environment:
        raise CliError("--env is required")
    Session(args).call(
        "ExpireJoinMaterial", wire.admin.ExpireJoinMaterialRequest(environment=args.environment)
    )
    print(f"environment/{args.environment}: join material expired; the next join fetches fresh material")
    return 0
