"""The two servers under test (the real controller, the bare baseline) and the simulated-agent pool."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import yaml

from bench.common import BIN, CLIENT_CPUS, SERVER_CPUS, Proc, log
from tether.nodeagent.identity import CONTROLLER_SERVER_NAME
from tether.v1 import admin_pb2, admin_pb2_grpc

MAX_AGENTS_PER_SIM = 2500  # sockets per client process, far below the 20,000 open-files limit


class Server:
    """A server process pinned to SERVER_CPUS that prints ``listening on HOST:PORT``."""

    def __init__(self, work: Path, name: str) -> None:
        self.work = work
        self.name = name
        self.proc: Proc | None = None
        self.port = 0
        self.address = ""
        self.started_at = 0.0
        self.ready_at = 0.0

    def command(self, port: int) -> list[str]:
        raise NotImplementedError

    @property
    def ca_file(self) -> Path:
        """The CA certificate clients verify this server with."""
        raise NotImplementedError

    def start(self, port: int | None = None) -> None:
        listen_port = self.port if port is None else port
        self.started_at = time.monotonic()
        self.proc = Proc(self.command(listen_port), cpus=SERVER_CPUS, log_path=self.work / f"{self.name}.log")
        m = self.proc.wait_for_line(r"listening on (\S+):(\d+)", timeout=60)
        self.ready_at = time.monotonic()
        self.port = int(m.group(2))
        self.address = f"127.0.0.1:{self.port}"

    @property
    def p(self) -> Proc:
        assert self.proc is not None
        return self.proc

    def kill9(self) -> float:
        t = time.monotonic()
        self.p.kill()
        return t

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None


class Bare(Server):
    def __init__(self, work: Path, heartbeat: int) -> None:
        super().__init__(work, "bare")
        self.pki = work / "bare-pki"
        self.heartbeat = heartbeat

    def command(self, port: int) -> list[str]:
        return [
            str(BIN / "python"),
            "-m",
            "bench.bare",
            "--listen",
            f"127.0.0.1:{port}",
            "--pki",
            str(self.pki),
            "--heartbeat-seconds",
            str(self.heartbeat),
        ]

    @property
    def ca_file(self) -> Path:
        return self.pki / "ca.crt"


class Controller(Server):
    def __init__(self, work: Path, heartbeat: int, *extra: str) -> None:
        super().__init__(work, "controller")
        self.extra = extra  # more ``serve`` flags
        self.data_dir = work / "controller"
        self.heartbeat = heartbeat
        self._admin: admin_pb2_grpc.AdminServiceStub | None = None
        self._channel: grpc.Channel | None = None

    def command(self, port: int) -> list[str]:
        return [
            str(BIN / "tether-controller"),
            "serve",
            "--listen",
            f"127.0.0.1:{port}",
            "--data-dir",
            str(self.data_dir),
            "--heartbeat-seconds",
            str(self.heartbeat),
            # The enrollment and events figures measure capacity, not the default limits
            # (50 enrollments/s; 64 KiB/s of output per node, the rest summarised, not stored).
            "--enroll-rate",
            "100000",
            *self.extra,
        ]

    def start(self, port: int | None = None) -> None:
        super().start(port)
        self._close_admin()

    def stop(self) -> None:
        self._close_admin()
        super().stop()

    @property
    def ca_file(self) -> Path:
        return self.data_dir / "pki" / "ca.crt"

    def admin(self) -> admin_pb2_grpc.AdminServiceStub:
        if self._admin is None:
            doc = yaml.safe_load((self.data_dir / "admin.conf").read_text())
            creds = grpc.ssl_channel_credentials(
                root_certificates=doc["ca"].encode(),
                private_key=doc["key"].encode(),
                certificate_chain=doc["certificate"].encode(),
            )
            self._channel = grpc.secure_channel(
                self.address, creds, options=[("grpc.ssl_target_name_override", CONTROLLER_SERVER_NAME)]
            )
            self._admin = admin_pb2_grpc.AdminServiceStub(self._channel)
        return self._admin

    def _close_admin(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._admin = None

    def apply(self, document: str) -> None:
        self.admin().ApplyEnvironment(admin_pb2.ApplyEnvironmentRequest(document=document), timeout=60)

    def token(self, env: str, uses: int) -> str:
        reply = self.admin().CreateToken(
            admin_pb2.CreateTokenRequest(environment=env, role="worker", uses=uses, ttl_seconds=6 * 3600),
            timeout=60,
        )
        return str(reply.token)

    def ca_hash(self) -> str:
        return str(yaml.safe_load((self.data_dir / "admin.conf").read_text())["caHash"])

    @contextlib.contextmanager
    def db(self) -> Iterator[sqlite3.Connection]:
        """The store, read-only (WAL: reads never block the running controller)."""
        conn = sqlite3.connect(f"file:{self.data_dir / 'tether.db'}?mode=ro", uri=True, timeout=30)
        try:
            yield conn
        finally:
            conn.close()


class Sims:
    """A pool of simulated-agent processes pinned to CLIENT_CPUS; commands go to all at once."""

    def __init__(self, work: Path, label: str, count: int) -> None:
        self.procs = [
            Proc(
                [str(BIN / "python"), "-m", "bench.sim"],
                cpus=CLIENT_CPUS,
                log_path=work / f"sim-{label}-{i}.log",
                stdin=True,
            )
            for i in range(count)
        ]

    @staticmethod
    def needed(agents: int) -> int:
        return max(1, -(-agents // MAX_AGENTS_PER_SIM))

    def __len__(self) -> int:
        return len(self.procs)

    def call(
        self, cmd: dict[str, Any] | Callable[[int], dict[str, Any]], timeout: float = 600
    ) -> list[dict[str, Any]]:
        for i, p in enumerate(self.procs):
            p.send(cmd(i) if callable(cmd) else cmd)
        replies = []
        for p in self.procs:
            reply = json.loads(p.readline(timeout))
            if "error" in reply:
                raise RuntimeError(f"simulated agents: {reply['error']} (log: {p.log_path})")
            replies.append(reply)
        return replies

    def stats(self, since: float = 0.0, failed_after: float | None = None) -> dict[str, Any]:
        """Every process's counts, summed; ``failed_after``: also the failed connection attempts
        that began at or after that time (``failed_after``, by why)."""
        cmd: dict[str, Any] = {"cmd": "stats", "since": since}
        if failed_after is not None:
            cmd["failed_after"] = failed_after
        replies = self.call(cmd, timeout=120)
        total: dict[str, Any] = {"errors": {}, "by_target": {}, "failed_after": {}}
        for r in replies:
            for k, v in r.items():
                if k in ("errors", "by_target", "failed_after"):  # counts by name: summed per name
                    for ek, ev in v.items():
                        total[k][ek] = total[k].get(ek, 0) + ev
                elif k in ("last_welcome", "now"):
                    total[k] = max(total.get(k, 0.0), v)
                else:
                    total[k] = total.get(k, 0) + v
        return total

    def wait(
        self, what: str, ok: Callable[[dict[str, Any]], bool], timeout: float, since: float = 0.0
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        last_log = 0.0
        while True:
            s = self.stats(since)
            if ok(s):
                return s
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"timed out waiting for {what}: {s}")
            if now - last_log > 10:
                log(f"  waiting for {what}: {_brief(s)}")
                last_log = now
            time.sleep(0.25)

    def close(self) -> None:
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.send({"cmd": "quit"})
        deadline = time.monotonic() + 30
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            p.kill()


def _brief(s: dict[str, Any]) -> str:
    keys = ("agents", "streaming", "welcomed_since", "provisioned", "pending", "errors")
    return ", ".join(f"{k}={s.get(k)}" for k in keys)
