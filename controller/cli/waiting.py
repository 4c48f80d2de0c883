"""``tetherctl wait``: until every named node is provisioned on its environment's current generation.

The check is the SDK's (``tether.controller.client.waiting``), shared by ``wait`` and ``events
--follow --until-done``: done, failed (a node failed a step of the current generation, or the
rollout halted), or still waiting. Here: the arguments, the progress lines and the exit codes
(0 done, 1 failed or halted, 2 timed out).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import threading
from collections.abc import Callable
from typing import Any

from tether.controller import tokens
from tether.controller.cli.client import CliError, Session, explain
from tether.controller.client import waiting as sdk
from tether.controller.client.errors import ApiError

POLL_SECONDS = sdk.POLL_SECONDS
EXIT_FAILED, EXIT_TIMEOUT = 1, 2
Verdict = sdk.Progress  # what one check says (done, failure, waiting)


class Progress:
    """Asks the controller how far the named nodes (or an environment's nodes) are."""

    def __init__(self, session: Session, environment: str = "", nodes: tuple[str, ...] = ()) -> None:
        if not environment and not nodes:
            raise CliError("--env or --node is required", exit_code=EXIT_TIMEOUT)
        self.s, self.environment, self.nodes = session, environment, nodes

    def check(self) -> Verdict:
        """One check; an RPC error becomes one message (as for every tetherctl call)."""
        try:
            if not self.environment:
                return sdk.check_nodes(self.s.client, self.nodes)
            verdict = sdk.check(self.s.client, self.environment)
        except ApiError as exc:
            raise explain(exc, self.s.conf.controller) from None
        if verdict.timed_out and not verdict.nodes:
            waiting = f"no node of environment {self.environment} has enrolled yet"
            return dataclasses.replace(verdict, waiting=waiting)
        return verdict


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


def timeout_of(timeout: str) -> float:
    """``--timeout`` in seconds."""
    try:
        return tokens.parse_duration(timeout)
    except ValueError as exc:
        raise CliError(f"--timeout: {exc}", exit_code=EXIT_TIMEOUT) from None


def _show(verdict: Verdict) -> None:
    if verdict.waiting:  # a line each time what it waits for changes
        print(f"waiting: {verdict.waiting}", file=sys.stderr, flush=True)


def wait(args: argparse.Namespace) -> int:
    if args.condition != "provisioned":
        raise CliError("--for provisioned is the condition tetherctl can wait for", exit_code=EXIT_TIMEOUT)
    progress = Progress(Session(args), args.environment, tuple(args.node))
    seconds = timeout_of(args.wait_timeout)
    verdict = sdk.wait_until(progress.check, timeout=seconds, poll_seconds=POLL_SECONDS, on_progress=_show)
    if verdict.done:
        what = f"environment {args.environment}" if args.environment else ", ".join(args.node)
        print(f"{what}: provisioned")
        return 0
    if verdict.failure:
        print(f"tetherctl: {verdict.failure}", file=sys.stderr)
        return EXIT_FAILED
    print(f"tetherctl: timed out after {args.wait_timeout}: {verdict.waiting}", file=sys.stderr)
    return EXIT_TIMEOUT


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
