"""tetherctl env diff, rollout status|pause|resume|abort|undo, agent upgrade|bundles."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import grpc

from tether.controller import wire
from tether.controller.cli.client import CliError, Session, check_size_here, explain, read_input
from tether.controller.cli.output import LIST_FORMATS, colour, emit, eta, shape, straggler, table, until, when
from tether.controller.spec import SpecError, inline_local_files
from tether.nodeagent.limits import MAX_DOCUMENT_BYTES

DIFF_ERROR = 2  # kubectl diff: 0 nothing would change, 1 something would, >1 an error


def add_parser(sub: Any) -> None:
    ro = sub.add_parser("rollout", help="how a new generation moves through an environment's nodes")
    verbs = ro.add_subparsers(dest="verb", required=True)
    st = verbs.add_parser("status", help="state, generation and per-node progress")
    st.add_argument("--env", dest="environment", required=True)
    st.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    st.set_defaults(func=status)
    for verb, text in (
        ("pause", "admit no more nodes (those running go on)"),
        ("resume", "go on after a pause, a canary or a halt"),
        ("abort", "admit no more nodes; those not yet moved stay on their generation"),
        ("undo", "re-apply the previous generation's document as a new rollout, same policy"),
    ):
        v = verbs.add_parser(verb, help=text)
        v.add_argument("--env", dest="environment", required=True)
        v.set_defaults(func=steer, verb=verb)

    agent = sub.add_parser("agent", help="node agent versions").add_subparsers(dest="verb", required=True)
    up = agent.add_parser("upgrade", help="move an environment's agents to a version, as a rollout")
    up.add_argument("--env", dest="environment", required=True)
    up.add_argument("--version", default="", help="default: the controller's own version")
    up.set_defaults(func=upgrade)
    b = agent.add_parser("bundles", help="the agent versions the controller can hand out")
    b.add_argument("-o", "--output", choices=LIST_FORMATS, default="table")
    b.set_defaults(func=bundles)


def add_diff_parser(env: Any) -> None:
    d = env.add_parser(
        "diff", help="the steps each node would add, change or remove (exit 0 none, 1 some, >1 error)"
    )
    d.add_argument("-f", "--file", required=True, help="Environment YAML ('-' for stdin)")
    d.add_argument("-o", "--output", choices=("text", "json"), default="text")
    d.add_argument("--max-document-bytes", type=int, default=MAX_DOCUMENT_BYTES)
    d.set_defaults(func=env_diff)


# -- diff --------------------------------------------------------------------------------------


def request_diff(args: argparse.Namespace, document: str) -> Any:
    """The controller's diff of ``document``; an invalid document prints its problems (exit 1)."""
    s = Session(args)
    try:
        return s.stub.DiffEnvironment(wire.admin.DiffEnvironmentRequest(document=document), timeout=s.timeout)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
            raise CliError(exc.details() or "invalid document", exit_code=DIFF_ERROR) from None
        raise explain(exc, s.conf.controller) from None


def print_diff(reply: Any, output: str) -> None:
    if output == "json":
        emit(shape(reply), "json")
        return
    changing = [n for n in reply.nodes if n.steps]
    state = f"generation {reply.generation}" if reply.generation else "not applied yet"
    counts = f"{len(changing)} of {len(reply.nodes)} node(s) would change"
    print(f"environment/{reply.environment} ({state}): {counts}")
    mark = {"added": "+", "changed": "~", "removed": "-"}
    for n in changing:
        print(f"  {n.name}:")
        for c in n.steps:
            print(f"    {mark.get(c.change, '?')} {c.name} ({c.change})")


def env_diff(args: argparse.Namespace) -> int:
    try:
        return _env_diff(args)
    except CliError as exc:
        raise CliError(str(exc), exit_code=max(exc.exit_code, DIFF_ERROR)) from None
    except grpc.RpcError as exc:
        err = explain(exc)
        raise CliError(str(err), exit_code=DIFF_ERROR) from None


def _env_diff(args: argparse.Namespace) -> int:
    base_dir = Path.cwd() if args.file == "-" else Path(args.file).parent
    try:
        document = inline_local_files(read_input(args.file), base_dir)
    except SpecError as exc:
        raise CliError("\n".join(exc.problems), exit_code=DIFF_ERROR) from None
    check_size_here(document, args)
    reply = request_diff(args, document)
    for note in reply.notes:
        print(f"note: {note}", file=sys.stderr)
    print_diff(reply, args.output)
    return 1 if reply.changed else 0


# -- rollouts ----------------------------------------------------------------------------------


def print_rollout(r: Any, with_eta: bool = False) -> None:
    """The rollout; ``with_eta`` (``rollout status``, whose call estimates): its ETA too."""
    head = f"rollout of {r.environment}: {r.state}, generation {r.from_generation} -> {r.generation}"
    if r.agent_version:
        head += f" (agent {r.agent_version})"
    print(head)
    if r.reason:
        print(f"  {r.reason}")
    print(f"  updated {r.updated}, running {r.running}, pending {r.pending}, failed {r.failed}")
    if with_eta and r.state == "progressing":
        print(
            f"  eta {when(r.eta_ms)} ({until(r.eta_ms)})"
            if r.eta_ms
            else "  eta unknown (not enough history)"
        )
    if r.nodes:
        rows = [
            (
                n.name,
                colour(n.state),
                n.step or "-",
                when(n.updated_ms),
                eta(n.eta_ms),
                straggler(n.straggler),
                n.message,
            )
            for n in r.nodes
        ]
        table(rows, ("NODE", "STATE", "STEP", "SINCE", "ETA", "STRAGGLER", "MESSAGE"), indent="  ")


def status(args: argparse.Namespace) -> int:
    r = Session(args).call("GetRollout", wire.admin.GetRolloutRequest(environment=args.environment))
    if args.output == "table":
        print_rollout(r, with_eta=True)
    else:
        emit(shape(r), args.output)
    return 0


def steer(args: argparse.Namespace) -> int:
    method = {
        "pause": "PauseRollout",
        "resume": "ResumeRollout",
        "abort": "AbortRollout",
        "undo": "UndoRollout",
    }
    r = Session(args).call(method[args.verb], wire.admin.RolloutRequest(environment=args.environment))
    print_rollout(r)
    return 0


def upgrade(args: argparse.Namespace) -> int:
    r = Session(args).call(
        "UpgradeAgents", wire.admin.UpgradeAgentsRequest(environment=args.environment, version=args.version)
    )
    print_rollout(r)
    return 0


def bundles(args: argparse.Namespace) -> int:
    reply = Session(args).call("ListAgentBundles", wire.admin.ListAgentBundlesRequest())
    if args.output not in ("table", "wide"):
        emit([shape(b) for b in reply.bundles], args.output)
        return 0
    shown = None if args.output == "wide" else 16
    table([(b.version, b.sha256[:shown], b.size) for b in reply.bundles], ("VERSION", "SHA256", "SIZE"))
    return 0
