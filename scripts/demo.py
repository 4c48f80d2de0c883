"""`make demo`: a controller on the embedded default (SQLite, loopback) and a local agent
provisioning the demo environment end to end, with its events streamed live.

Everything lives under ./.tether-demo (controller data, agent state); the processes this
script starts are stopped (by PID) when it ends.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
DEMO = ROOT / ".tether-demo"
ENV_FILE = ROOT / "docs" / "examples" / "demo-environment.yaml"


def ctl(*args: str, check: bool = True) -> str:
    out = subprocess.run(
        [str(BIN / "tetherctl"), *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "TETHER_CONFIG": str(DEMO / "controller" / "admin.conf")},
    )
    if check and out.returncode != 0:
        sys.exit(f"demo: tetherctl {' '.join(args)} failed: {out.stderr.strip()}")
    return out.stdout


def say(text: str) -> None:
    print(f"\n\033[1m==> {text}\033[0m" if sys.stdout.isatty() else f"\n==> {text}", flush=True)


def main() -> int:
    if DEMO.exists():
        shutil.rmtree(DEMO)
    DEMO.mkdir()
    procs: list[subprocess.Popen[str]] = []
    try:
        say("starting the controller (SQLite store, loopback, a free port)")
        controller_log = (DEMO / "controller.log").open("w")
        controller = subprocess.Popen(
            [
                str(BIN / "tether-controller"),
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                str(DEMO / "controller"),
            ],
            stdout=subprocess.PIPE,
            stderr=controller_log,
            text=True,
            cwd=ROOT,
        )
        procs.append(controller)
        assert controller.stdout is not None
        line = controller.stdout.readline()
        m = re.search(r"listening on (\S+)", line)
        if not m:
            sys.exit(f"demo: the controller did not start; see {DEMO / 'controller.log'}")
        print(line.strip())

        say(f"applying {ENV_FILE.relative_to(ROOT)}")
        print(ctl("env", "apply", "-f", str(ENV_FILE)).strip())

        say("creating a single-use join token and starting a local agent with it")
        join = ctl(
            "token", "create", "--env", "demo", "--role", "worker", "--ttl", "15m", "--print-join-command"
        ).split()
        masked = [("<join token>" if re.fullmatch(r"[a-z0-9]{6}\.[a-z0-9]{32}", w) else w) for w in join]
        print(" ".join(masked), "--state-dir .tether-demo/agent --node-name demo-node")
        agent_log = (DEMO / "agent.log").open("w")
        agent = subprocess.Popen(
            [
                str(BIN / join[0]),
                *join[1:],
                "--state-dir",
                str(DEMO / "agent"),
                "--node-name",
                "demo-node",
                "--heartbeat-seconds",
                "5",
            ],
            stdout=agent_log,
            stderr=agent_log,
            text=True,
            cwd=ROOT,
        )
        procs.append(agent)

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "demo-node" not in ctl("node", "list", check=False):
            if agent.poll() is not None:
                sys.exit(f"demo: the agent exited; see {DEMO / 'agent.log'}")
            time.sleep(0.2)
        say("events, live (tetherctl events --node demo-node --follow)")
        follower = subprocess.Popen(
            [str(BIN / "tetherctl"), "events", "--node", "demo-node", "--follow"],
            text=True,
            cwd=ROOT,
            env={**os.environ, "TETHER_CONFIG": str(DEMO / "controller" / "admin.conf")},
        )
        procs.append(follower)
        deadline = time.monotonic() + 120
        state = ""
        while time.monotonic() < deadline:
            nodes = json.loads(ctl("node", "list", "-o", "json", check=False) or "[]")
            state = nodes[0]["state"] if nodes else ""
            if state in ("provisioned", "failed"):
                break
            time.sleep(0.5)
        time.sleep(0.5)
        follower.terminate()
        follower.wait()

        say("tetherctl node list")
        print(ctl("node", "list").rstrip())
        say("tetherctl node describe demo-node")
        print(ctl("node", "describe", "demo-node").rstrip())
        print(
            f"\nlogs: {DEMO / 'controller.log'}, {DEMO / 'agent.log'}; admin config: "
            f"{DEMO / 'controller' / 'admin.conf'}"
        )
        if state != "provisioned":
            print(f"demo: the node ended up {state or 'unknown'}", file=sys.stderr)
            return 1
        say("demo complete: the node is provisioned")
        return 0
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            if p.stdout is not None:
                p.stdout.close()


if __name__ == "__main__":
    sys.exit(main())
