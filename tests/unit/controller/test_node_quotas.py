"""Issue 10, items 9, 5, 11 and 15 below the wire: per-node quotas on the stream, renewal and
stream-open rates, the store taking an agent's acked boundary, and a corrupt database."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.unit.controller.test_store import ev
from tether.controller import enrollment, tokens
from tether.controller.agent_service import AgentService
from tether.controller.auth import Kind, Principal
from tether.controller.ca import CertificateAuthority
from tether.controller.errors import InvalidArgument, ResourceExhausted, StoreError
from tether.controller.hub import Hub, Session
from tether.controller.limits import NODE_CONNECTS_PER_MINUTE, NODE_RENEWALS_PER_HOUR, TokenBucket
from tether.controller.progress import Progress
from tether.controller.store import NodeRecord, SqliteStore
from tether.controller.tokens import TokenRecord
from tether.nodeagent.identity import generate_key, make_csr
from tether.nodeagent.model import Event, EventKind
from tether.nodeagent.secrets import Redactor


class NoCluster:
    async def on_events(self, node: NodeRecord, events: Any) -> None:
        return None


class NodeAuth:
    def principal(self, context: Any) -> Principal:
        return Principal(Kind.NODE, "n1", fingerprint="fp-1")


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[tuple[AgentService, SqliteStore]]:
    store = SqliteStore(tmp_path / "t.db")
    await store.put_token(TokenRecord("tok", "h", "e", "worker", "", 10**15, 1, 0, False, 1))
    key = generate_key()
    rec = NodeRecord("n1", "e", "worker", "fp-1", enrollment.csr_key_hash(make_csr(key, "n1")), "tok", 1)
    await store.enroll_node("tok", "n1", lambda t, e: (rec, True))
    app = SimpleNamespace(
        store=store,
        hub=Hub(),
        redactor=Redactor(),
        cluster=NoCluster(),
        rollouts=SimpleNamespace(poke=lambda environment: None, generation_for=lambda node: 0),
        progress=Progress(),
        hardware=None,
        auth=NodeAuth(),
        ca=CertificateAuthority.load_or_create(tmp_path / "pki"),
        config=SimpleNamespace(node_cert_days=1.0, node_output_bytes_per_second=64 * 1024),
        key=key,
    )
    yield AgentService(app), store  # type: ignore[arg-type]
    await store.close()


def drain(session: Session) -> list[Any]:
    out = []
    while not session.outbox.empty():
        out.append(session.outbox.get_nowait())
    return out


def output(seq: int, lines: int, width: int = 100) -> Any:
    from tether.controller import wire

    return wire.event_to_pb(Event(kind=EventKind.OUTPUT, step="s", seq=seq, lines=("x" * width,) * lines))


async def test_output_over_the_node_quota_is_summarised_and_seq_stays_contiguous(
    service: tuple[AgentService, SqliteStore],
) -> None:
    svc, store = service
    svc.quotas.buckets("n1").output = TokenBucket(rate=0.0, burst=5_000)
    node = store.get_node("n1")
    assert node is not None
    session = Session("n1", "e")
    await svc._events(node, session, [output(1, 10), output(2, 45), output(3, 1)])
    stored = await store.list_events("n1")
    assert [e.seq for e in stored] == [1, 2, 3]
    assert stored[0].lines == ("x" * 100,) * 10  # within the quota: kept
    assert stored[1].lines == ("[tether: 45 lines, 4.4 KiB of output dropped: node over its output quota]",)
    assert stored[2].lines == ("x" * 100,)  # what is left of the quota still stores small output
    (ack,) = drain(session)
    assert ack.ack.seq == 3


async def test_a_node_over_its_output_quota_is_read_more_slowly(
    service: tuple[AgentService, SqliteStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Backpressure: after a batch that went over the quota the reader pauses for as long as
    reading the dropped output at NODE_EXCESS_READ_BYTES_PER_SECOND takes (HTTP/2 flow control
    then holds the flooding node back); a batch within the quota never pauses."""
    import asyncio

    from tether.controller import agent_service
    from tether.controller.limits import NODE_EXCESS_READ_BYTES_PER_SECOND, QUOTA_PAUSE_SECONDS
    from tether.controller.quotas import Charged

    svc, store = service
    pauses: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(agent_service.asyncio, "sleep", sleep)
    node = store.get_node("n1")
    assert node is not None
    svc.quotas.buckets("n1").output = TokenBucket(rate=0.0, burst=5_000)
    await svc._events(node, Session("n1", "e"), [output(1, 10)])
    assert pauses == []  # within the quota
    await svc._events(node, Session("n1", "e"), [output(2, 100), output(3, 100)])
    assert pauses == [pytest.approx(2 * (100 * 100 + len("s")) / NODE_EXCESS_READ_BYTES_PER_SECOND)]
    assert svc.quotas.pause(Charged([], over_bytes=10**12)) == QUOTA_PAUSE_SECONDS  # never longer


async def test_long_step_names_and_many_small_events_are_charged_too(
    service: tuple[AgentService, SqliteStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step name is stored, so it is charged like output (and cut when summarised); past the
    events quota the node is read more slowly even when each event is tiny; a batch sent again
    is never charged twice."""
    from tether.controller import agent_service, wire
    from tether.controller.limits import NODE_EVENTS_PER_SECOND

    svc, store = service
    pauses: list[float] = []

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)

    monkeypatch.setattr(agent_service.asyncio, "sleep", sleep)
    node = store.get_node("n1")
    assert node is not None
    svc.quotas.buckets("n1").output = TokenBucket(rate=0.0, burst=5_000)
    long_step = [wire.event_to_pb(Event(kind=EventKind.INFO, step="s" * 10_000, seq=1))]
    session = Session("n1", "e")
    await svc._events(node, session, long_step)
    assert len((await store.list_events("n1"))[0].step) <= 253 and len(pauses) == 1
    svc.quotas.buckets("n1").events = TokenBucket(rate=0.0, burst=0)
    tiny = [wire.event_to_pb(Event(kind=EventKind.INFO, step="s", seq=seq)) for seq in range(2, 102)]
    await svc._events(node, session, tiny)
    assert pauses[-1] == pytest.approx(100 / NODE_EVENTS_PER_SECOND)
    await svc._events(node, session, tiny)  # sent again: stored already, nothing charged
    assert len(pauses) == 2


async def test_a_secret_split_across_two_output_lines_is_masked_before_storing(
    service: tuple[AgentService, SqliteStore],
) -> None:
    svc, store = service
    node = store.get_node("n1")
    assert node is not None
    canary = "abcdef." + "q" * 16
    lines = ("kubeadm join 10.0.0.1:6443 --token", canary, "done " + canary[:7], canary[7:])
    from tether.controller import wire

    batch = [wire.event_to_pb(Event(kind=EventKind.OUTPUT, step="s", seq=1, lines=lines))]
    await svc._events(node, Session("n1", "e"), batch)
    dump = "\n".join((await store.list_events("n1"))[0].lines)
    assert "q" * 16 not in dump and canary not in dump


async def test_renewals_are_rate_limited_per_node(service: tuple[AgentService, SqliteStore]) -> None:
    svc, store = service
    node = store.get_node("n1")
    assert node is not None
    session = Session("n1", "e")
    csr = make_csr(svc.app.key, "n1")  # type: ignore[attr-defined]
    for _ in range(int(NODE_RENEWALS_PER_HOUR) + 5):
        await svc._renew(node, session, csr, "fp-1")
    certificates = [m for m in drain(session) if m.WhichOneof("kind") == "certificate"]
    assert len(certificates) == int(NODE_RENEWALS_PER_HOUR)


async def test_stream_opens_are_rate_limited_with_a_retry_hint(
    service: tuple[AgentService, SqliteStore],
) -> None:
    svc, _ = service
    for _ in range(int(NODE_CONNECTS_PER_MINUTE)):
        assert await svc._opening(object()) == ("n1", "fp-1")
    with pytest.raises(ResourceExhausted) as exc:
        await svc._opening(object())
    assert exc.value.retry_after_s >= 1 and "retry in" in str(exc.value)


async def test_a_superseded_certificate_is_refused(service: tuple[AgentService, SqliteStore]) -> None:
    svc, store = service
    await store.update_node("n1", cert_fingerprint="fp-2", prev_fingerprint="")
    with pytest.raises(Exception, match="superseded"):
        svc.admitted("n1", "fp-1")
    await store.update_node("n1", revoked=True)
    with pytest.raises(Exception, match="revoked"):
        svc.admitted("n1", "fp-2")


async def test_the_store_takes_the_agents_acked_boundary_and_records_the_gap(
    service: tuple[AgentService, SqliteStore],
) -> None:
    _, store = service
    await store.append_events("n1", [ev(1), ev(2)])
    assert await store.accept_acked("n1", 9) == 9
    assert await store.accept_acked("n1", 4) == 9  # never backwards
    stored = await store.list_events("n1")
    assert [e.seq for e in stored] == [1, 2, 3]
    assert stored[2].kind is EventKind.INFO and "events 3..9 were acknowledged before" in stored[2].message
    assert await store.append_events("n1", [ev(10)]) == 10


def test_a_corrupt_database_is_a_store_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "tether.db"
    path.write_bytes(os.urandom(4096))
    with pytest.raises(StoreError) as exc:
        SqliteStore(path)
    assert str(path) in str(exc.value) and "backup" in str(exc.value)


def test_values_with_a_trailing_newline_do_not_match() -> None:
    assert enrollment.NODE_NAME_RE.fullmatch("n1\n") is None
    assert tokens.TOKEN_RE.fullmatch("abcdef." + "a" * 32 + "\n") is None


def test_a_csr_with_a_key_of_unknown_type_is_invalid_argument_not_internal() -> None:
    import base64

    ec_key = bytes.fromhex("06072a8648ce3d0201")  # id-ecPublicKey
    der = base64.b64decode(b"".join(make_csr(generate_key(), "n1").split(b"\n")[1:-2]))
    assert ec_key in der
    bad = der.replace(ec_key, bytes.fromhex("06072a8648ce3d0209"))
    pem = (
        b"-----BEGIN CERTIFICATE REQUEST-----\n"
        + base64.encodebytes(bad)
        + b"-----END CERTIFICATE REQUEST-----\n"
    )
    with pytest.raises(InvalidArgument, match="invalid CSR: Unknown key type"):
        enrollment.csr_key_hash(pem)


def test_the_output_quota_follows_the_serve_flag() -> None:
    from tether.controller.limits import NODE_OUTPUT_BURST_BYTES, NODE_OUTPUT_BYTES_PER_SECOND
    from tether.controller.main import _parser
    from tether.controller.quotas import NodeQuotas

    assert _parser().parse_args(["serve"]).node_output_rate == NODE_OUTPUT_BYTES_PER_SECOND
    rate = _parser().parse_args(["serve", "--node-output-rate", "2097152"]).node_output_rate
    bucket = NodeQuotas(rate).buckets("n1").output
    assert bucket.rate == 2 * 1024 * 1024 and bucket.burst == max(NODE_OUTPUT_BURST_BYTES, 4 * rate)
    assert NodeQuotas().buckets("n1").output.rate == NODE_OUTPUT_BYTES_PER_SECOND
