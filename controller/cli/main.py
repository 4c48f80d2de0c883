"""tetherctl: drive a tether controller.

    tetherctl [--config admin.conf] env apply -f ENV.yaml | get NAME | list | delete NAME
    tetherctl env apply -f ENV.yaml --expect-generation N   (exit 3: it is at another generation)
    tetherctl env validate -f ENV.yaml            (offline)
    tetherctl env render -f ENV.yaml [--role R] [--os OS] [--gpu|--no-gpu] [--out DIR]   (offline)
    tetherctl token create --env NAME --role ROLE [--ttl 15m] [--uses 1] [--print-join-command]
    tetherctl node list [-w] | describe NAME | revoke NAME | rerun NAME [--step S] | release NAME
    tetherctl node delete NAME [--force] | reset NAME [--wait]
    tetherctl env delete NAME [--force | --reset]
    tetherctl env diff -f ENV.yaml [-o json]       (exit 0: no change, 1: some node changes)
    tetherctl rollout status|pause|resume|abort|undo --env NAME
    tetherctl wait (--env NAME | --node NAME ...) --for provisioned [--timeout 10m]
    tetherctl agent upgrade --env NAME [--version V] | agent bundles
    tetherctl events --node NAME [--follow [--until-done]] [-o json]
    tetherctl audit [--env NAME] [--limit N] [-o json]   (who changed what, newest first)
    tetherctl controller list [-o json]            (the controller replicas; which one leads)
    tetherctl plan --node NAME | --env NAME --role ROLE
    tetherctl bootstrap --env NAME --role ROLE (--ssh USER@HOST[:PORT] | --ssm ID | --inventory FILE)
    tetherctl config get-contexts | use-context NAME | add-context NAME --from FILE
    tetherctl version [--client]
    tetherctl completion bash|zsh|fish

Lists take -o wide (more columns), json or yaml. In json and yaml, numbers are numbers and times are
RFC 3339 UTC strings, named without their _ms suffix (last_seen, enrolled, updated, time...).

The admin config comes from --config, else $TETHER_CONFIG, else ~/.config/tether/admin.conf;
a file with several controllers picks one with --context, else $TETHER_CONTEXT, else its
current-context.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import grpc

from tether.controller.cli import (
    audit_cmd,
    bootstrap_cmd,
    cluster_cmd,
    commands,
    completion,
    config_cmd,
    controller_cmd,
    node_cmd,
    rollout_cmd,
    version_cmd,
    waiting,
)
from tether.controller.cli.client import CliError, explain
from tether.controller.cli.output import LIST_FORMATS, plain
from tether.nodeagent.limits import MAX_DOCUMENT_BYTES


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tetherctl",
        description="tether admin CLI",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=plain(__doc__ or ""),
    )
    p.add_argument("--config", help="admin config (default: $TETHER_CONFIG or ~/.config/tether/admin.conf)")
    p.add_argument("--context", help="which controller of a config with contexts (default: $TETHER_CONTEXT)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the controller")
    sub = p.add_subparsers(dest="group", metavar="COMMAND")

    def out_flag(sp: argparse.ArgumentParser, choices: tuple[str, ...] = ("table", "json", "yaml")) -> None:
        sp.add_argument("-o", "--output", choices=choices, default=choices[0])

    def document_limit(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--max-document-bytes",
            type=int,
            default=MAX_DOCUMENT_BYTES,
            help="refuse a larger document (match the controller's --max-document-bytes)",
        )

    def cluster_position(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--cluster-position",
            choices=("init", "control-plane", "worker"),
            default="",
            help="include the cluster steps of a node at this position (a spec with spec.cluster)",
        )

    env = sub.add_parser("env", help="environments").add_subparsers(dest="verb", required=True)
    a = env.add_parser("apply", help="create or update an environment from a YAML file")
    a.add_argument("-f", "--file", required=True, help="Environment YAML ('-' for stdin)")
    a.add_argument(
        "--dry-run",
        action="store_true",
        help="validate on the controller and show what each node would change; store nothing",
    )
    a.add_argument(
        "--expect-generation",
        type=int,
        default=0,
        metavar="N",
        help="apply only if the environment is at generation N (else exit 3, nothing applied; 0: no check)",
    )
    document_limit(a)
    a.set_defaults(func=commands.env_apply)
    rollout_cmd.add_diff_parser(env)
    g = env.add_parser("get", help="show one environment")
    g.add_argument("name")
    out_flag(g, ("yaml", "json"))
    g.set_defaults(func=commands.env_get)
    ls = env.add_parser("list", help="list environments")
    out_flag(ls, LIST_FORMATS)
    ls.set_defaults(func=commands.env_list)
    d = env.add_parser("delete", help="delete an environment")
    d.add_argument("name")
    d.add_argument("--force", action="store_true", help="even if nodes are still enrolled: they are revoked")
    d.add_argument(
        "--reset", action="store_true", help="reset its nodes first (node reset); it goes once they have"
    )
    d.set_defaults(func=commands.env_delete)
    v = env.add_parser("validate", help="check an Environment file offline (no controller needed)")
    v.add_argument("-f", "--file", required=True)
    document_limit(v)
    v.set_defaults(func=commands.env_validate, offline=True)
    r = env.add_parser("render", help="print the plan a node would get, offline")
    r.add_argument("-f", "--file", required=True)
    r.add_argument("--role", default="worker", choices=("control-plane", "worker"))
    r.add_argument(
        "--os",
        default="ubuntu-22.04",
        help="ubuntu-22.04, ubuntu-24.04, ubuntu-26.04, debian-12, rocky-9, fedora-42 or amazon-linux-2023",
    )
    gpu = r.add_mutually_exclusive_group()
    gpu.add_argument(
        "--gpu", dest="gpu", action="store_true", default=True, help="the node has an NVIDIA GPU"
    )
    gpu.add_argument("--no-gpu", dest="gpu", action="store_false")
    r.add_argument("--arch", default="amd64", choices=("amd64", "arm64"))
    r.add_argument("--out", help="write one file per step (NN-step-name.sh) into this directory")
    cluster_position(r)
    r.set_defaults(func=commands.env_render, offline=True)

    tok = sub.add_parser("token", help="join tokens").add_subparsers(dest="verb", required=True)
    c = tok.add_parser("create", help="create a join token (printed once)")
    c.add_argument("--env", required=True, dest="environment")
    c.add_argument("--role", default="worker")
    c.add_argument("--ttl", default="24h", help="lifetime, e.g. 15m, 2h, 7d (default 24h)")
    c.add_argument("--uses", type=int, default=1, help="how many nodes may use it (default 1)")
    c.add_argument("--node-name", default="", help="only this node may use it")
    c.add_argument("--description", default="")
    c.add_argument(
        "--print-join-command",
        action="store_true",
        help="print the full tether-agent command line instead of the bare token",
    )
    c.set_defaults(func=commands.token_create)
    tl = tok.add_parser("list", help="list join tokens (never their secrets)")
    tl.add_argument("--env", dest="environment", default="")
    out_flag(tl, LIST_FORMATS)
    tl.set_defaults(func=commands.token_list)
    tr = tok.add_parser("revoke", help="revoke a join token")
    tr.add_argument("id")
    tr.set_defaults(func=commands.token_revoke)

    node = sub.add_parser("node", help="nodes").add_subparsers(dest="verb", required=True)
    nl = node.add_parser("list", help="list nodes")
    nl.add_argument("--env", dest="environment", default="")
    nl.add_argument(
        "-w", "--watch", action="store_true", help="then a line per change until Ctrl-C (-o json: objects)"
    )
    out_flag(nl, LIST_FORMATS)
    nl.set_defaults(func=commands.node_list)
    nd = node.add_parser("describe", help="a node's facts, health and steps (requested vs observed)")
    nd.add_argument("name")
    out_flag(nd, ("text", "json", "yaml"))
    nd.set_defaults(func=commands.node_describe)
    nr = node.add_parser("revoke", help="revoke a node's identity (it can enroll again with a new token)")
    nr.add_argument("name")
    nr.set_defaults(func=commands.node_revoke)
    nx = node.add_parser("rerun", help="run steps of a node again")
    nx.add_argument("name")
    nx.add_argument("--step", action="append", default=[], help="step name (repeatable; default: all)")
    nx.set_defaults(func=commands.node_rerun)
    node_cmd.add_verbs(node)

    ev = sub.add_parser("events", help="a node's events, in order")
    ev.add_argument("--node", default="")
    ev.add_argument(
        "--env", dest="environment", default="", help="with --follow: every node of an environment"
    )
    ev.add_argument("--after", type=int, default=0, help="only events after this sequence number")
    ev.add_argument("--follow", "-f", action="store_true", help="keep streaming new events")
    ev.add_argument(
        "--until-done",
        action="store_true",
        help="with --follow: end once the nodes are provisioned (0), one fails or the rollout halts (1)",
    )
    out_flag(ev, ("text", "json"))
    ev.set_defaults(func=commands.events)

    cluster_cmd.add_parser(sub)
    rollout_cmd.add_parser(sub)
    audit_cmd.add_parser(sub)
    controller_cmd.add_parser(sub)
    waiting.add_parser(sub)
    bootstrap_cmd.add_parser(sub)
    config_cmd.add_parser(sub)
    version_cmd.add_parser(sub)
    completion.add_parser(sub, p)

    pl = sub.add_parser("plan", help="the plan the controller renders for a node")
    pl.add_argument("--node", default="")
    pl.add_argument("--env", dest="environment", default="")
    pl.add_argument("--role", default="worker")
    pl.add_argument("--os", default="ubuntu-22.04")
    cluster_position(pl)
    out_flag(pl, ("text", "json"))
    pl.set_defaults(func=commands.plan)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:  # bare ``tetherctl``: what it can do
        parser.print_help()
        return 0
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except CliError as exc:
        for line in str(exc).splitlines() or [""]:
            print(f"tetherctl: {line}" if line else "tetherctl: error", file=sys.stderr)
        return exc.exit_code
    except grpc.RpcError as exc:
        err = explain(exc)
        for line in str(err).splitlines():
            print(f"tetherctl: {line}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
