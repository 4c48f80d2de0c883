"""What the controller keeps and does per connected agent (issue 16): a slim session, one task of
ours per stream, health reports written together, plans alone compressed."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from bench import messages
from tether.controller import agent_service, wire
from tether.controller.agent_service import AgentService, HealthSaver, plain
from tether.controller.hub import Hub, Outbox, Session
from tether.controller.store import NodeRecord, SqliteStore
from tether.nodeagent.model import Gpu, now_ms

NODES = 30


class Context:
    """A stream's server side: ``read`` hands out what ``feed`` put in (EOF: the agent closed
    its side), ``write`` records (or raises ``fail``), compression calls are recorded."""

    def __init__(self) -> None:
        self.incoming: asyncio.Queue[Any] = asyncio.Queue()
        self.written: list[Any] = []
        self.uncompressed: list[Any] = []  # messages written right after disable_next_message_compression
        self.compression: Any = None
        self.fail: BaseException | None = None
        self._plain_next = False

    async def read(self) -> Any:
        return await self.incoming.get()

    async def write(self, msg: Any) -> None:
        if self.fail is not None:
            raise self.fail
        self.written.append(msg)
        if self._plain_next:
            self.uncompressed.append(msg)
        self._plain_next = False

    def set_compression(self, compression: Any) -> None:
        self.compression = compression

    def disable_next_message_compression(self) -> None:
        self._plain_next = True


def keep(record: NodeRecord) -> Any:
    return lambda token, existing: (record, False)


@pytest.fixture
async def stores(tmp_path: Path) -> AsyncIterator[tuple[SqliteStore, list[int]]]:
    commits: list[int] = []  # writes per group commit
    store = SqliteStore(tmp_path / "t.db", observe_commit=lambda seconds, writes: commits.append(writes))
    for i in range(NODES):
        rec = NodeRecord(f"n{i}", "e", "worker", f"fp-{i}", "", "tok", 1)
        await store.enroll_node("tok", rec.name, keep(rec))
    yield store, commits
    await store.close()


@pytest.fixture
def service(stores: tuple[SqliteStore, list[int]]) -> AgentService:
    store, _ = stores
    config = SimpleNamespace(node_output_bytes_per_second=64 * 1024)
    app = SimpleNamespace(store=store, hub=Hub(), drift=None, config=config)
    return AgentService(app)  # type: ignore[arg-type]


def health_message() -> Any:
    return wire.agent.AgentMessage.FromString(messages.health_message().SerializeToString())


def ack(seq: int) -> Any:
    return wire.agent.ControllerMessage(ack=wire.agent.Ack(seq=seq))


# -- the session --------------------------------------------------------------------------------


def test_a_session_is_slotted_and_holds_no_asyncio_queue() -> None:
    session = Session("n1", "e")
    assert not hasattr(session, "__dict__")  # one per connected agent
    assert type(session.outbox) is Outbox and not hasattr(session.outbox, "__dict__")
    assert session.connected_at == session.last_seen and session.health is None


async def test_the_outbox_keeps_order_and_its_close_wakes_the_writer() -> None:
    outbox = Outbox()
    waiting = asyncio.ensure_future(outbox.drain())
    await asyncio.sleep(0)
    outbox.put_nowait(1)
    outbox.put_nowait(2)
    assert await waiting == [1, 2] and outbox.empty()
    outbox.put_nowait(3)
    assert outbox.qsize() == 1 and outbox.get_nowait() == 3
    with pytest.raises(asyncio.QueueEmpty):
        outbox.get_nowait()
    waiting = asyncio.ensure_future(outbox.drain())
    await asyncio.sleep(0)
    outbox.close()
    assert await waiting == [] and outbox.is_set()
    outbox.put_nowait(4)  # queued after the close: never handed to the writer
    assert await outbox.drain() == []


def test_closing_a_session_tells_its_stream_once() -> None:
    session = Session("n1", "e")
    calls: list[int] = []
    session.on_close = lambda: calls.append(1)
    session.close()
    session.close()
    assert session.closed.is_set() and calls == [1]


# -- the stream: read on the call's own task, one writer task ---------------------------------


async def stream(service: AgentService, context: Context) -> tuple[asyncio.Task[None], Session, NodeRecord]:
    node = service.app.store.get_node("n0")
    assert node is not None
    session = service.app.hub.attach(node.name, node.environment)
    task = asyncio.ensure_future(service._stream(node, session, context, "fp-0"))
    await asyncio.sleep(0.01)
    return task, session, node


async def test_closing_the_session_ends_the_stream_without_an_error(service: AgentService) -> None:
    context = Context()
    task, session, _ = await stream(service, context)
    session.send(ack(1))
    context.incoming.put_nowait(health_message())
    await asyncio.sleep(0.01)
    assert context.written == [ack(1)] and session.health is not None
    session.close()  # revoked, or replaced by a newer stream
    session.send(ack(2))  # queued after the close: never written
    await asyncio.wait_for(task, 2)
    assert task.result() is None and context.written == [ack(1)]
    assert session.on_close is None


async def test_the_stream_ends_when_the_agent_closes_its_side(service: AgentService) -> None:
    context = Context()
    task, session, _ = await stream(service, context)
    context.incoming.put_nowait(grpc.aio.EOF)
    await asyncio.wait_for(task, 2)
    assert task.result() is None
    session.send(ack(1))
    await asyncio.sleep(0.01)
    assert context.written == []  # the writer ended with the stream


async def test_a_cancellation_by_grpc_still_cancels_the_stream(service: AgentService) -> None:
    context = Context()
    task, _, _ = await stream(service, context)
    task.cancel()  # the agent went away: gRPC cancels the call's task
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_failed_write_ends_the_stream_with_its_error(service: AgentService) -> None:
    context = Context()
    context.fail = ConnectionResetError("gone")
    task, session, _ = await stream(service, context)
    session.send(ack(1))
    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(task, 2)


async def test_a_session_closed_before_the_stream_reads_ends_it_at_once(service: AgentService) -> None:
    node = service.app.store.get_node("n0")
    assert node is not None
    session = service.app.hub.attach(node.name, node.environment)
    session.close()
    await asyncio.wait_for(service._stream(node, session, Context(), "fp-0"), 2)


async def test_plans_alone_are_written_compressed() -> None:
    context = Context()
    plan = wire.agent.ControllerMessage(plan=wire.plan_to_pb(messages.bench_plan()))
    for msg in (ack(1), plan, ack(2)):
        await agent_service._send(context, msg)
    assert context.written == [ack(1), plan, ack(2)]
    assert context.uncompressed == [ack(1), ack(2)]


# -- health reports -----------------------------------------------------------------------------


async def test_reports_due_are_written_together_each_with_when_its_stream_was_heard(
    service: AgentService, stores: tuple[SqliteStore, list[int]]
) -> None:
    store, commits = stores
    sessions = [Session(f"n{i}", "e") for i in range(NODES)]
    report = messages.health_message().health.SerializeToString()
    for i, session in enumerate(sessions):
        session.report_health(report, agent_service._health_from_bytes)
        session.last_seen = time.monotonic() - i  # heard from i seconds ago
        service.health.due(session)
    commits.clear()
    before = now_ms()
    await service.health.flush()
    assert sum(commits) == NODES and len(commits) <= 3  # a few group commits, not one per report
    for i in range(NODES):
        rec = store.get_node(f"n{i}")
        assert rec is not None and rec.health == plain(messages.health())
        assert abs(rec.last_seen_ms - (before - 1000 * i)) < 1000


async def test_a_stream_reports_first_then_at_most_once_an_interval(
    service: AgentService, stores: tuple[SqliteStore, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, _ = stores
    monkeypatch.setattr(agent_service, "HEALTH_FLUSH_SECONDS", 0.05)
    node = store.get_node("n0")
    assert node is not None
    session = service.app.hub.attach(node.name, node.environment)
    beats = [health_message() for _ in range(3)]

    async def read() -> Any:
        return beats.pop(0) if beats else grpc.aio.EOF

    await service._read(node, session, read)
    assert session.health_saved == pytest.approx(time.monotonic(), abs=1)
    assert store.get_node("n0").health == {}  # type: ignore[union-attr]  # not at once: at the flush
    for _ in range(100):  # written at the flush, HEALTH_FLUSH_SECONDS later
        await asyncio.sleep(0.05)
        if store.get_node("n0").health:  # type: ignore[union-attr]
            break
    assert store.get_node("n0").health == plain(messages.health())  # type: ignore[union-attr]
    saved = session.health_saved
    beats.append(health_message())
    await service._read(node, session, read)
    assert session.health_saved == saved  # within the interval: not due again
    session.health_saved -= agent_service.HEALTH_PERSIST_SECONDS
    beats.append(health_message())
    await service._read(node, session, read)
    assert session.health_saved > saved  # due again


async def test_a_closing_stream_takes_its_report_not_yet_written(service: AgentService) -> None:
    old, new = Session("n0", "e"), Session("n0", "e")
    report = messages.health_message().health.SerializeToString()
    old.report_health(report, agent_service._health_from_bytes)
    service.health.due(old)
    assert service.health.take(old) == {"health": plain(messages.health())}
    assert service.health.take(old) == {}  # written once, with the close
    new.report_health(report, agent_service._health_from_bytes)
    service.health.due(new)
    assert service.health.take(old) == {}  # a newer stream's report is its own


def test_health_is_kept_as_bytes_and_decoded_when_read() -> None:
    session = Session("n1", "e")
    session.report_health(
        messages.health_message().health.SerializeToString(), agent_service._health_from_bytes
    )
    assert isinstance(session._report, bytes)
    assert session.health == messages.health()
    session.report_health(
        messages.health_message().health.SerializeToString(), agent_service._health_from_bytes
    )
    assert session._health is None  # the decoded one it superseded is not kept
    assert session.health == messages.health()


def test_a_health_saver_without_reports_due_has_no_task(service: AgentService) -> None:
    assert isinstance(service.health, HealthSaver) and service.health._flush is None


def test_plain_is_asdict_without_the_copies() -> None:
    facts = messages.node_facts("n1")
    gpu = Gpu(index=0, name="H200", uuid="GPU-1", pci_bus_id="0000:01:00.0", memory_total_mib=143771)
    for value in (messages.health(), facts, dataclasses.replace(facts, gpus=(gpu,), addresses=("10.0.0.1",))):
        expected = json.dumps(dataclasses.asdict(value), sort_keys=True)
        assert json.dumps(plain(value), sort_keys=True) == expected
