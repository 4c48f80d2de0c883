"""crictl stand-in (cri-tools): version/info answer when the CRI socket accepts connections."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from k8s_standin import common


def endpoint(argv: list[str]) -> str:
    for i, arg in enumerate(argv):
        if arg in ("-r", "--runtime-endpoint") and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--runtime-endpoint="):
            return arg.split("=", 1)[1]
    if os.environ.get("CONTAINER_RUNTIME_ENDPOINT"):
        return os.environ["CONTAINER_RUNTIME_ENDPOINT"]
    cfg = Path("/etc/crictl.yaml")
    if cfg.exists():
        for line in cfg.read_text().splitlines():
            if line.startswith("runtime-endpoint:"):
                return line.split(":", 1)[1].strip()
    return common.DEFAULT_CRI_SOCKET


def main(argv: list[str]) -> int:
    words = [a for a in argv if not a.startswith("-")]
    if "--version" in argv:
        print("crictl version v1.31.1")
        return 0
    ep = endpoint(argv)
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(2)
            sock.connect(ep.removeprefix("unix://"))
    except OSError as exc:
        print(
            "validate service connection: validate CRI v1 "
            f'runtime API for endpoint "{ep}": rpc error: code = '
            f"Unavailable desc = connection error: {exc.strerror}",
            file=sys.stderr,
        )
        return 1
    cmd = words[0] if words else "version"
    if cmd == "version":
        print("Version:  0.1.0\nRuntimeName:  containerd\nRuntimeVersion:  stand-in\nRuntimeApiVersion:  v1")
    elif cmd == "info":
        print('{"status": {"conditions": [{"type": "RuntimeReady", "status": true}]}}')
    elif cmd in ("ps", "pods", "images"):
        print(
            {
                "ps": "CONTAINER  IMAGE  CREATED  STATE  NAME  ATTEMPT  POD ID  POD",
                "pods": "POD ID  CREATED  STATE  NAME",
                "images": "IMAGE  TAG  IMAGE ID  SIZE",
            }[cmd]
        )
    return 0
