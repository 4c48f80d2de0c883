"""tetherctl verbs: each takes the parsed arguments and returns the exit code."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import grpc

from tether.controller import paging, tokens, wire
from tether.controller.cli import controller_cmd, describe, node_cmd, rollout_cmd
from tether.controller.cli.client import CliError, Session, check_size_here, explain, read_input
from tether.controller.cli.output import ago, colour, emit, eta, shape, shape_times, straggler, table, when
from tether.controller.cli.waiting import UntilDone
from tether.controller.client.errors import AbortedError, ApiError, InvalidArgumentError
from tether.controller.cluster.context import preview_context
from tether.controller.render import NodeContext, render
from tether.controller.render.targets import facts_for
from tether.controller.spec import SpecError, inline_local_files, load_document, names
from tether.nodeagent.model import Event, Plan

# -- environments ------------------------------------------------------------------------------

EXIT_CONFLICT = 3  # env apply --expect-generation: the environment is at another generation


def env_apply(args: argparse.Namespace) -> int:
    if args.expect_generation < 0:
        raise CliError("--expect-generation: a generation is 1 or more (0: no check)")
    base_dir = Path.cwd() if args.file == "-" else Path(args.file).parent
    local_notes: list[str] = []  # which local files were read, from where
    try:
        document = inline_local_files(read_input(args.file), base_dir, notes=local_notes)
    except SpecError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    for note in local_notes:
        print(f"note: {note}", file=sys.stderr)
    check_size_here(document, args)
    s = Session(args)
    try:
        reply = s.client.apply_environment(
            document, dry_run=args.dry_run, expected_generation=args.expect_generation
        )
    except InvalidArgumentError as exc:  # one line per problem: "spec.path: what is wrong"
        for line in [str(v) for v in exc.field_violations] or exc.message.splitlines():
            print(line, file=sys.stderr)
        return 1
    except AbortedError as exc:  # "environment 'lab' is at generation 4, not 3"
        raise CliError(f"{exc.message} (nothing applied)", exit_code=EXIT_CONFLICT) from None
    except ApiError as exc:
        raise explain(exc, s.conf.controller) from None
    env = reply.environment
    for note in reply.notes:
        print(f"note: {note}", file=sys.stderr)
    shown = _with_dns_name(env.name)
    if args.dry_run:
        rollout_cmd.print_diff(rollout_cmd.request_diff(args, document), "text")
        print(f"environment/{shown} valid (dry run, nothing stored)")
    elif reply.changed:
        print(f"environment/{shown} applied (generation {env.generation})")
    else:
        print(f"environment/{shown} unchanged (generation {env.generation})")
    return 0


def _with_dns_name(name: str) -> str:
    """``aws_kubeadm_example (DNS name aws-kubeadm-example)``; a DNS label as it is."""
    dns = names.dns_name(name)
    return name if dns == name else f"{name} (DNS name {dns})"


def _shape_env(env: Any) -> dict[str, Any]:
    """An environment for -o json/yaml, with ``dns_name``: its name where a DNS label is needed."""
    return {**shape(env), "dns_name": names.dns_name(env.name)}


def env_get(args: argparse.Namespace) -> int:
    """``-o yaml``: the document as applied, byte for byte (``env apply -f -`` of it is a no-op);
    ``-o json``: the environment's record (generation, times, node count, the document)."""
    env = Session(args).call("GetEnvironment", wire.admin.GetEnvironmentRequest(name=args.name))
    if args.output == "yaml":
        sys.stdout.write(env.document)
        if names.dns_name(env.name) != env.name:
            print(f"note: environment {_with_dns_name(env.name)}", file=sys.stderr)
    else:
        emit(_shape_env(env), args.output)
    return 0


def env_list(args: argparse.Namespace) -> int:
    s = Session(args)
    envs = s.collect(s.client.iter_environments(page_size=paging.MAX_PAGE_SIZE))
    if args.output not in ("table", "wide"):
        data = [{k: v for k, v in _shape_env(e).items() if k != "document"} for e in envs]
        emit(data, args.output)
        return 0
    headers = ["NAME", "GENERATION", "NODES", "API VERSION", "UPDATED"]
    rows = [
        [_with_dns_name(e.name), e.generation, e.node_count, e.api_version, when(e.updated_ms)] for e in envs
    ]
    if args.output == "wide":
        headers += ["CREATED", "AGENT VERSION"]
        for row, e in zip(rows, envs, strict=True):
            row += [when(e.created_ms), e.agent_version or "-"]
    table(rows, headers)
    return 0


def env_delete(args: argparse.Namespace) -> int:
    session = Session(args)
    session.call(
        "DeleteEnvironment",
        wire.admin.DeleteEnvironmentRequest(name=args.name, force=args.force, reset=args.reset),
    )
    try:
        session.stub.GetEnvironment(wire.admin.GetEnvironmentRequest(name=args.name), timeout=args.timeout)
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.NOT_FOUND:
            raise explain(exc, session.conf.controller) from None
        print(f"environment/{args.name} deleted")
        return 0
    print(f"environment/{args.name}: its nodes are being reset; it is deleted once the last one is gone")
    return 0


def env_validate(args: argparse.Namespace) -> int:
    base_dir = Path.cwd() if args.file == "-" else Path(args.file).parent
    local_notes: list[str] = []
    try:
        document = inline_local_files(read_input(args.file), base_dir, notes=local_notes)
        check_size_here(document, args)
        loaded = load_document(document)
    except SpecError as exc:
        for problem in exc.problems:
            print(problem)
        return 1
    for note in [*local_notes, *loaded.notes]:
        print(f"note: {note}", file=sys.stderr)
    print("valid")
    return 0


def env_render(args: argparse.Namespace) -> int:
    base_dir = Path.cwd() if args.file == "-" else Path(args.file).parent
    local_notes: list[str] = []
    try:
        loaded = load_document(inline_local_files(read_input(args.file), base_dir, notes=local_notes))
    except SpecError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    for note in [*local_notes, *loaded.notes]:
        print(f"note: {note}", file=sys.stderr)
    try:
        facts = facts_for(args.os, gpu=args.gpu, arch=args.arch)
        cluster = preview_context(loaded.spec, getattr(args, "cluster_position", ""))
    except ValueError as exc:
        raise CliError(str(exc)) from None
    role = args.role  # a cluster position decides the role (the default --role worker gives way)
    if cluster is not None:
        if role == "control-plane" and not cluster.control_plane:
            raise CliError("--cluster-position worker is a worker node; leave out --role control-plane")
        role = cluster.position.role
    rendered = render(loaded.spec, NodeContext(role=role, facts=facts, cluster=cluster))
    plan = Plan.build(rendered.steps, environment=loaded.spec.name, role=role)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for i, step in enumerate(plan.steps, 1):
            (out / f"{i:02d}-{step.name}.sh").write_text(step.script)
        print(f"wrote {len(plan.steps)} steps to {out}")
        return 0
    _print_plan(plan)
    return 0


def _print_plan(plan: Plan) -> None:
    print(
        f"# plan for environment {plan.environment}, role {plan.role}: {len(plan.steps)} steps, "
        f"digest {plan.digest[:12]}"
    )
    for i, step in enumerate(plan.steps, 1):
        flags = []
        if step.gate:
            flags.append(f"gate={step.gate}")
        if step.reboot:
            flags.append("reboot")
        if step.continue_on_error:
            flags.append("continue-on-error")
        print(
            f"\n# --- {i:02d} {step.name} (phase {step.phase or '-'}, timeout {step.timeout_seconds}s"
            f"{', ' + ', '.join(flags) if flags else ''}) ---"
        )
        for k in sorted(step.env):
            print(f"# env {k}={step.env[k]!r}")
        for k in step.secret_env:
            print(f"# env {k}=<secret, delivered just in time>")
        print(step.script.rstrip("\n"))


# -- tokens ------------------------------------------------------------------------------------


def token_create(args: argparse.Namespace) -> int:
    try:
        ttl = tokens.parse_duration(args.ttl)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.uses < 1:
        raise CliError("--uses must be at least 1")
    s = Session(args)
    reply = s.call(
        "CreateToken",
        wire.admin.CreateTokenRequest(
            environment=args.environment,
            role=args.role,
            ttl_seconds=ttl,
            uses=args.uses,
            node_name=args.node_name,
            description=args.description,
        ),
    )
    if args.print_join_command:
        import shlex

        # The token travels in the agent's environment, never on its command line (/proc/PID/cmdline
        # is world-readable); the agent drops it once read. Still one line to paste and append to.
        # Every live controller replica, the one that answered first: the agent fails over.
        live = controller_cmd.live_addresses(s)
        controllers = ",".join([reply.controller, *(a for a in live if a != reply.controller)])
        cmd = (
            f"TETHER_JOIN_TOKEN={shlex.quote(reply.token)} tether-agent run "
            f"--controller {shlex.quote(controllers)} --ca-hash {shlex.quote(reply.ca_hash)}"
        )
        if args.node_name:
            cmd += f" --node-name {shlex.quote(args.node_name)}"
        print(cmd)
    else:
        print(reply.token)
    return 0


def token_list(args: argparse.Namespace) -> int:
    s = Session(args)
    listed = s.collect(s.client.iter_tokens(args.environment, page_size=paging.MAX_PAGE_SIZE))
    if args.output not in ("table", "wide"):
        emit([shape(t) for t in listed], args.output)
        return 0
    wide = args.output == "wide"
    headers = ["ID", "ENVIRONMENT", "ROLE", "NODE", "USES", "STATUS", "EXPIRES", "DESCRIPTION"]
    rows = []
    for t in listed:
        row: list[Any] = [t.id, t.environment, t.role, t.node_name or "-", f"{t.uses}/{t.max_uses}"]
        row += [colour(t.status or "-"), when(t.expires_ms), t.description]
        rows.append([*row, when(t.created_ms)] if wide else row)
    table(rows, [*headers, "CREATED"] if wide else headers)
    return 0


def token_revoke(args: argparse.Namespace) -> int:
    Session(args).call("RevokeToken", wire.admin.RevokeTokenRequest(id=args.id))
    print(f"token/{args.id} revoked")
    return 0


# -- nodes -------------------------------------------------------------------------------------


def node_list(args: argparse.Namespace) -> int:
    if getattr(args, "watch", False):
        return node_cmd.node_watch(args)  # -w: the list, then its changes
    s = Session(args)
    nodes = s.collect(s.client.iter_nodes(args.environment, page_size=paging.MAX_PAGE_SIZE))
    if args.output not in ("table", "wide"):
        emit([shape(n) for n in nodes], args.output)
        return 0
    headers = ["NAME", "ENVIRONMENT", "ROLE", "STATE", "OS", "AGENT", "SEEN", "ETA", "STRAGGLER"]
    if args.output == "wide":
        headers += ["GENERATION", "ARCH", "KERNEL", "GPUS", "ADDRESSES", "ENROLLED"]
    rows = []
    for n in nodes:
        row = [n.name, n.environment, n.role, colour(n.state), n.facts.os_pretty or "-"]
        row += [n.agent_version or "-", "now" if n.connected else ago(n.last_seen_ms)]
        row += [eta(n.eta_ms), straggler(n.straggler)]
        if args.output == "wide":
            row += [n.plan_generation, n.facts.arch or "-", n.facts.kernel or "-", _gpu_count(n)]
            row += [",".join(n.facts.addresses) or "-", when(n.enrolled_ms)]
        rows.append(row)
    table(rows, headers)
    return 0


def _gpu_count(n: Any) -> int:
    return len(n.facts.gpus) if n.facts.gpus else (1 if n.facts.nvidia_gpu else 0)


def node_describe(args: argparse.Namespace) -> int:
    n = Session(args).call("GetNode", wire.admin.GetNodeRequest(name=args.name))
    if args.output != "text":
        emit(shape(n), args.output)
        return 0
    describe.node(n, sys.stdout)
    return 0


def node_revoke(args: argparse.Namespace) -> int:
    Session(args).call("RevokeNode", wire.admin.RevokeNodeRequest(name=args.name))
    print(f"node/{args.name} revoked")
    return 0


def node_rerun(args: argparse.Namespace) -> int:
    Session(args).call("RerunSteps", wire.admin.RerunStepsRequest(node=args.name, steps=args.step))
    print(f"node/{args.name}: rerun of {', '.join(args.step) or 'all steps'} requested")
    return 0


# -- events ------------------------------------------------------------------------------------


def _print_event(e: Event, node_column: bool) -> None:
    prefix = f"{e.node} " if node_column else ""
    head = f"{prefix}#{e.seq} {when(e.time_ms)} {e.kind.label:<9} {e.step or '-'}"
    extra = []
    if e.attempt > 1:
        extra.append(f"attempt {e.attempt}")
    if e.kind.label in ("succeeded", "failed"):
        extra.append(f"exit {e.exit_code}")
        extra.append(f"{e.duration_seconds:.2f}s")
    if e.message:
        extra.append(e.message)
    if e.observed:
        extra.append("observed " + ", ".join(f"{k}={v}" for k, v in sorted(e.observed.items())))
    print(head + (" (" + "; ".join(extra) + ")" if extra else ""), flush=not e.lines)
    for line in e.lines:
        print(f"    | {line}")
    sys.stdout.flush()


def events(args: argparse.Namespace) -> int:
    if not args.node and not (args.follow and args.environment):
        raise CliError("--node is required (or --env with --follow)")
    s = Session(args)
    request = wire.admin.ListEventsRequest(node=args.node, after_seq=args.after, environment=args.environment)
    if not args.follow:
        evs: list[Event] = []
        after = args.after
        while True:  # page through everything, however long the history
            page = s.call("ListEvents", wire.admin.ListEventsRequest(node=args.node, after_seq=after))
            evs.extend(wire.event_from_pb(m) for m in page.events)
            if not page.events:
                break
            after = page.events[-1].seq
        if args.output == "json":
            emit([shape_times(e.to_json()) for e in evs], "json")
        else:
            for e in evs:
                _print_event(e, False)
        return 0
    call = s.stub.FollowEvents(request)
    watch = None
    if args.until_done:
        watch = UntilDone(s, args.environment, (args.node,) if args.node else (), call.cancel)
    try:
        for m in call:
            e = wire.event_from_pb(m)
            if args.output == "json":
                print(json.dumps(shape_times(e.to_json())), flush=True)
            else:
                _print_event(e, not args.node)
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.CANCELLED:
            raise explain(exc, s.conf.controller) from None
    return watch.finish() if watch is not None else 0


# -- plans -------------------------------------------------------------------------------------


def plan(args: argparse.Namespace) -> int:
    s = Session(args)
    if args.node:
        if args.cluster_position:
            raise CliError("--cluster-position previews an environment (--env); a node has its own")
        request = wire.admin.RenderPlanRequest(node=args.node)
    elif args.environment:
        try:
            facts = facts_for(args.os)
        except ValueError as exc:
            raise CliError(str(exc)) from None
        request = wire.admin.RenderPlanRequest(
            environment=args.environment,
            role=args.role,
            facts=wire.facts_to_pb(facts),
            cluster_position=args.cluster_position,
        )
    else:
        raise CliError("--node or --env is required")
    p = wire.plan_from_pb(s.call("RenderPlan", request))
    if args.output == "json":
        emit(shape(wire.plan_to_pb(p)), "json")
    else:
        _print_plan(p)
    return 0
