"""`make demo`: a controller on the embedded default (SQLite, loopback) and a local agent
provisioning the demo environment end to end, with its events streamed live.

Everything lives under one directory (./.tether-demo, or --dir DIR): controller data, agent
state, logs. The processes this script starts are stopped (by PID) however it ends, and its last
line says where that directory is; Ctrl-C says it was interrupted (exit 130).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
ENV_FILE = ROOT / "docs" / "examples" / "demo-environment.yaml"
TOKEN_RE = re.compile(r"[a-z0-9]{6}\.[a-z0-9]{32}")


class DemoError(Exception):
    """Why the demo stopped: one line for the operator."""


def say(text: str) -> None:
    print(f"\n\033[1m==> {text}\033[0m" if sys.stdout.isatty() else f"\n==> {text}", flush=True)


class Demo:
    """The demo's processes and files under ``self.dir``."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory.absolute()
        self.admin_conf = self.dir / "controller" / "admin.conf"
        self.procs: list[subprocess.Popen[str]] = []

    def ctl(self, *args: str, check: bool = True) -> str:
        out = subprocess.run(
            [str(BIN / "tetherctl"), *args],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "TETHER_CONFIG": str(self.admin_conf)},
        )
        if check and out.returncode != 0:
            raise DemoError(f"tetherctl {' '.join(args)} failed: {out.stderr.strip()}")
        return out.stdout

    def start(self, argv: list[str], log: str, *, stdout_pipe: bool = False) -> subprocess.Popen[str]:
        with (self.dir / log).open("w") as sink:
            proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE if stdout_pipe else sink,
                stderr=sink,
                text=True,
                cwd=ROOT,
            )
        self.procs.append(proc)
        return proc

    def run(self) -> int:
        if self.dir.exists():
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True)
        self.start_controller()
        say(f"applying {ENV_FILE.relative_to(ROOT)}")
        print(self.ctl("env", "apply", "-f", str(ENV_FILE)).strip())
        self.start_agent()
        state = self.follow_until_done()
        say("tetherctl node list")
        print(self.ctl("node", "list").rstrip())
        say("tetherctl node describe demo-node")
        print(self.ctl("node", "describe", "demo-node").rstrip())
        if state != "provisioned":
            raise DemoError(f"the node ended up {state or 'unknown'}")
        say("demo complete: the node is provisioned")
        return 0

    def start_controller(self) -> None:
        say("starting the controller (SQLite store, loopback, a free port)")
        serve = [str(BIN / "tether-controller"), "serve", "--listen", "127.0.0.1:0"]
        controller = self.start(
            [*serve, "--data-dir", str(self.dir / "controller")], "controller.log", stdout_pipe=True
        )
        assert controller.stdout is not None
        line = controller.stdout.readline()
        if not re.search(r"listening on (\S+)", line):
            raise DemoError(f"the controller did not start; see {self.dir / 'controller.log'}")
        print(line.strip(), flush=True)

    def start_agent(self) -> None:
        say("creating a single-use join token and starting a local agent with it")
        join = shlex.split(
            self.ctl(
                "token", "create", "--env", "demo", "--role", "worker", "--ttl", "15m", "--print-join-command"
            )
        )
        masked = [TOKEN_RE.sub("<join token>", w) for w in join]
        print(" ".join(masked), f"--state-dir {self.dir / 'agent'} --node-name demo-node", flush=True)
        token = next(w for w in join if w.startswith("TETHER_JOIN_TOKEN=")).split("=", 1)[1]
        argv = [str(BIN / join[1]), *join[2:], "--state-dir", str(self.dir / "agent")]
        argv += ["--node-name", "demo-node", "--heartbeat-seconds", "5"]
        with (self.dir / "agent.log").open("w") as sink:
            agent = subprocess.Popen(
                argv,
                stdout=sink,
                stderr=sink,
                text=True,
                cwd=ROOT,
                env={**os.environ, "TETHER_JOIN_TOKEN": token},  # never on its command line
            )
        self.procs.append(agent)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "demo-node" not in self.ctl("node", "list", check=False):
            if agent.poll() is not None:
                raise DemoError(f"the agent exited; see {self.dir / 'agent.log'}")
            time.sleep(0.2)

    def follow_until_done(self) -> str:
        """Stream the node's events until it is provisioned or failed (at most 2 min); its state."""
        say("events, live (tetherctl events --node demo-node --follow)")
        follower = subprocess.Popen(
            [str(BIN / "tetherctl"), "events", "--node", "demo-node", "--follow"],
            text=True,
            cwd=ROOT,
            env={**os.environ, "TETHER_CONFIG": str(self.admin_conf)},
        )
        self.procs.append(follower)
        deadline = time.monotonic() + 120
        state = ""
        while time.monotonic() < deadline:
            nodes = json.loads(self.ctl("node", "list", "-o", "json", check=False) or "[]")
            state = nodes[0]["state"] if nodes else ""
            if state in ("provisioned", "failed"):
                break
            time.sleep(0.5)
        time.sleep(0.5)
        follower.terminate()
        follower.wait()
        return state

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            if p.stdout is not None:
                p.stdout.close()

    def where(self) -> str:
        return (
            f"demo files: {self.dir} (controller.log, agent.log, admin config controller/admin.conf, "
            "the steps' working directory agent/workspace)"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="demo.py", description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--dir", type=Path, default=ROOT / ".tether-demo", help="where the demo keeps its files")
    demo = Demo(p.parse_args(argv).dir)
    try:
        return demo.run()
    except DemoError as exc:
        print(f"demo: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print("\ndemo: interrupted", file=sys.stderr, flush=True)
        return 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C does not cut the clean-up short
        demo.stop()
        print(demo.where(), flush=True)


if __name__ == "__main__":
    sys.exit(main())
