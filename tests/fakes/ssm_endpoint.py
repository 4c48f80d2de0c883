"""An SSM Run Command endpoint for tests that really runs the commands (moto only records them).

It speaks the AWS JSON 1.1 protocol boto3 uses (``POST /`` with ``X-Amz-Target:
AmazonSSM.SendCommand`` / ``GetCommandInvocation`` / ``ListCommandInvocations``), accepts the
``AWS-RunShellScript`` document only, and hands each invocation's script to an ``Executor``:
local ``/bin/sh`` (``local_shell``) or a command inside a testbed node (``nsenter`` / ssh; see
the e2e tests). It behaves like the service where the bootstrap cares:

- statuses go Pending -> InProgress -> Success / Failed / TimedOut, ``ResponseCode`` -1 until done;
- output is truncated to 24,000 characters (``StandardOutputContent``), 2,500 in list details;
- ``executionTimeout`` kills a command that runs too long (TimedOut);
- an invocation may be invisible for its first ``invisible_polls`` GetCommandInvocation calls
  (``InvocationDoesNotExist``), as the real service is eventually consistent;
- unknown instances are refused with ``InvalidInstanceId``.

Every ``SendCommand`` is kept in ``sent`` (as the real service keeps command history), so tests can
check that no secret ever travelled in a command.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

OUTPUT_LIMIT = 24_000
DETAIL_LIMIT = 2_500
DOCUMENT = "AWS-RunShellScript"

# (instance_id, script, timeout_seconds) -> (exit code, stdout, stderr); raises TimeoutError on timeout
Executor = Callable[[str, str, float], tuple[int, str, str]]


def argv_executor(argv_for: Callable[[str], list[str]]) -> Executor:
    """An executor that runs ``argv_for(instance) + [script]`` (e.g. ``nsenter ... /bin/sh -c``)."""

    def run(instance: str, script: str, timeout: float) -> tuple[int, str, str]:
        try:
            out = subprocess.run(
                [*argv_for(instance), script], capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            raise TimeoutError from None
        return out.returncode, out.stdout, out.stderr

    return run


def local_shell() -> Executor:
    """Run every instance's commands with the local /bin/sh (integration tests)."""
    return argv_executor(lambda _instance: ["/bin/sh", "-c"])


@dataclass
class Invocation:
    command_id: str
    instance_id: str
    script: str
    timeout: float
    status: str = "Pending"
    code: int = -1
    stdout: str = ""
    stderr: str = ""
    polls: int = 0
    requested: float = field(default_factory=time.time)
    finished: float = 0.0

    def to_json(self, limit: int = OUTPUT_LIMIT) -> dict[str, Any]:
        return {
            "CommandId": self.command_id,
            "InstanceId": self.instance_id,
            "DocumentName": DOCUMENT,
            "PluginName": "aws:runShellScript",
            "Status": self.status,
            "StatusDetails": self.status,
            "ResponseCode": self.code,
            "ExecutionStartDateTime": _iso(self.requested),
            "ExecutionEndDateTime": _iso(self.finished) if self.finished else "",
            "StandardOutputContent": self.stdout[:limit],
            "StandardErrorContent": self.stderr[:limit],
        }


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(ts))


class ApiError(Exception):
    def __init__(self, kind: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.kind, self.status = kind, status


class SsmEndpoint:
    """Start with ``start()`` (returns the endpoint URL), stop with ``stop()``."""

    def __init__(
        self,
        executor: Executor,
        instances: Iterable[str],
        *,
        host: str = "127.0.0.1",
        invisible_polls: int = 0,
    ) -> None:
        self.executor = executor
        self.instances = set(instances)
        self.host = host
        self.invisible_polls = invisible_polls
        self.sent: list[dict[str, Any]] = []  # every SendCommand request body, as received
        self.invocations: dict[tuple[str, str], Invocation] = {}
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://{self.host}:{self._server.server_address[1]}"

    def start(self) -> str:
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                target = self.headers.get("X-Amz-Target", "")
                body = self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))
                try:
                    if not target.startswith("AmazonSSM."):
                        raise ApiError("UnknownOperationException", f"unknown target {target!r}")
                    action = target.split(".", 1)[1]
                    reply = endpoint.handle(action, json.loads(body or b"{}"))
                    status, data = 200, reply
                except ApiError as exc:
                    status, data = exc.status, {"__type": exc.kind, "message": str(exc)}
                raw = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.1")
                self.send_header("x-amzn-RequestId", str(uuid.uuid4()))
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer((self.host, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="ssm-endpoint", daemon=True)
        self._thread.start()
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # -- the API ------------------------------------------------------------------------------

    def handle(self, action: str, req: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.calls[action] = self.calls.get(action, 0) + 1
        if action == "SendCommand":
            return self._send(req)
        if action == "GetCommandInvocation":
            return self._get(req)
        if action == "ListCommandInvocations":
            return self._list(req)
        raise ApiError("UnknownOperationException", f"{action} is not implemented by this test endpoint")

    def _send(self, req: dict[str, Any]) -> dict[str, Any]:
        if req.get("DocumentName") != DOCUMENT:
            raise ApiError("InvalidDocument", f"document {req.get('DocumentName')!r} does not exist")
        instances = req.get("InstanceIds") or []
        unknown = [i for i in instances if i not in self.instances]
        if not instances or unknown:
            raise ApiError("InvalidInstanceId", f"instances not managed: {unknown or 'none given'}")
        params = req.get("Parameters") or {}
        commands = params.get("commands") or []
        if not commands or not all(isinstance(c, str) for c in commands):
            raise ApiError("InvalidParameters", "commands must be a non-empty list of strings")
        timeout = float((params.get("executionTimeout") or ["3600"])[0])
        command_id = str(uuid.uuid4())
        script = "\n".join(commands)
        with self._lock:
            self.sent.append(req)
            for instance in instances:
                inv = Invocation(command_id, instance, script, timeout)
                self.invocations[(command_id, instance)] = inv
                threading.Thread(target=self._execute, args=(inv,), daemon=True).start()
        return {
            "Command": {
                "CommandId": command_id,
                "DocumentName": DOCUMENT,
                "InstanceIds": instances,
                "Parameters": params,
                "Status": "Pending",
                "RequestedDateTime": time.time(),
                "TargetCount": len(instances),
            }
        }

    def _execute(self, inv: Invocation) -> None:
        with self._lock:
            inv.status = "InProgress"
        try:
            code, out, err = self.executor(inv.instance_id, inv.script, inv.timeout)
            status = "Success" if code == 0 else "Failed"
        except TimeoutError:
            code, out, err, status = -1, "", "", "TimedOut"
        except Exception as exc:  # an executor failure is a failed command, as on a broken instance
            code, out, err, status = 1, "", f"{type(exc).__name__}: {exc}", "Failed"
        with self._lock:
            inv.code, inv.stdout, inv.stderr, inv.status, inv.finished = code, out, err, status, time.time()

    def _find(self, req: dict[str, Any]) -> Invocation:
        inv = self.invocations.get((str(req.get("CommandId")), str(req.get("InstanceId"))))
        if inv is None:
            raise ApiError("InvocationDoesNotExist", "invocation does not exist")
        return inv

    def _get(self, req: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            inv = self._find(req)
            inv.polls += 1
            if inv.polls <= self.invisible_polls:
                raise ApiError("InvocationDoesNotExist", "invocation does not exist (yet)")
            return inv.to_json()

    def _list(self, req: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            found = [
                inv
                for (cid, iid), inv in self.invocations.items()
                if cid == req.get("CommandId", cid) and iid == req.get("InstanceId", iid)
            ]
            out = []
            for inv in found:
                item = {k: v for k, v in inv.to_json().items() if not k.startswith("Standard")}
                if req.get("Details"):
                    item["CommandPlugins"] = [
                        {
                            "Name": "aws:runShellScript",
                            "Status": inv.status,
                            "ResponseCode": inv.code,
                            "Output": (inv.stdout + inv.stderr)[:DETAIL_LIMIT],
                        }
                    ]
                out.append(item)
        return {"CommandInvocations": out}
