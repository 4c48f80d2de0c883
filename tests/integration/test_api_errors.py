"""Issue 17 through the real API with the generated stub: validation failures carry a
google.rpc.BadRequest with the spec paths, a stale expected_generation is ABORTED naming the current
one (also under a race: exactly one of two applies wins), and ``tetherctl env apply
--expect-generation``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.rpc.error_details_pb2 import BadRequest
from grpc_status import rpc_status

from tests.integration.harness import Controller
from tether.controller.adminconf import AdminConfig
from tether.controller.client.errors import AbortedError, InvalidArgumentError, NotFoundError, from_rpc_error
from tether.nodeagent.identity import CONTROLLER_SERVER_NAME
from tether.v1 import admin_pb2, admin_pb2_grpc

pytestmark = pytest.mark.integration

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


def _doc(step: str, name: str = "lab") -> str:
    return (
        f"apiVersion: tether.dev/v1alpha1\nkind: Environment\nmetadata:\n  name: {name}\n"
        f"spec:\n  customTemplates:\n    - name: {step}\n      inline: echo {step}\n"
    )


@pytest.fixture
def stub(controller: Controller) -> Iterator[admin_pb2_grpc.AdminServiceStub]:
    """The generated stub on a channel with gRPC's default options (as any other client has)."""
    conf = AdminConfig.read(controller.config, "")
    creds = grpc.ssl_channel_credentials(conf.ca_pem, conf.key_pem, conf.cert_pem)
    options = [("grpc.ssl_target_name_override", CONTROLLER_SERVER_NAME)]
    with grpc.secure_channel(controller.address, creds, options=options) as channel:
        yield admin_pb2_grpc.AdminServiceStub(channel)


def _apply(
    stub: admin_pb2_grpc.AdminServiceStub, document: str, expected: int = 0, dry_run: bool = False
) -> admin_pb2.ApplyEnvironmentResponse:
    request = admin_pb2.ApplyEnvironmentRequest(
        document=document, expected_generation=expected, dry_run=dry_run
    )
    reply: admin_pb2.ApplyEnvironmentResponse = stub.ApplyEnvironment(request, timeout=30)
    return reply


def _refusal(
    stub: admin_pb2_grpc.AdminServiceStub, document: str, expected: int = 0, dry_run: bool = False
) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        _apply(stub, document, expected, dry_run)
    return caught.value


def test_an_invalid_document_is_invalid_argument_with_a_field_violation_per_problem(
    stub: admin_pb2_grpc.AdminServiceStub,
) -> None:
    exc = _refusal(stub, INVALID)
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
    expected = [
        ("spec.kernel.version", "not a kernel version like 6.8.0-1015-aws (got 'six')"),
        ("spec.kubernetes.installer", "must be one of kubeadm, kind, microk8s (got 'k3s')"),
    ]
    # On the wire: a google.rpc.Status whose details hold a google.rpc.BadRequest.
    status = rpc_status.from_call(exc)  # type: ignore[arg-type]
    assert status is not None and status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    bad = BadRequest()
    assert len(status.details) == 1 and status.details[0].Unpack(bad)
    assert [(v.field, v.description) for v in bad.field_violations] == expected
    # The plain message is unchanged: the problems, one per line.
    assert exc.details() == "\n".join(f"{f}: {d}" for f, d in expected)
    # And through the SDK's mapping.
    err = from_rpc_error(exc)
    assert isinstance(err, InvalidArgumentError)
    assert [(v.field, v.description) for v in err.field_violations] == expected


def test_errors_of_a_request_field_name_it_in_their_violation(stub: admin_pb2_grpc.AdminServiceStub) -> None:
    _apply(stub, _doc("one"))
    bad_page = admin_pb2.ListNodesRequest(page_token="not-a-token")
    calls = {
        "page_token": lambda: stub.ListNodes(bad_page, timeout=30),
        "ttl_seconds": lambda: stub.CreateToken(
            admin_pb2.CreateTokenRequest(environment="lab", ttl_seconds=400 * 86400), timeout=30
        ),
    }
    for field, call in calls.items():
        with pytest.raises(grpc.RpcError) as caught:
            call()
        err = from_rpc_error(caught.value)
        assert isinstance(err, InvalidArgumentError), (field, err)
        (violation,) = err.field_violations
        # the field in the violation; the message as it always was (it does not repeat the field)
        assert (violation.field, violation.description) == (field, caught.value.details()), field
    assert caught.value.details() == "ttl must be at most 365 days"


def test_a_stale_expected_generation_is_aborted_naming_the_current_one(
    stub: admin_pb2_grpc.AdminServiceStub,
) -> None:
    missing = _refusal(stub, _doc("one"), expected=1)
    assert missing.code() == grpc.StatusCode.ABORTED
    assert missing.details() == "environment 'lab' does not exist (expected at generation 1)"
    assert _apply(stub, _doc("one")).environment.generation == 1  # 0: no check
    assert _apply(stub, _doc("two"), expected=1).environment.generation == 2
    for dry_run in (True, False):
        stale = _refusal(stub, _doc("three"), expected=1, dry_run=dry_run)
        assert stale.code() == grpc.StatusCode.ABORTED, dry_run
        assert stale.details() == "environment 'lab' is at generation 2, not 1"
        err = from_rpc_error(stale)
        assert isinstance(err, AbortedError) and err.message == stale.details()
    # Nothing of the refused applies was stored; the right generation applies.
    current = stub.GetEnvironment(admin_pb2.GetEnvironmentRequest(name="lab"), timeout=30)
    assert (current.generation, current.document) == (2, _doc("two"))
    assert _apply(stub, _doc("three"), expected=2, dry_run=True).environment.generation == 2
    assert _apply(stub, _doc("three"), expected=2).environment.generation == 3


def test_of_two_applies_expecting_the_same_generation_exactly_one_wins(
    stub: admin_pb2_grpc.AdminServiceStub,
) -> None:
    assert _apply(stub, _doc("base")).environment.generation == 1
    futures = [
        stub.ApplyEnvironment.future(
            admin_pb2.ApplyEnvironmentRequest(document=_doc(f"racer{i}"), expected_generation=1), timeout=30
        )
        for i in range(2)
    ]
    won, lost = [], []
    for i, future in enumerate(futures):
        try:
            won.append((i, future.result()))
        except grpc.RpcError as exc:
            lost.append(exc)
    assert len(won) == 1 and len(lost) == 1
    assert lost[0].code() == grpc.StatusCode.ABORTED
    assert lost[0].details() == "environment 'lab' is at generation 2, not 1"
    winner, reply = won[0]
    assert reply.changed and reply.environment.generation == 2
    current = stub.GetEnvironment(admin_pb2.GetEnvironmentRequest(name="lab"), timeout=30)
    assert (current.generation, current.document) == (2, _doc(f"racer{winner}"))


def test_tetherctl_env_apply_expect_generation(controller: Controller, tmp_path: Path) -> None:
    doc = tmp_path / "lab.yaml"
    doc.write_text(_doc("one"))
    controller.ctl("env", "apply", "-f", str(doc))
    doc.write_text(_doc("two"))
    stale = controller.ctl("env", "apply", "-f", str(doc), "--expect-generation", "2", check=False)
    assert stale.returncode == 3
    assert stale.stderr.splitlines() == [
        "tetherctl: environment 'lab' is at generation 1, not 2 (nothing applied)"
    ]
    assert stale.stdout == ""
    ok = controller.ctl("env", "apply", "-f", str(doc), "--expect-generation", "1")
    assert ok.stdout.strip() == "environment/lab applied (generation 2)"
    bad = tmp_path / "bad.yaml"
    bad.write_text(INVALID)
    invalid = controller.ctl("env", "apply", "-f", str(bad), check=False)
    assert invalid.returncode == 1
    assert invalid.stderr.splitlines() == [
        "spec.kernel.version: not a kernel version like 6.8.0-1015-aws (got 'six')",
        "spec.kubernetes.installer: must be one of kubeadm, kind, microk8s (got 'k3s')",
    ]


def test_other_errors_map_to_their_classes_on_unary_and_streaming_calls(
    stub: admin_pb2_grpc.AdminServiceStub,
) -> None:
    with pytest.raises(grpc.RpcError) as missing:
        stub.GetEnvironment(admin_pb2.GetEnvironmentRequest(name="nowhere"), timeout=30)
    err = from_rpc_error(missing.value)
    assert isinstance(err, NotFoundError) and err.message == "environment 'nowhere' not found"
    with pytest.raises(grpc.RpcError) as stream:  # a streaming method ends with the same status
        list(stub.FollowEvents(admin_pb2.ListEventsRequest(), timeout=30))
    err = from_rpc_error(stream.value)
    assert isinstance(err, InvalidArgumentError)
    assert [(v.field, v.description) for v in err.field_violations] == [
        ("", "FollowEvents needs a node or an environment")
    ]
