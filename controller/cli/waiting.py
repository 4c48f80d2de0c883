"""``tetherctl wait``: until every named node is provisioned on its environment's current generation.

One check (``Progress.check``) is shared by ``wait`` and ``events --follow --until-done``: done,
failed (a node failed a step of the current generation, or the rollout halted), or still waiting.
Exit codes: 0 done, 1 failed or halted, 2 timed out.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from tether.controller import tokens, wire
from tether.controller.cli.client import CliError, Session

POLL_SECONDS = 1.0
EXIT_FAILED, EXIT_TIMEOUT = 1, 2


@dataclass(frozen=True)
class Verdict:
    done: bool = False
    failure: str = ""  # one line naming the node and the step (or the halted rollout)
    waiting: str = ""  # what it still waits for, shown when it changes


class Progress:
    """Asks the controller how far the named nodes (or an environment's nodes) are."""

    def __init__(self, session: Session, environment: str = "", nodes: tuple[str, ...] = ()) -> None:
        if not environment and not nodes:
            raise CliError("--env or --node is required", exit_code=EXIT_TIMEOUT)
        self.s, self.environment, self.nodes = session, environment, nodes

    def check(self) -> Verdict:
        if self.environment:
            env = self.s.call("GetEnvironment", wire.admin.GetEnvironmentRequest(name=self.environment))
            halted = self._halted(env.name)
            if halted:
                return Verdict(failure=halted)
            listed = self.s.collect(self.s.client.iter_nodes(env.name))  # every page
            nodes = [n for n in listed if n.state != "revoked"]
            if not nodes:
                return Verdict(waiting=f"no node of environment {env.name} has enrolled yet")
            return _judge(nodes, {env.name: env}, self._node)
        found: list[Any] = []
        missing: list[str] = []
        for name in self.nodes:
            node = self._node(name)
            if node is None:
                missing.append(name)
            else:
                found.append(node)
        envs = {}
        for n in found:
            if n.environment not in envs:
                envs[n.environment] = self.s.call(
                    "GetEnvironment", wire.admin.GetEnvironmentRequest(name=n.environment)
                )
                halted = self._halted(n.environment)
                if halted:
                    return Verdict(failure=halted)
        verdict = _judge(found, envs, self._node)
        if missing and not verdict.failure:
            return Verdict(waiting=f"waiting for {', '.join(missing)} to enroll")
        return verdict

    def _node(self, name: str) -> Any:
        try:
            return self.s.stub.GetNode(wire.admin.GetNodeRequest(name=name), timeout=self.s.timeout)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise

    def _halted(self, environment: str) -> str:
        try:
            r = self.s.stub.GetRollout(
                wire.admin.GetRolloutRequest(environment=environment), timeout=self.s.timeout
            )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                return ""  # no rollout yet
            raise
        return (
            f"the rollout of {environment} (generation {r.generation}) halted: {r.reason}"
            if r.state == "halted"
            else ""
        )


def _judge(nodes: list[Any], envs: dict[str, Any], detail: Callable[[str], Any]) -> Verdict:
    """Done when every node is provisioned on its environment's current generation (and agent
    version); failed at the first node that failed a step there; else what is left."""
    behind, provisioning = [], []
    for n in nodes:
        env = envs[n.environment]
        current = n.plan_generation == env.generation
        if n.state == "revoked":
            return Verdict(failure=f"node {n.name} is revoked")
        if n.state == "failed" and current:
            steps = n.steps or getattr(detail(n.name), "steps", ())
            step = next((s for s in steps if s.state == "failed"), None)
            what = (
                f"step {step.name} failed ({step.message or f'exit {step.exit_code}'})" if step else "failed"
            )
            return Verdict(failure=f"node {n.name}: {what}")
        agent_ok = not env.agent_version or n.agent_version == env.agent_version
        if not current or not agent_ok:
            behind.append(n.name)
        elif n.state != "provisioned":
            provisioning.append(f"{n.name} ({n.state})")
    if not behind and not provisioning:
        return Verdict(done=True)
    done = len(nodes) - len(behind) - len(provisioning)
    parts = [f"{done}/{len(nodes)} provisioned"]
    if provisioning:
        parts.append(
            "provisioning: " + ", ".join(provisioning[:5]) + (" ..." if len(provisioning) > 5 else "")
        )
    if behind:
        parts.append(f"{len(behind)} not yet on the current generation")
    return Verdict(waiting="; ".join(parts))


class UntilDone:
    """``events --follow --until-done``: checks the nodes beside the stream and ends it (through
    ``cancel``) once they are done or one failed; ``finish`` prints the verdict, gives the exit code."""

    def __init__(self, session: Session, environment: str, nodes: tuple[str, ...], cancel: Callable[[], Any]):
        self._progress = Progress(session, environment, nodes)
        self._cancel = cancel
        self.verdict: Verdict | None = None
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="until-done", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        try:
            while not self._stop.is_set():
                verdict = self._progress.check()
                if verdict.done or verdict.failure:
                    self.verdict = verdict
                    break
                self._stop.wait(POLL_SECONDS)
        except BaseException as exc:  # reported by finish(), on the main thread
            self._error = exc
        self._cancel()

    def finish(self) -> int:
        self._stop.set()
        self._thread.join(timeout=30)
        if self._error is not None:
            raise self._error
        if self.verdict is None or self.verdict.done:
            return 0
        print(f"tetherctl: {self.verdict.failure}", file=sys.stderr)
        return EXIT_FAILED


def deadline_of(timeout: str) -> float:
    try:
        return time.monotonic() + tokens.parse_duration(timeout)
    except ValueError as exc:
        raise CliError(f"--timeout: {exc}", exit_code=EXIT_TIMEOUT) from None


def wait(args: argparse.Namespace) -> int:
    if args.condition != "provisioned":
        raise CliError("--for provisioned is the condition tetherctl can wait for", exit_code=EXIT_TIMEOUT)
    progress = Progress(Session(args), args.environment, tuple(args.node))
    deadline = deadline_of(args.wait_timeout)
    shown = ""
    while True:
        verdict = progress.check()
        if verdict.done:
            what = f"environment {args.environment}" if args.environment else ", ".join(args.node)
            print(f"{what}: provisioned")
            return 0
        if verdict.failure:
            print(f"tetherctl: {verdict.failure}", file=sys.stderr)
            return EXIT_FAILED
        if verdict.waiting != shown:
            print(f"waiting: {verdict.waiting}", file=sys.stderr, flush=True)
            shown = verdict.waiting
        if time.monotonic() >= deadline:
            print(f"tetherctl: timed out after {args.wait_timeout}: {verdict.waiting}", file=sys.stderr)
            return EXIT_TIMEOUT
        time.sleep(POLL_SECONDS)


def add_parser(sub: Any) -> None:
    w = sub.add_parser(
        "wait",
        help="wait until nodes are provisioned on the current generation "
        "(exit 0; 1 failed or halted; 2 timed out)",
    )
    which = w.add_mutually_exclusive_group(required=True)
    which.add_argument("--env", dest="environment", default="", help="every node of this environment")
    which.add_argument(
        "--node", action="extend", nargs="+", default=[], metavar="NODE", help="these nodes (repeatable)"
    )
    w.add_argument("--for", dest="condition", required=True, choices=("provisioned",))
    w.add_argument(
        "--timeout", dest="wait_timeout", default="10m", help="give up after this long (default 10m)"
    )
    w.set_defaults(func=wait)
