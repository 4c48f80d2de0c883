"""Issue 17: the status an error ends a call with (google.rpc.Status details), and the conditional
write of an environment (expected_generation) in the store."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import grpc
import pytest
from google.rpc.error_details_pb2 import BadRequest
from google.rpc.status_pb2 import Status

from tether.controller.client.errors import (
    AbortedError,
    ApiError,
    FieldViolation,
    InvalidArgumentError,
    NotFoundError,
    from_rpc_error,
)
from tether.controller.errors import Aborted, InvalidArgument, NotFound, Problem, check_generation
from tether.controller.limits import ERROR_STATUS_BYTES
from tether.controller.rpc import status_of
from tether.controller.spec import SpecError, load_document
from tether.controller.store import SqliteStore

DETAILS_KEY = "grpc-status-details-bin"
INVALID = """apiVersion: tether.dev/v1alpha1
kind: Environment
metadata:
  name: lab
spec:
  kernel:
    version: "six"
  kubernetes:
    install: true
    installer: k3s
"""


def _details(status: grpc.Status) -> Status:
    found = [value for key, value in status.trailing_metadata if key == DETAILS_KEY]
    assert len(found) == 1 and isinstance(found[0], bytes)
    return Status.FromString(found[0])


def _violations(status: grpc.Status) -> list[tuple[str, str]]:
    bad = BadRequest()
    (detail,) = _details(status).details
    assert detail.Unpack(bad)
    return [(v.field, v.description) for v in bad.field_violations]


def _spec_error(text: str) -> SpecError:
    with pytest.raises(SpecError) as caught:
        load_document(text)
    return caught.value


class FakeCallError(grpc.RpcError, grpc.Call):
    """What a failed call raises on the client: code, details and trailers."""

    def __init__(
        self, code: grpc.StatusCode, details: str, trailers: tuple[tuple[str, str | bytes], ...] = ()
    ) -> None:
        self._code, self._details, self._trailers = code, details, trailers

    @classmethod
    def of(cls, status: grpc.Status) -> FakeCallError:
        return cls(status.code, status.details, status.trailing_metadata)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str | bytes], ...]:  # type: ignore[override]
        return self._trailers

    def initial_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float:
        return 0.0

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: object) -> bool:
        return False


def test_an_invalid_document_has_one_field_violation_per_problem_with_its_spec_path() -> None:
    exc = _spec_error(INVALID)
    status = status_of(exc)
    assert status.code == grpc.StatusCode.INVALID_ARGUMENT
    assert _violations(status) == [
        ("spec.kernel.version", "not a kernel version like 6.8.0-1015-aws (got 'six')"),
        ("spec.kubernetes.installer", "must be one of kubeadm, kind, microk8s (got 'k3s')"),
    ]
    # The plain message is what it was: the problems, one "path: message" line each.
    assert status.details == "\n".join(exc.problems)
    assert exc.problems == [f"{f}: {d}" for f, d in _violations(status)]
    rich = _details(status)
    assert (rich.code, rich.message) == (grpc.StatusCode.INVALID_ARGUMENT.value[0], status.details)


def test_a_document_that_is_not_yaml_is_a_violation_of_the_document() -> None:
    status = status_of(_spec_error("a: ["))
    ((field, description),) = _violations(status)
    assert field == "document" and description.startswith("not valid YAML")
    assert status.details.startswith("document: not valid YAML")


def test_a_problem_about_no_field_keeps_its_message_and_an_empty_field() -> None:
    status = status_of(InvalidArgument("ttl must be at most 30 days"))
    assert status.details == "ttl must be at most 30 days"
    assert _violations(status) == [("", "ttl must be at most 30 days")]


def test_other_errors_carry_their_code_and_message_without_details() -> None:
    status = status_of(NotFound("environment 'x' not found"))
    assert (status.code, status.details) == (grpc.StatusCode.NOT_FOUND, "environment 'x' not found")
    rich = _details(status)
    assert rich.message == "environment 'x' not found" and not rich.details
    status = status_of(Aborted("environment 'lab' is at generation 4, not 3"))
    assert status.code == grpc.StatusCode.ABORTED


def test_many_problems_stay_within_the_error_budget_and_say_how_many_were_left_out() -> None:
    fields = "".join(f"  unknownField{i}: 1\n" for i in range(1000))
    exc = _spec_error(
        f"apiVersion: tether.dev/v1alpha1\nkind: Environment\nmetadata:\n  name: x\nspec:\n{fields}"
    )
    assert len(exc.problems) == 1000
    status = status_of(exc)
    violations = _violations(status)
    listed = len(violations) - 1
    assert 10 < listed < 1000
    assert violations[:listed] == [(p.field, p.message) for p in exc.violations[:listed]]
    assert violations[-1] == ("", f"{1000 - listed} more problem(s) not listed")
    assert status.details.splitlines() == [f"{f}: {d}" if f else d for f, d in violations]
    details_bin = dict(status.trailing_metadata)[DETAILS_KEY]
    assert isinstance(details_bin, bytes)
    sent = len(status.details.encode()) + 2 * status.details.count("\n") + len(base64.b64encode(details_bin))
    assert sent <= ERROR_STATUS_BYTES


def _sent(status: grpc.Status) -> int:
    details_bin = dict(status.trailing_metadata)[DETAILS_KEY]
    assert isinstance(details_bin, bytes)
    return len(status.details.encode()) + 2 * status.details.count("\n") + len(base64.b64encode(details_bin))


@pytest.mark.parametrize("char", ["x", "é"])
def test_one_problem_over_the_budget_is_kept_its_description_cut_to_fit(char: str) -> None:
    long = char * (2 * ERROR_STATUS_BYTES)
    status = status_of(InvalidArgument("invalid", [Problem("spec.a", long)]))
    ((field, description),) = _violations(status)
    assert field == "spec.a" and description.endswith("…") and len(description) > 100
    assert long.startswith(description[:-1])
    assert status.details == f"spec.a: {description}"
    assert _sent(status) <= ERROR_STATUS_BYTES
    # with more problems after it: the first, cut, then how many were left out
    status = status_of(InvalidArgument("invalid", [Problem("spec.a", long), Problem("spec.b", "short")]))
    violations = _violations(status)
    assert [v[0] for v in violations] == ["spec.a", ""] and violations[0][1].endswith("…")
    assert violations[1] == ("", "1 more problem(s) not listed")
    assert _sent(status) <= ERROR_STATUS_BYTES


def test_a_request_fields_own_error_names_its_field_and_keeps_its_message() -> None:
    message = "ttl must be at most 30 days"
    status = status_of(InvalidArgument(message, [Problem("ttl_seconds", message)]))
    assert status.details == message  # as before: the field goes into the violation only
    assert _violations(status) == [("ttl_seconds", message)]


def test_from_rpc_error_gives_the_class_of_the_code_with_the_field_violations() -> None:
    err = from_rpc_error(FakeCallError.of(status_of(_spec_error(INVALID))))
    assert isinstance(err, InvalidArgumentError) and err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert [v.field for v in err.field_violations] == ["spec.kernel.version", "spec.kubernetes.installer"]
    assert (
        str(err.field_violations[0])
        == "spec.kernel.version: not a kernel version like 6.8.0-1015-aws (got 'six')"
    )
    assert isinstance(from_rpc_error(FakeCallError.of(status_of(NotFound("gone")))), NotFoundError)
    aborted = from_rpc_error(
        FakeCallError.of(status_of(Aborted("environment 'lab' is at generation 4, not 3")))
    )
    assert isinstance(aborted, AbortedError) and aborted.message.endswith("generation 4, not 3")
    assert aborted.field_violations == []


def test_from_rpc_error_without_rich_details_or_with_an_unmapped_code() -> None:
    err = from_rpc_error(FakeCallError(grpc.StatusCode.DATA_LOSS, "lost"))
    assert type(err) is ApiError and err.code == grpc.StatusCode.DATA_LOSS and err.message == "lost"
    assert err.field_violations == []
    assert str(FieldViolation("", "whole request")) == "whole request"
    # Trailers that disagree with the call (a proxy rewrote the message): no violations, no crash.
    trailers = status_of(_spec_error(INVALID)).trailing_metadata
    err = from_rpc_error(FakeCallError(grpc.StatusCode.INVALID_ARGUMENT, "rewritten", trailers))
    assert isinstance(err, InvalidArgumentError) and err.message == "rewritten" and err.field_violations == []


def test_check_generation_names_the_current_one() -> None:
    check_generation("lab", 4, 0)  # 0: no check
    check_generation("lab", 4, 4)
    check_generation("lab", None, 0)
    with pytest.raises(Aborted, match=r"^environment 'lab' is at generation 4, not 3$"):
        check_generation("lab", 4, 3)
    with pytest.raises(Aborted, match=r"^environment 'lab' does not exist \(expected at generation 3\)$"):
        check_generation("lab", None, 3)


def test_invalid_argument_keeps_plain_problem_lines_and_structured_violations() -> None:
    exc = InvalidArgument("bad", [Problem("spec.a", "wrong"), "free text"])
    assert exc.problems == ["spec.a: wrong", "free text"]
    assert exc.violations == [Problem("spec.a", "wrong"), Problem("", "free text")]
    assert InvalidArgument("only").violations == [Problem("", "only")]


async def test_the_store_writes_an_environment_only_at_the_expected_generation(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "t.db")
    try:
        with pytest.raises(Aborted, match="does not exist"):
            await store.put_environment("e", "doc1", "v1", {"a": 1}, expected_generation=1)
        assert store.get_environment("e") is None
        rec, _ = await store.put_environment("e", "doc1", "v1", {"a": 1})
        rec, changed = await store.put_environment("e", "doc2", "v1", {"a": 2}, expected_generation=1)
        assert (rec.generation, changed) == (2, True)
        with pytest.raises(Aborted, match="is at generation 2, not 1"):
            await store.put_environment("e", "doc3", "v1", {"a": 3}, expected_generation=1)
        with pytest.raises(Aborted):  # stale, even for the document already stored
            await store.put_environment("e", "doc2", "v1", {"a": 2}, expected_generation=1)
        current = store.get_environment("e")
        assert current is not None and (current.generation, current.document) == (2, "doc2")
    finally:
        await store.close()


async def test_two_writes_expecting_the_same_generation_one_wins(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "t.db")
    try:
        await store.put_environment("e", "doc1", "v1", {"a": 1})
        results = await asyncio.gather(
            *(
                store.put_environment("e", f"doc-{i}", "v1", {"i": i}, expected_generation=1)
                for i in range(8)
            ),
            return_exceptions=True,
        )
        won = [r for r in results if not isinstance(r, BaseException)]
        lost = [r for r in results if isinstance(r, BaseException)]
        assert len(won) == 1 and len(lost) == 7
        assert all(isinstance(e, Aborted) and "is at generation 2, not 1" in str(e) for e in lost)
        current = store.get_environment("e")
        assert current is not None and current.generation == 2 and current.document == won[0][0].document
    finally:
        await store.close()
