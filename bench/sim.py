"""Simulated agents: many per process, each with its own key, certificate and mTLS connection.

A simulated agent speaks the real protocol with the generated stubs' messages: Enroll (a CSR
made from its own key, over a fresh TLS connection with the anonymous identity), then one
``Connect`` stream per connection: Hello -> Welcome -> Settings -> Plan, sequenced events kept
in an in-memory outbox until acknowledged (resent after a reconnect from the controller's
``stored_seq``, like ``tether.nodeagent.outbox``), health heartbeats at the interval the controller
sets, and the real agent's reconnect backoff (``tether.nodeagent.session.Backoff``). Against the bare
baseline the same code sends the same bytes to ``/bench.Bare/*``.

Driven by JSON commands on stdin, one reply per command on stdout (see ``Sim.handle``).

    python -m bench.sim
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import grpc

from bench import messages
from tether.nodeagent import __version__, wire
from tether.nodeagent.channel import KEEPALIVE_OPTIONS
from tether.nodeagent.identity import CONTROLLER_SERVER_NAME, generate_key, make_csr
from tether.nodeagent.limits import EVENT_BATCH_BYTES
from tether.nodeagent.session import EVENT_BATCH, Backoff

try:
    from tether.nodeagent.session import STABLE_STREAM_SECONDS
except ImportError:  # an agent without it resets its backoff on every welcome
    STABLE_STREAM_SECONDS = 0.0
from tether.v1 import common_pb2

pb = wire.pb
OPTIONS: list[tuple[str, Any]] = [
    *KEEPALIVE_OPTIONS,
    ("grpc.ssl_target_name_override", CONTROLLER_SERVER_NAME),
    # One connection per simulated agent, never shared with another channel of this process.
    ("grpc.use_local_subchannel_pool", 1),
]
SER = pb.AgentMessage.SerializeToString
DESER = pb.ControllerMessage.FromString


class Config:
    target = ""
    targets: list[str] = []  # several replicas: each agent starts on one, moves to the next on failure
    ca_pem = b""
    bare = False
    provision = False
    backoff_cap = 30.0
    heartbeat_override = 0.0
    connecting: asyncio.Semaphore | None = None
    probe = False  # each heartbeat is followed by a one-event batch whose ack times the round trip


class Agent:
    def __init__(self, sim: Sim, name: str, key_pem: bytes, cert_pem: bytes) -> None:
        self.sim = sim
        self.name = name
        self.key_pem = key_pem
        self.cert_pem = cert_pem
        self.next_seq = 1
        self.acked = 0
        self.last_sent = 0
        self.pending: collections.deque[common_pb2.Event] = collections.deque()
        self.pending_lines: collections.deque[int] = collections.deque()
        self.sent_msgs: collections.deque[int] = collections.deque()
        self.wake = asyncio.Event()
        self.acked_event = asyncio.Event()
        self.hb_due = False
        self.hb_interval = 30.0
        self.hb_timer: asyncio.TimerHandle | None = None
        self.streaming = False
        self.welcomes = 0
        self.last_welcome = 0.0
        self.provisioned = False
        self.plan_received = False
        self.plan_digest = ""
        self.plan_generation = 0
        self.task: asyncio.Task[None] | None = None
        self.producer: asyncio.Task[None] | None = None
        self.storm_first = 0
        self.storm_count = 0
        self.phase = "idle"  # backoff | channel | hello | streaming (for the debug command)
        self.attempts = 0
        self.last_ack = 0.0
        self.probes: dict[int, float] = {}  # seq of a probe event -> when its heartbeat was due
        self.target_index = 0  # which of Config.targets it streams to (moves on after a failure)

    # -- outbox ---------------------------------------------------------------------------------

    def append(self, event: common_pb2.Event, lines: int) -> None:
        event.seq = self.next_seq
        self.next_seq += 1
        self.pending.append(event)
        self.pending_lines.append(lines)
        self.wake.set()

    def ack(self, seq: int) -> None:
        sim = self.sim
        now = time.monotonic()
        while self.pending and self.pending[0].seq <= seq:
            done = self.pending.popleft()
            if self.probes:
                due = self.probes.pop(done.seq, None)
                if due is not None:
                    sim.rtts.append(now - due)
            sim.lines_acked += self.pending_lines.popleft()
            sim.events_acked += 1
        self.acked = max(self.acked, seq)
        self.last_ack = time.monotonic()
        self.acked_event.set()

    # -- the stream -----------------------------------------------------------------------------

    async def run(self) -> None:
        backoff = Backoff(cap=Config.backoff_cap)
        while True:
            started = time.monotonic()
            try:
                await self.stream_once()
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                self.sim.error(exc.code().name, started)
                self.target_index += 1  # as the real agent: the next replica on a failure
            except Exception as exc:
                self.sim.error(type(exc).__name__, started)
                self.target_index += 1
            finally:
                self.streaming = False
                if self.hb_timer is not None:
                    self.hb_timer.cancel()
            if time.monotonic() - started >= STABLE_STREAM_SECONDS:
                backoff.reset()  # as the real agent: only a stream that lasted resets the backoff
            self.phase = "backoff"
            await asyncio.sleep(backoff.next_delay())

    async def stream_once(self) -> None:
        sim = self.sim
        creds = grpc.ssl_channel_credentials(
            root_certificates=Config.ca_pem, private_key=self.key_pem, certificate_chain=self.cert_pem
        )
        path = messages.BARE_CONNECT if Config.bare else messages.CONNECT
        gate = Config.connecting
        self.attempts += 1
        self.phase = "gate"
        if gate is not None:
            await gate.acquire()
        self.phase = "channel"
        released = gate is None
        try:
            async with grpc.aio.secure_channel(self.target(), creds, options=OPTIONS) as channel:
                call = channel.stream_stream(path, request_serializer=SER, response_deserializer=DESER)()
                self.phase = "hello"
                await call.write(
                    messages.hello_message(
                        self.name, self.next_seq, self.acked, self.plan_digest, self.plan_generation
                    )
                )
                first = await call.read()
                if not isinstance(first, pb.ControllerMessage) or first.WhichOneof("kind") != "welcome":
                    raise ConnectionError("no welcome")
                if not Config.bare:
                    stored = first.welcome.stored_seq
                    self.next_seq = max(self.next_seq, stored + 1)
                    self.ack(stored)
                # Resend everything not acknowledged (the controller ignores what it already has).
                self.last_sent = self.acked if not Config.bare else 0
                if Config.bare:
                    self.last_sent = self.pending[0].seq - 1 if self.pending else self.next_seq - 1
                self.sent_msgs.clear()
                self.welcomes += 1
                self.last_welcome = time.monotonic()
                self.streaming = True
                self.phase = "streaming"
                if gate is not None:
                    gate.release()
                    released = True
                writer = asyncio.create_task(self.writer(call))
                try:
                    while True:
                        try:
                            msg = await call.read()
                        except asyncio.CancelledError:
                            task = asyncio.current_task()
                            if task is not None and task.cancelling():
                                raise
                            raise ConnectionError("call cancelled by the writer") from None
                        if not isinstance(msg, pb.ControllerMessage):
                            return
                        kind = msg.WhichOneof("kind")
                        if kind == "ack":
                            if Config.bare:
                                if self.sent_msgs:
                                    self.ack(self.sent_msgs.popleft())
                            else:
                                while self.sent_msgs and self.sent_msgs[0] <= msg.ack.seq:
                                    self.sent_msgs.popleft()
                                self.ack(msg.ack.seq)
                        elif kind == "settings":
                            if msg.settings.heartbeat_seconds:
                                self.hb_interval = Config.heartbeat_override or float(
                                    msg.settings.heartbeat_seconds
                                )
                                self.schedule_heartbeat(random.uniform(0, self.hb_interval))
                        elif kind == "plan":
                            self.on_plan(msg.plan)
                        if writer.done():
                            writer.result()
                            return
                finally:
                    writer.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await writer
                    sim.closed_streams += 1
        finally:
            if not released and gate is not None:
                gate.release()

    def target(self) -> str:
        targets = Config.targets
        return targets[self.target_index % len(targets)] if targets else Config.target

    async def writer(self, call: Any) -> None:
        sim = self.sim
        try:
            while True:
                self.wake.clear()
                if self.hb_due:
                    self.hb_due = False
                    await call.write(sim.health)
                    sim.heartbeats += 1
                if self.pending and self.pending[-1].seq > self.last_sent:
                    batch = self.next_batch()
                    # Recorded before the write: the ack can arrive before the write returns.
                    self.last_sent = batch[-1].seq
                    self.sent_msgs.append(self.last_sent)
                    await call.write(pb.AgentMessage(events=pb.EventBatch(events=batch)))
                    sim.event_msgs += 1
                    continue
                await self.wake.wait()
        except Exception:
            call.cancel()
            raise

    def next_batch(self) -> list[common_pb2.Event]:
        """The unsent events, at most EVENT_BATCH of them and EVENT_BATCH_BYTES encoded (as the agent)."""
        batch: list[common_pb2.Event] = []
        size = 0
        for e in self.pending:
            if e.seq <= self.last_sent:
                continue
            cost = e.ByteSize() + 8  # its tag and length in the batch
            if batch and (len(batch) >= EVENT_BATCH or size + cost > EVENT_BATCH_BYTES):
                break
            batch.append(e)
            size += cost
        return batch

    def schedule_heartbeat(self, delay: float) -> None:
        if self.hb_timer is not None:
            self.hb_timer.cancel()
        self.hb_timer = asyncio.get_running_loop().call_later(delay, self.heartbeat)

    def heartbeat(self) -> None:
        if not self.streaming:
            return
        self.hb_due = True
        if Config.probe:
            self.probes[self.next_seq] = time.monotonic()
            self.append(
                common_pb2.Event(kind=common_pb2.EVENT_KIND_INFO, time_ms=_now_ms(), message="probe"), 0
            )
        self.wake.set()
        self.schedule_heartbeat(self.hb_interval)

    def on_plan(self, plan: common_pb2.Plan) -> None:
        self.plan_received = True
        self.plan_digest, self.plan_generation = plan.digest, plan.generation
        if not Config.provision or self.provisioned:
            return
        self.provisioned = True
        for event, lines in messages.provision_events(plan):
            self.append(event, lines)

    # -- producers ------------------------------------------------------------------------------

    async def burst(self, template: common_pb2.Event, lines: int, per_batch: int, window: int) -> None:
        """Output as fast as acknowledgements allow (at most ``window`` events unacknowledged)."""
        while True:
            while len(self.pending) + per_batch > window:
                self.acked_event.clear()
                await self.acked_event.wait()
            for _ in range(per_batch):
                e = common_pb2.Event()
                e.CopyFrom(template)
                e.time_ms = _now_ms()
                self.append(e, lines)

    async def flood(self, template: common_pb2.Event, lines: int, window: int) -> None:
        """A misbehaving agent: output as fast as the stream takes it, ``window`` events ahead of acks."""
        while True:
            while len(self.pending) >= window:
                self.acked_event.clear()
                await self.acked_event.wait()
            while len(self.pending) < window:
                e = common_pb2.Event()
                e.CopyFrom(template)
                e.time_ms = _now_ms()
                self.append(e, lines)
            await asyncio.sleep(0)

    async def periodic(self, interval: float, lines: tuple[str, ...]) -> None:
        """One output event every ``interval`` seconds, each with a unique id in its message."""
        await asyncio.sleep(random.uniform(0, interval))
        while True:
            if self.storm_count == 0:
                self.storm_first = self.next_seq
            self.append(
                common_pb2.Event(
                    kind=common_pb2.EVENT_KIND_OUTPUT,
                    time_ms=_now_ms(),
                    step="custom-storm",
                    attempt=1,
                    lines=lines,
                    message=f"storm {self.storm_count}",
                    plan_generation=1,
                ),
                len(lines),
            )
            self.storm_count += 1
            await asyncio.sleep(interval)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class Sim:
    def __init__(self) -> None:
        self.agents: list[Agent] = []
        self.health = messages.health_message()
        self.heartbeats = 0
        self.events_acked = 0
        self.lines_acked = 0
        self.event_msgs = 0
        self.closed_streams = 0
        self.rtts: list[float] = []
        self.errors: collections.Counter[str] = collections.Counter()
        self.failures: list[tuple[float, str]] = []  # (when the failed attempt began, why)
        self.prepared: list[tuple[str, bytes, bytes]] = []

    def error(self, what: str, started: float = 0.0) -> None:
        """A failure; ``started``: when the connection attempt that failed began."""
        self.errors[what] += 1
        self.failures.append((started, what))

    async def handle(self, cmd: dict[str, Any]) -> dict[str, Any]:
        name = cmd["cmd"]
        fn = getattr(self, f"cmd_{name}", None)
        if fn is None:
            return {"error": f"unknown command {name}"}
        result: dict[str, Any] = await fn(cmd)
        return result

    # -- identities -----------------------------------------------------------------------------

    async def cmd_prepare_enroll(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Keys and CSRs made before the clock starts (a node makes its own, once)."""
        self.prepared = []
        for name in cmd["names"]:
            key = generate_key()
            self.prepared.append((name, key, make_csr(key, name)))
        return {"prepared": len(self.prepared)}

    async def cmd_enroll(self, cmd: dict[str, Any]) -> dict[str, Any]:
        from tether.nodeagent import anonymous

        ca_pem = Path(cmd["ca"]).read_bytes()
        bare = bool(cmd.get("bare"))
        path = messages.BARE_ENROLL if bare else messages.ENROLL
        token = cmd.get("token", "")
        queue = collections.deque(self.prepared)
        out: list[dict[str, str]] = []
        errors: collections.Counter[str] = collections.Counter()
        first_error = ""
        anon_key, anon_cert = anonymous.key_pem(), anonymous.CERT_PEM
        retry_exhausted = bool(cmd.get("retry_exhausted"))

        async def worker() -> None:
            nonlocal first_error
            while queue:
                name, key, csr = queue.popleft()
                request = pb.EnrollRequest(
                    token=token,
                    csr_pem=csr,
                    node_name=name,
                    facts=wire.facts_to_pb(messages.node_facts(name)),
                    agent_version=__version__,
                )
                # A fresh channel (so a fresh TLS connection) per enrollment, as a new node does.
                creds = grpc.ssl_channel_credentials(
                    root_certificates=ca_pem, private_key=anon_key, certificate_chain=anon_cert
                )
                try:
                    async with grpc.aio.secure_channel(cmd["target"], creds, options=OPTIONS) as ch:
                        rpc = ch.unary_unary(
                            path,
                            request_serializer=pb.EnrollRequest.SerializeToString,
                            response_deserializer=pb.EnrollResponse.FromString,
                        )
                        reply = await rpc(request, timeout=60)
                except grpc.aio.AioRpcError as exc:
                    if retry_exhausted and exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                        queue.append((name, key, csr))  # over the enrollment rate: try again shortly
                        await asyncio.sleep(0.2)
                        continue
                    errors[exc.code().name] += 1
                    first_error = first_error or f"{exc.code().name}: {exc.details()}"
                    continue
                out.append({"name": name, "key": key.decode(), "cert": reply.certificate_pem.decode()})

        t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(int(cmd.get("concurrency", 16)))))
        t1 = time.monotonic()
        if cmd.get("out") and not bare:
            with Path(cmd["out"]).open("w") as f:
                for doc in out:
                    f.write(json.dumps(doc) + "\n")
        return {"ok": len(out), "t0": t0, "t1": t1, "errors": dict(errors), "first_error": first_error}

    async def cmd_load(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Agents from enrolled identities (JSON lines: name, key, cert)."""
        count = int(cmd.get("count", 1 << 30))
        skip = int(cmd.get("offset", 0))
        for path in cmd["files"]:
            with Path(path).open() as f:
                for line in f:
                    if len(self.agents) >= count:
                        break
                    if skip:
                        skip -= 1
                        continue
                    doc = json.loads(line)
                    self.agents.append(Agent(self, doc["name"], doc["key"].encode(), doc["cert"].encode()))
        return {"agents": len(self.agents)}

    async def cmd_issue(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Agents with certificates from the bare baseline's CA (same key type and extensions)."""
        from tether.controller.ca import CertificateAuthority

        ca = CertificateAuthority.load_or_create(Path(cmd["pki"]))
        for name in cmd["names"]:
            key = generate_key()
            issued = ca.sign_node_csr(make_csr(key, name), name, 30)
            self.agents.append(Agent(self, name, key, issued.cert_pem))
        return {"agents": len(self.agents)}

    # -- streams --------------------------------------------------------------------------------

    async def cmd_connect(self, cmd: dict[str, Any]) -> dict[str, Any]:
        Config.target = cmd["target"]
        Config.targets = [t for t in cmd["target"].split(",") if t]
        for i, a in enumerate(self.agents):
            a.target_index = i + int(cmd.get("offset", 0))  # spread over the replicas
        Config.ca_pem = Path(cmd["ca"]).read_bytes()
        Config.bare = bool(cmd.get("bare"))
        Config.provision = bool(cmd.get("provision"))
        Config.backoff_cap = float(cmd.get("backoff_cap", 30.0))
        Config.heartbeat_override = float(cmd.get("heartbeat", 0.0))
        limit = int(cmd.get("max_connecting", 0))
        Config.connecting = asyncio.Semaphore(limit) if limit else None
        for a in self.agents:
            if a.task is None:
                a.task = asyncio.create_task(a.run())
        return {"started": len(self.agents)}

    async def cmd_debug(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Where the agents are (phases, attempts, the oldest unacknowledged stream)."""
        now = time.monotonic()
        phases = collections.Counter(a.phase for a in self.agents)
        stuck = sorted(
            (now - (a.last_ack or now), a.name, len(a.pending))
            for a in self.agents
            if a.streaming and a.pending
        )[-5:]
        return {
            "phases": dict(phases),
            "attempts": dict(collections.Counter(min(a.attempts, 20) for a in self.agents)),
            "longest_without_ack": stuck,
        }

    async def cmd_gate(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Change how many connection attempts may be in flight (0: unlimited, as real agents)."""
        limit = int(cmd.get("max_connecting", 0))
        Config.connecting = asyncio.Semaphore(limit) if limit else None
        return {"max_connecting": limit}

    async def cmd_stats(self, cmd: dict[str, Any]) -> dict[str, Any]:
        since = float(cmd.get("since", 0.0))
        failed_after = cmd.get("failed_after")
        agents = self.agents
        welcomed_since = [a.last_welcome for a in agents if a.streaming and a.last_welcome > since]
        return {
            "agents": len(agents),
            "streaming": sum(1 for a in agents if a.streaming),
            "welcomed_since": len(welcomed_since),
            "last_welcome": max(welcomed_since, default=0.0),
            "plan_received": sum(1 for a in agents if a.plan_received),
            "provisioned": sum(1 for a in agents if a.provisioned and not a.pending),
            "pending": sum(len(a.pending) for a in agents),
            "heartbeats": self.heartbeats,
            "events_acked": self.events_acked,
            "lines_acked": self.lines_acked,
            "event_msgs": self.event_msgs,
            "closed_streams": self.closed_streams,
            "by_target": dict(collections.Counter(a.target() for a in agents if a.streaming)),
            "errors": dict(self.errors),
            # Failed attempts that began at or after ``failed_after`` (not the ones that began
            # before and were counted late), by why.
            "failed_after": {}
            if failed_after is None
            else dict(collections.Counter(w for t, w in self.failures if t >= float(failed_after))),
            "now": time.monotonic(),
        }

    async def cmd_burst(self, cmd: dict[str, Any]) -> dict[str, Any]:
        count = int(cmd.get("agents", len(self.agents)))
        self._stop_producers()
        if cmd.get("on", True):
            lines = messages.output_lines(int(cmd["lines_per_event"]))
            template = common_pb2.Event(
                kind=common_pb2.EVENT_KIND_OUTPUT,
                step="custom-burst",
                digest="0" * 64,
                attempt=1,
                lines=lines,
                plan_generation=1,
            )
            per_batch = int(cmd["events_per_batch"])
            window = int(cmd["window_events"])
            for a in self.agents[:count]:
                a.producer = asyncio.create_task(a.burst(template, len(lines), per_batch, window))
        return {"producers": sum(1 for a in self.agents if a.producer is not None)}

    async def cmd_flood(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Every agent of this process floods output (``lines_per_event`` lines, ``window`` events ahead)."""
        self._stop_producers()
        if cmd.get("on", True):
            lines = messages.output_lines(int(cmd["lines_per_event"]))
            template = common_pb2.Event(
                kind=common_pb2.EVENT_KIND_OUTPUT,
                step="custom-flood",
                digest="0" * 64,
                attempt=1,
                lines=lines,
                plan_generation=1,
            )
            for a in self.agents:
                a.producer = asyncio.create_task(a.flood(template, len(lines), int(cmd["window"])))
        return {"producers": sum(1 for a in self.agents if a.producer is not None)}

    async def cmd_probe(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Probes on or off; ``collect``: the round trips measured since the last collect (seconds)."""
        if "on" in cmd:
            Config.probe = bool(cmd["on"])
            if not Config.probe:
                for a in self.agents:
                    a.probes.clear()
        rtts, self.rtts = (self.rtts, []) if cmd.get("collect") else ([], self.rtts)
        return {"rtts": rtts, "probing": Config.probe}

    async def cmd_periodic(self, cmd: dict[str, Any]) -> dict[str, Any]:
        self._stop_producers()
        if cmd.get("on", True):
            lines = messages.output_lines(int(cmd.get("lines", 3)))
            for a in self.agents:
                a.producer = asyncio.create_task(a.periodic(float(cmd["interval"]), lines))
        return {"producers": sum(1 for a in self.agents if a.producer is not None)}

    def _stop_producers(self) -> None:
        for a in self.agents:
            if a.producer is not None:
                a.producer.cancel()
                a.producer = None

    async def cmd_report(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Per agent: the seq of its first periodic event, how many it made, its next seq."""
        return {"agents": {a.name: [a.storm_first, a.storm_count, a.next_seq] for a in self.agents}}

    async def cmd_disconnect(self, cmd: dict[str, Any]) -> dict[str, Any]:
        self._stop_producers()
        tasks = [a.task for a in self.agents if a.task is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for a in self.agents:
            a.task = None
            a.streaming = False
        return {"disconnected": len(tasks)}

    async def cmd_keep(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Disconnect and forget every agent after the first ``count``."""
        count = int(cmd["count"])
        gone, self.agents = self.agents[count:], self.agents[:count]
        for a in gone:
            if a.producer is not None:
                a.producer.cancel()
            if a.task is not None:
                a.task.cancel()
        for a in gone:
            if a.task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await a.task
        return {"agents": len(self.agents)}

    async def cmd_quit(self, cmd: dict[str, Any]) -> dict[str, Any]:
        await self.cmd_disconnect(cmd)
        return {"bye": True}


async def main() -> None:
    sim = Sim()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 26)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        raw = await reader.readline()
        if not raw:
            break
        cmd = json.loads(raw)
        try:
            reply = await sim.handle(cmd)
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
        if cmd.get("cmd") == "quit":
            break


if __name__ == "__main__":
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    asyncio.run(main())
