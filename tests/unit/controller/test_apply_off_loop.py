"""Issue 10, items 4 and 8: ApplyEnvironment checks the size first, then parses off the event loop."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from tether.controller import wire
from tether.controller.admin_service import AdminService
from tether.controller.auth import Kind, Principal
from tether.controller.documents import check_size
from tether.controller.errors import InvalidArgument
from tether.controller.spec import load_document

DOCUMENT = (
    "apiVersion: holodeck.nvidia.com/v1alpha1\nkind: Environment\nmetadata:\n  name: e\n"
    "spec:\n  customTemplates:\n    - name: noop\n      inline: 'true'\n"
)


class _Aborted(Exception):
    pass


class _Context:
    def __init__(self) -> None:
        self.status: tuple[grpc.StatusCode, str] | None = None

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.status = (code, details)
        raise _Aborted(details)

    async def abort_with_status(self, status: grpc.Status) -> None:
        await self.abort(status.code, status.details)


def _service(max_document_bytes: int = 1 << 20) -> AdminService:
    principal = Principal(Kind.ADMIN, "reader", role="admin")
    app = SimpleNamespace(
        config=SimpleNamespace(max_document_bytes=max_document_bytes),
        auth=SimpleNamespace(principal=lambda context: principal),
        store=SimpleNamespace(get_environment=lambda name: None, list_environments=lambda: []),
    )
    return AdminService(app, agents=None)  # type: ignore[arg-type]


def test_a_dry_run_parses_in_a_worker_thread_while_other_calls_are_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started, release = threading.Event(), threading.Event()
    parsed_on: list[threading.Thread] = []

    def slow_load(document: str) -> Any:
        parsed_on.append(threading.current_thread())
        started.set()
        assert release.wait(10), "the parse blocked the event loop: nothing else could run"
        return load_document(document)

    monkeypatch.setattr("tether.controller.documents.load_document", slow_load)
    service = _service()
    done: list[str] = []

    async def apply() -> Any:
        request = wire.admin.ApplyEnvironmentRequest(document=DOCUMENT, dry_run=True)
        reply = await service.ApplyEnvironment(request, _Context())
        done.append("apply")
        return reply

    async def main() -> Any:
        task = asyncio.create_task(apply())
        assert await asyncio.to_thread(started.wait, 10)
        await service.ListEnvironments(wire.admin.ListEnvironmentsRequest(), _Context())
        done.append("list")  # answered while the document is still being parsed
        release.set()
        return await task

    reply = asyncio.run(main())
    assert done == ["list", "apply"]
    assert reply.environment.name == "e"
    assert parsed_on and parsed_on[0] is not threading.main_thread()


def test_a_document_over_the_configured_limit_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def never(document: str) -> Any:
        raise AssertionError("an oversized document must not be parsed")

    monkeypatch.setattr("tether.controller.documents.load_document", never)
    service = _service(max_document_bytes=100)
    context = _Context()
    request = wire.admin.ApplyEnvironmentRequest(document=DOCUMENT, dry_run=True)

    async def apply() -> None:
        await service.ApplyEnvironment(request, context)

    with pytest.raises(_Aborted):
        asyncio.run(apply())
    assert context.status is not None
    code, details = context.status
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    size = len(DOCUMENT.encode())
    assert details == f"environment document is {size} bytes, over the limit of 100 bytes"


def test_the_size_line_names_the_size_and_the_limit() -> None:
    with pytest.raises(InvalidArgument) as exc:
        check_size("x" * (3 << 19), 1 << 20)
    assert str(exc.value) == (
        "environment document is 1.5 MiB (1572864 bytes), over the limit of 1 MiB (1048576 bytes)"
    )
    check_size("x" * (1 << 20), 1 << 20)  # at the limit: accepted


def test_stored_environments_are_parsed_off_the_loop_at_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    from tether.controller.planner import Planner
    from tether.controller.server import _parse_stored_specs
    from tether.controller.store.records import EnvironmentRecord

    good = EnvironmentRecord("e", DOCUMENT, "v1alpha1", {}, 3, 0, 0)
    bad = EnvironmentRecord("b", "kind: [", "v1alpha1", {}, 1, 0, 0)
    threads: list[threading.Thread] = []

    def load(document: str) -> Any:
        threads.append(threading.current_thread())
        return load_document(document)

    monkeypatch.setattr("tether.controller.server.load_document", load)
    planner = Planner(SimpleNamespace())
    app = SimpleNamespace(store=SimpleNamespace(list_environments=lambda: [good, bad]), planner=planner)
    asyncio.run(_parse_stored_specs(app))  # type: ignore[arg-type]
    assert threads and all(t is not threading.main_thread() for t in threads)

    def parse_again(document: str) -> None:
        raise AssertionError("parsed on the loop")

    monkeypatch.setattr("tether.controller.planner.load_document", parse_again)
    assert planner.spec(good).spec.name == "e"  # remembered: a node's plan does not parse it
