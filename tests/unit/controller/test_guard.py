"""Issue 10, item 1: the guard on calls open to the anonymous identity (size, concurrency, rate)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tether.controller.guard import ENROLL, Guard
from tether.controller.limits import TokenBucket
from tether.controller.refusals import RefusalLog


class _Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def warning(self, message: str, **fields: Any) -> None:
        self.lines.append((message, fields))


class _Service:
    """``tether.v1.AgentService/Enroll`` on raw bytes: holds each call until ``release`` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.entered = 0

    async def enroll(self, request: bytes, context: Any) -> bytes:
        self.entered += 1
        await self.release.wait()
        return b"ok:" + request[:8]


async def _server(service: _Service, guard: Guard) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server(interceptors=[guard])
    handler = grpc.method_handlers_generic_handler(
        "tether.v1.AgentService", {"Enroll": grpc.unary_unary_rpc_method_handler(service.enroll)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def _call(address: str, payload: bytes) -> tuple[grpc.StatusCode, str]:
    async with grpc.aio.insecure_channel(address) as channel:
        call: Any = channel.unary_unary(ENROLL)
        try:
            await call(payload, timeout=30)
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details() or ""
        return grpc.StatusCode.OK, ""


@pytest.fixture
def log() -> _Log:
    return _Log()


async def _run(guard: Guard, body: Any) -> Any:
    service = _Service()
    server, address = await _server(service, guard)
    try:
        return await body(service, address)
    finally:
        await server.stop(0)


def test_a_request_over_the_message_limit_is_refused_before_the_handler(log: _Log) -> None:
    guard = Guard(message_bytes=1024, refusals=RefusalLog(logger=log))

    async def body(service: _Service, address: str) -> None:
        service.release.set()
        assert await _call(address, b"x" * 1024) == (grpc.StatusCode.OK, "")
        code, details = await _call(address, b"x" * 1025)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "request of 1025 bytes is over the limit of 1024 bytes" in details
        assert service.entered == 1

    asyncio.run(_run(guard, body))
    assert [m for m, _ in log.lines] == ["call refused"]


def test_calls_over_the_concurrency_wait_then_are_refused(log: _Log) -> None:
    guard = Guard(concurrency=2, wait_seconds=0.2, refusals=RefusalLog(logger=log))

    async def body(service: _Service, address: str) -> list[tuple[grpc.StatusCode, str]]:
        held = [asyncio.create_task(_call(address, b"a")) for _ in range(2)]
        while service.entered < 2:
            await asyncio.sleep(0.01)
        third = await _call(address, b"b")  # both slots are held: it waits, then is refused
        service.release.set()
        return [third, *[await t for t in held]]

    third, *held = asyncio.run(_run(guard, body))
    assert third[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "at most 2" in third[1]
    assert held == [(grpc.StatusCode.OK, "")] * 2


def test_enrollments_over_the_rate_are_refused(log: _Log) -> None:
    guard = Guard(enroll=TokenBucket(rate=0.0, burst=3), refusals=RefusalLog(rate=1, logger=log))

    async def body(service: _Service, address: str) -> list[grpc.StatusCode]:
        service.release.set()
        return [(await _call(address, b"e"))[0] for _ in range(6)]

    codes = asyncio.run(_run(guard, body))
    assert codes == [grpc.StatusCode.OK] * 3 + [grpc.StatusCode.RESOURCE_EXHAUSTED] * 3
    assert len(log.lines) == 1  # three refusals, one log line (the rest counted)


def test_refused_enrollments_do_not_use_up_the_rate() -> None:
    """Junk (a wrong token) is refused by the handler and gives its share of the rate back, so an
    anonymous caller cannot keep the real nodes out by spending it."""
    guard = Guard(enroll=TokenBucket(rate=0.0, burst=3))

    class Judging(_Service):
        async def enroll(self, request: bytes, context: Any) -> bytes:
            if request == b"junk":
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, "join token is invalid")
            return b"ok"

    async def body(address: str) -> list[grpc.StatusCode]:
        junk = [(await _call(address, b"junk"))[0] for _ in range(10)]
        assert junk == [grpc.StatusCode.PERMISSION_DENIED] * 10
        return [(await _call(address, b"real"))[0] for _ in range(4)]

    async def run() -> list[grpc.StatusCode]:
        server, address = await _server(Judging(), guard)
        try:
            return await body(address)
        finally:
            await server.stop(None)

    assert asyncio.run(run()) == [grpc.StatusCode.OK] * 3 + [grpc.StatusCode.RESOURCE_EXHAUSTED]


def test_streams_of_open_methods_are_size_checked_per_message() -> None:
    guard = Guard(methods={"/t.S/Chat"}, message_bytes=16)

    async def chat(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for r in requests:
            yield r

    async def main() -> tuple[list[bytes], grpc.StatusCode]:
        server = grpc.aio.server(interceptors=[guard])
        handler = grpc.method_handlers_generic_handler(
            "t.S", {"Chat": grpc.stream_stream_rpc_method_handler(chat)}
        )
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        got: list[bytes] = []
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                chat_call: Any = channel.stream_stream("/t.S/Chat")
                call = chat_call(iter([b"small", b"x" * 17]), timeout=30)
                try:
                    async for reply in call:
                        got.append(reply)
                except grpc.aio.AioRpcError as exc:
                    return got, exc.code()
                return got, grpc.StatusCode.OK
        finally:
            await server.stop(0)

    got, code = asyncio.run(main())
    assert got == [b"small"]
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_the_enrollment_rate_follows_the_serve_flag(tmp_path: Path) -> None:
    from tether.controller.config import ControllerConfig
    from tether.controller.guard import enroll_bucket
    from tether.controller.main import _parser

    args = _parser().parse_args(["serve", "--enroll-rate", "500"])
    bucket = enroll_bucket(ControllerConfig(data_dir=tmp_path, enroll_rate_per_second=args.enroll_rate))
    assert bucket.rate == 500 and sum(bucket.take(now=bucket.stamp) for _ in range(600)) == 500
    assert _parser().parse_args(["serve"]).enroll_rate == 50.0


def test_every_method_of_health_and_reflection_is_guarded() -> None:
    """Health and reflection answer anyone: each of their methods (grpcio-health-checking added
    Health/List in 1.62) gets the anonymous size and concurrency limits, none slips past them."""
    from grpc_health.v1 import health_pb2
    from grpc_reflection.v1alpha import reflection_pb2

    from tether.controller.guard import OPEN_METHODS

    services = [
        health_pb2.DESCRIPTOR.services_by_name["Health"],
        reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"],
    ]
    methods = {f"/{s.full_name}/{m.name}" for s in services for m in s.methods}
    assert "/grpc.health.v1.Health/List" in methods
    assert methods <= OPEN_METHODS
