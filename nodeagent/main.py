"""``tether-agent``: the node agent's command line.

TETHER_JOIN_TOKEN=TOKEN tether-agent run [--config FILE] [--controller HOST:PORT[,...] --ca-hash sha256:HEX]
                 [--state-dir DIR] [--node-name NAME] [--metrics-textfile FILE.prom]
tether-agent run --state-dir DIR          (enrolled: the controller addresses are remembered there)
tether-agent validate-config [--config FILE] [flags]
tether-agent status [--state-dir DIR]
tether-agent facts
tether-agent version

The join token never stays on the agent's command line or in its environment: the agent takes
it out of ``os.environ`` once read (steps never inherit it), and execs itself again without
``--token`` and without ``TETHER_JOIN_TOKEN`` once enrolled (or at once, when it already was), so
``/proc/PID/cmdline`` and ``/proc/PID/environ`` of the running agent do not hold it.

A flag wins over the config file; see ``tether.nodeagent.config`` for the whole order.
"""

from __future__ import annotations

# isort: off
# First, before anything imports asyncio or hashlib: neither loads OpenSSL (see its docstring).
from tether.nodeagent import noopenssl  # noqa: F401

# isort: on
import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tether.nodeagent import __version__, facts, logs
from tether.nodeagent.config import DEFAULT_CONFIG, TOKEN_ENV, AgentConfig, load
from tether.nodeagent.errors import AgentError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tether-agent", description="tether node agent")
    sub = p.add_subparsers(dest="command", required=True)

    def config_flags(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--config", type=Path, help=f"YAML config file (default {DEFAULT_CONFIG} if it exists)"
        )
        sp.add_argument(
            "--controller",
            help="controller address HOST:PORT, or several replicas' A,B,... tried in turn "
            "(once enrolled, the state directory remembers them)",
        )
        sp.add_argument(
            "--token",
            help=f"join token (used once; prefer {TOKEN_ENV}=TOKEN or --token-file: not on a command line)",
        )
        sp.add_argument("--token-file", help="file holding the join token (mode 0600)")
        sp.add_argument("--ca-hash", help="sha256:HEX of the controller CA public key")
        sp.add_argument("--state-dir", type=Path, help="state directory (default /var/lib/tether)")
        sp.add_argument("--node-name", help="node name (default: the hostname)")
        sp.add_argument("--env", dest="environment", help="refuse a token not scoped to this environment")
        sp.add_argument("--role", help="refuse a token not scoped to this role")
        sp.add_argument("--heartbeat-seconds", type=float, help="health report interval")
        sp.add_argument("--backoff-max-seconds", type=float, help="longest wait between reconnect attempts")
        sp.add_argument("--reboot-command", help="command that reboots the node (default: systemctl reboot)")
        sp.add_argument("--log-level", help="debug, info, warning or error")
        sp.add_argument(
            "--metrics-textfile",
            type=Path,
            help="write the agent's metrics here every heartbeat (a .prom file in node-exporter's "
            "textfile directory)",
        )

    run = sub.add_parser("run", help="enroll if needed, then pull and run the plan")
    config_flags(run)
    check = sub.add_parser("validate-config", help="check the configuration and exit")
    config_flags(check)
    status = sub.add_parser("status", help="print the journal and outbox of a state directory")
    status.add_argument("--state-dir", type=Path, default=Path("/var/lib/tether"))
    sub.add_parser("facts", help="print what the agent detects about this host (JSON)")
    sub.add_parser("version", help="print the agent version")
    return p


def _load_config(args: argparse.Namespace) -> AgentConfig:
    path = args.config
    if path is None and DEFAULT_CONFIG.exists():
        path = DEFAULT_CONFIG
    overrides: dict[str, Any] = {
        "controller": args.controller,
        "token": args.token,
        "token_file": args.token_file,
        "ca_hash": args.ca_hash,
        "state_dir": args.state_dir,
        "node_name": args.node_name,
        "environment": args.environment,
        "role": args.role,
        "heartbeat_seconds": args.heartbeat_seconds,
        "backoff_max_seconds": args.backoff_max_seconds,
        "reboot_command": args.reboot_command,
        "log_level": args.log_level,
        "metrics_textfile": args.metrics_textfile,
    }
    return load(path, overrides, os.environ)


async def _run(config: AgentConfig, config_file: Path | None = None) -> bool:
    """Run the agent until a signal; True when it enrolled and should exec itself again."""
    from tether.nodeagent.session import Agent

    agent = Agent(config)
    agent.config_file = config_file  # a reset removes it
    agent.reexec_after_enrolling = True
    task = asyncio.create_task(agent.run())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return agent.reexec and not task.cancelled()


def _config_file(args: argparse.Namespace) -> Path | None:
    """The config file this run reads (``--config``, else the default one if it exists)."""
    path: Path | None = args.config
    if path is None and DEFAULT_CONFIG.exists():
        path = DEFAULT_CONFIG
    return path.absolute() if path is not None else None


def scrubbed_argv(argv: list[str]) -> list[str]:
    """``argv`` without ``--token VALUE`` / ``--token=VALUE`` (``--token-file`` stays)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--token":
            skip = True
        elif not arg.startswith("--token="):
            out.append(arg)
    return out


def _reexec() -> None:
    """Replace this process with a fresh run of the same command line (same PID for systemd).

    Without the join token: not in the arguments, not in the environment.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    argv = [sys.executable, *scrubbed_argv(sys.orig_argv[1:])]
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    os.execve(sys.executable, argv, env)  # noqa: S606 (our own argv, no shell)


def _token_held(config: AgentConfig, token_in_env: bool) -> bool:
    """Whether this process still shows a join token (argv or environ) that it no longer needs."""
    from tether.nodeagent.identity import IdentityStore

    shown = token_in_env or scrubbed_argv(sys.orig_argv) != sys.orig_argv
    return shown and IdentityStore(config.state_dir).exists()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "version":
        print(__version__)
        return 0
    if args.command == "facts":
        print(json.dumps(asdict(facts.collect_facts()), indent=2))
        return 0
    if args.command == "status":
        from tether.nodeagent.session import state_summary

        try:
            print(json.dumps(state_summary(args.state_dir), indent=2))
        except AgentError as exc:
            print(f"tether-agent: {exc}", file=sys.stderr)
            return 1
        except BrokenPipeError:
            return 0
        return 0
    token_in_env = TOKEN_ENV in os.environ
    try:
        config = _load_config(args)
    except AgentError as exc:
        print(f"tether-agent: {exc}", file=sys.stderr)
        return 2
    finally:
        os.environ.pop(TOKEN_ENV, None)  # read once: no step, no child process inherits it
    if args.command == "validate-config":
        print("valid")
        return 0
    if argv is None and _token_held(config, token_in_env):
        _reexec()  # enrolled already: the token is not needed, so it does not stay on show either
    logs.configure(config.log_level)
    _use_pidfd_child_watcher()
    try:
        if asyncio.run(_run(config, _config_file(args))):
            _reexec()
    except AgentError as exc:
        print(f"tether-agent: {exc}", file=sys.stderr)
        return exc.exit_code  # 77: revoked, 78: reset (the unit restarts neither)
    except KeyboardInterrupt:
        return 130
    return 0


def _use_pidfd_child_watcher() -> None:
    """Python 3.11 watches each step's bash with a thread of its own; a pidfd needs none.

    (3.12 picks the pidfd watcher itself.) Linux 5.3 and later; older kernels keep the default.
    """
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return
    asyncio.get_event_loop_policy().set_child_watcher(asyncio.PidfdChildWatcher())


if __name__ == "__main__":
    sys.exit(main())
