"""Scoped admin certificates and the audit log, through the real admin API (generated stubs).

One controller with two environments (lab, prod), a node in each, and an admin ``ci`` limited to
lab (``tether-controller admin issue --environments lab``).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes

from tests.integration.conftest import apply_env, ca_hash, token, wait_state
from tests.integration.harness import BIN, Agent, Controller, wait_for
from tether.controller import wire
from tether.controller.adminconf import AdminConfig
from tether.nodeagent.identity import CONTROLLER_SERVER_NAME

NOOP = '    - name: noop\n      inline: "true"\n'
DENIED = grpc.StatusCode.PERMISSION_DENIED


@dataclass
class Fleet:
    controller: Controller
    workdir: Path
    admin: wire.AdminServiceStub  # the first start's admin.conf: every environment
    ci: wire.AdminServiceStub  # limited to lab
    ci_conf: Path
    ci_fingerprint: str


def issue(controller: Controller, out: Path, name: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(str(BIN / "tether-controller"), "admin", "issue", "--data-dir", str(controller.data_dir)),
            *("--name", name, "--out", str(out), *extra),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )


def connect(conf_path: Path, channels: list[grpc.Channel]) -> wire.AdminServiceStub:
    conf = AdminConfig.read(conf_path)
    creds = grpc.ssl_channel_credentials(conf.ca_pem, conf.key_pem, conf.cert_pem)
    channel = grpc.secure_channel(
        conf.controller, creds, options=[("grpc.ssl_target_name_override", CONTROLLER_SERVER_NAME)]
    )
    channels.append(channel)
    return wire.AdminServiceStub(channel)


def fingerprint_of(conf_path: Path) -> str:
    cert = x509.load_pem_x509_certificate(AdminConfig.read(conf_path).cert_pem)
    return cert.fingerprint(hashes.SHA256()).hex()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    workdir = tmp_path_factory.mktemp("scopes")
    controller = Controller(workdir)
    controller.start()
    agents: list[Agent] = []
    channels: list[grpc.Channel] = []
    try:
        for env in ("lab", "prod"):
            apply_env(controller, workdir, env, NOOP)
            agent = Agent(workdir, f"{env}-1", controller)
            agents.append(agent)
            agent.start(token(controller, env), ca_hash(controller))
        wait_state(controller, ["lab-1", "prod-1"], "provisioned")
        ci_conf = workdir / "ci.conf"
        issued = issue(controller, ci_conf, "ci", "--role", "admin", "--environments", "lab")
        assert "(environments lab)" in issued.stdout
        yield Fleet(
            controller,
            workdir,
            connect(controller.config, channels),
            connect(ci_conf, channels),
            ci_conf,
            fingerprint_of(ci_conf),
        )
    finally:
        for channel in channels:
            channel.close()
        for agent in agents:
            agent.kill()
        controller.kill()


def refused(call: Callable[[], Any]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as exc:
        call()
    return exc.value


def document(name: str, command: str = "true") -> str:
    return (
        "apiVersion: holodeck.nvidia.com/v1alpha1\nkind: Environment\n"
        f'metadata:\n  name: {name}\nspec:\n  customTemplates:\n    - name: noop\n      inline: "{command}"\n'
    )


def all_records(stub: wire.AdminServiceStub, environment: str = "") -> list[Any]:
    records: list[Any] = []
    page_token = ""
    while True:
        page = stub.ListAuditRecords(
            wire.admin.ListAuditRecordsRequest(environment=environment, page_token=page_token), timeout=10
        )
        records += page.records
        page_token = page.next_page_token
        if not page_token:
            return records


def test_a_scoped_admin_is_refused_on_another_environments_nodes_tokens_and_events(fleet: Fleet) -> None:
    ci, a = fleet.ci, fleet.admin
    prod_token = a.CreateToken(wire.admin.CreateTokenRequest(environment="prod"), timeout=10).info.id
    calls: dict[str, Callable[[], Any]] = {
        "GetNode": lambda: ci.GetNode(wire.admin.GetNodeRequest(name="prod-1"), timeout=10),
        "RevokeNode": lambda: ci.RevokeNode(wire.admin.RevokeNodeRequest(name="prod-1"), timeout=10),
        "ResetNode": lambda: ci.ResetNode(wire.admin.ResetNodeRequest(name="prod-1"), timeout=10),
        "ListEvents": lambda: ci.ListEvents(wire.admin.ListEventsRequest(node="prod-1"), timeout=10),
        "FollowEvents(node)": lambda: list(
            ci.FollowEvents(wire.admin.ListEventsRequest(node="prod-1"), timeout=10)
        ),
        "FollowEvents(env)": lambda: list(
            ci.FollowEvents(wire.admin.ListEventsRequest(environment="prod"), timeout=10)
        ),
        "CreateToken": lambda: ci.CreateToken(wire.admin.CreateTokenRequest(environment="prod"), timeout=10),
        "RevokeToken": lambda: ci.RevokeToken(wire.admin.RevokeTokenRequest(id=prod_token), timeout=10),
        "ListTokens": lambda: ci.ListTokens(wire.admin.ListTokensRequest(environment="prod"), timeout=10),
        "ListNodes": lambda: ci.ListNodes(wire.admin.ListNodesRequest(environment="prod"), timeout=10),
        "GetEnvironment": lambda: ci.GetEnvironment(
            wire.admin.GetEnvironmentRequest(name="prod"), timeout=10
        ),
        "ApplyEnvironment": lambda: ci.ApplyEnvironment(
            wire.admin.ApplyEnvironmentRequest(document=document("prod", "echo ci")), timeout=10
        ),
        "DeleteEnvironment": lambda: ci.DeleteEnvironment(
            wire.admin.DeleteEnvironmentRequest(name="prod", force=True), timeout=10
        ),
        "PauseRollout": lambda: ci.PauseRollout(wire.admin.RolloutRequest(environment="prod"), timeout=10),
        "RenderPlan": lambda: ci.RenderPlan(wire.admin.RenderPlanRequest(node="prod-1"), timeout=10),
    }
    for what, call in calls.items():
        err = refused(call)
        assert err.code() == DENIED, (what, err.code(), err.details())
    assert "admin 'ci' may not use environment 'prod'" in refused(calls["CreateToken"]).details()
    for what in ("RevokeToken", "GetNode"):  # a token or node of another environment: it is not named
        assert "'prod'" not in refused(calls[what]).details(), what
    # A name that exists nowhere is NOT_FOUND, as for every admin; the prod node and token are untouched.
    assert refused(lambda: ci.GetNode(wire.admin.GetNodeRequest(name="nope"), timeout=10)).code() == (
        grpc.StatusCode.NOT_FOUND
    )
    assert a.GetNode(wire.admin.GetNodeRequest(name="prod-1"), timeout=10).state == "provisioned"
    prod_tokens = a.ListTokens(wire.admin.ListTokensRequest(environment="prod"), timeout=10).tokens
    assert not next(t for t in prod_tokens if t.id == prod_token).revoked
    assert a.GetEnvironment(wire.admin.GetEnvironmentRequest(name="prod"), timeout=10).name == "prod"
    # Inside its scope it is an admin like any other.
    assert ci.GetNode(wire.admin.GetNodeRequest(name="lab-1"), timeout=10).environment == "lab"


def test_a_scoped_admin_lists_only_its_environments(fleet: Fleet) -> None:
    ci, a = fleet.ci, fleet.admin
    a.CreateToken(wire.admin.CreateTokenRequest(environment="prod"), timeout=10)
    a.CreateToken(wire.admin.CreateTokenRequest(environment="lab"), timeout=10)
    assert {n.name for n in ci.ListNodes(wire.admin.ListNodesRequest(), timeout=10).nodes} == {"lab-1"}
    assert {n.name for n in a.ListNodes(wire.admin.ListNodesRequest(), timeout=10).nodes} >= {
        "lab-1",
        "prod-1",
    }
    envs = ci.ListEnvironments(wire.admin.ListEnvironmentsRequest(), timeout=10).environments
    assert [e.name for e in envs] == ["lab"]
    listed = ci.ListTokens(wire.admin.ListTokensRequest(), timeout=10).tokens
    assert listed and {t.environment for t in listed} == {"lab"}
    everything = a.ListTokens(wire.admin.ListTokensRequest(), timeout=10).tokens
    assert {t.environment for t in everything} == {"lab", "prod"}
    # tetherctl with the scoped config sees the same
    out = json.loads(
        fleet.controller.ctl("--config", str(fleet.ci_conf), "node", "list", "-o", "json").stdout
    )
    assert [n["name"] for n in out] == ["lab-1"]


def test_audit_records_name_the_caller_and_never_hold_a_secret(fleet: Fleet, tmp_path: Path) -> None:
    ci, a = fleet.ci, fleet.admin
    created = ci.CreateToken(wire.admin.CreateTokenRequest(environment="lab", ttl_seconds=600), timeout=10)
    canary = created.token.split(".", 1)[1]  # the secret half: it must be nowhere but in that reply
    assert len(canary) == 32
    before = a.GetEnvironment(wire.admin.GetEnvironmentRequest(name="lab"), timeout=10).generation
    applied = ci.ApplyEnvironment(
        wire.admin.ApplyEnvironmentRequest(document=document("lab", "echo audited")), timeout=10
    )
    assert applied.changed and applied.environment.generation == before + 1
    ci.RevokeToken(wire.admin.RevokeTokenRequest(id=created.info.id), timeout=10)
    node = a.GetNode(wire.admin.GetNodeRequest(name="lab-1"), timeout=10)
    assert node.name == "lab-1"
    refused(lambda: ci.CreateToken(wire.admin.CreateTokenRequest(environment="prod"), timeout=10))
    password = "bootstrap-password-canary-0123456789"
    ssh = wire.admin.SshTarget(host="127.0.0.1", port=1, user="root", password=password)
    bootstrap = wire.admin.BootstrapRequest(environment="prod", ssh=ssh)
    assert refused(lambda: list(ci.Bootstrap(bootstrap, timeout=10))).code() == DENIED
    whole = wire.admin.RevokeTokenRequest(id=created.token)  # the whole token pasted as an id
    refused(lambda: ci.RevokeToken(whole, timeout=10))
    viewer = tmp_path / "viewer.conf"
    issue(fleet.controller, viewer, "viewer", "--role", "read-only")
    channels: list[grpc.Channel] = []
    ro = connect(viewer, channels)
    refused(lambda: ro.CreateToken(wire.admin.CreateTokenRequest(environment="lab"), timeout=10))
    ro.ListNodes(wire.admin.ListNodesRequest(), timeout=10)  # reads are not recorded

    records = all_records(a)
    by_ci = [r for r in records if r.admin == "ci"]
    assert {r.fingerprint for r in by_ci} == {fleet.ci_fingerprint}

    def one(method: str, outcome: str = "ok", environment: str = "lab") -> Any:
        hits = [r for r in by_ci if (r.method, r.outcome, r.environment) == (method, outcome, environment)]
        assert hits, (method, outcome, [(r.method, r.outcome, r.environment) for r in by_ci])
        return hits[0]  # newest first

    apply = one("ApplyEnvironment")
    assert (apply.generation_before, apply.generation_after) == (before, before + 1)
    assert apply.time_ms > 0
    assert created.info.id in one("CreateToken").detail
    assert one("RevokeToken").detail == f"token {created.info.id} revoked"
    denied = one("CreateToken", "PERMISSION_DENIED", "prod")
    assert "may not use environment 'prod'" in denied.detail
    assert one("RevokeToken", "NOT_FOUND", "").detail.startswith("token ")
    assert "may not use environment 'prod'" in one("Bootstrap", "PERMISSION_DENIED", "prod").detail
    ro_denied = [r for r in records if r.admin == "viewer"]
    assert [(r.method, r.outcome) for r in ro_denied] == [("CreateToken", "PERMISSION_DENIED")]
    assert not [r for r in records if r.method in ("ListNodes", "GetNode", "GetEnvironment")]
    ids = [r.id for r in records]
    assert ids == sorted(ids, reverse=True)  # newest first

    # The canary: in no record (whatever the field), not in the database nor its journal.
    assert all(canary not in str(r) and password not in str(r) for r in records)
    for name in ("tether.db", "tether.db-wal"):
        path = fleet.controller.data_dir / name
        if path.exists():
            assert canary.encode() not in path.read_bytes(), name
    assert canary not in fleet.controller.db_dump()
    for channel in channels:
        channel.close()


def test_audit_records_are_paged_and_scoped_and_shown_by_tetherctl(fleet: Fleet) -> None:
    ci, a = fleet.ci, fleet.admin
    for _ in range(3):
        ci.CreateToken(wire.admin.CreateTokenRequest(environment="lab"), timeout=10)
    refused(lambda: ci.CreateToken(wire.admin.CreateTokenRequest(environment="prod"), timeout=10))

    first = a.ListAuditRecords(wire.admin.ListAuditRecordsRequest(page_size=2), timeout=10)
    assert len(first.records) == 2 and first.next_page_token
    second = a.ListAuditRecords(
        wire.admin.ListAuditRecordsRequest(page_size=2, page_token=first.next_page_token), timeout=10
    )
    assert second.records and max(r.id for r in second.records) < min(r.id for r in first.records)
    bad = refused(
        lambda: a.ListAuditRecords(
            wire.admin.ListAuditRecordsRequest(environment="lab", page_token=first.next_page_token),
            timeout=10,
        )
    )
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT  # a token of another query

    mine = all_records(ci)
    assert mine and {r.environment for r in mine} == {"lab"}
    assert any(r.environment == "prod" for r in all_records(a))
    err = refused(
        lambda: ci.ListAuditRecords(wire.admin.ListAuditRecordsRequest(environment="prod"), timeout=10)
    )
    assert err.code() == DENIED

    shown = json.loads(
        fleet.controller.ctl("--config", str(fleet.ci_conf), "audit", "-o", "json", "--limit", "3").stdout
    )
    assert len(shown) == 3
    assert {r["admin"] for r in shown} == {"ci"} and {r["environment"] for r in shown} == {"lab"}
    assert all(r["time"].endswith("Z") and "T" in r["time"] for r in shown)  # RFC 3339, UTC
    assert all(isinstance(r["id"], int) and isinstance(r["generation_after"], int) for r in shown)
    assert [r["id"] for r in shown] == sorted((r["id"] for r in shown), reverse=True)
    table = fleet.controller.ctl("audit", "--env", "prod").stdout.splitlines()
    assert table[0].split() == ["TIME", "ADMIN", "METHOD", "ENVIRONMENT", "NODE", "OUTCOME", "DETAIL"]
    assert any("PERMISSION_DENIED" in line and " ci " in line for line in table[1:])


def test_a_certificate_whose_scope_differs_from_its_record_is_refused(fleet: Fleet, tmp_path: Path) -> None:
    ops_conf = tmp_path / "ops.conf"
    issue(fleet.controller, ops_conf, "ops", "--role", "admin", "--environments", "lab")
    channels: list[grpc.Channel] = []
    ops = connect(ops_conf, channels)
    assert [
        e.name for e in ops.ListEnvironments(wire.admin.ListEnvironmentsRequest(), timeout=10).environments
    ] == ["lab"]
    listed = subprocess.run(
        [str(BIN / "tether-controller"), "admin", "list", "--data-dir", str(fleet.controller.data_dir)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert any(line.split()[0] == "ops" and line.split()[-1] == "lab" for line in listed.splitlines())
    # The registry is authoritative: recorded otherwise, the certificate's own list is refused.
    path = fleet.controller.data_dir / "pki" / "admins.json"
    doc = json.loads(path.read_text())
    for entry in doc["admins"]:
        if entry["name"] == "ops":
            entry["environments"] = ["lab", "prod"]
    path.write_text(json.dumps(doc))

    def refused_now() -> bool:
        try:
            ops.ListEnvironments(wire.admin.ListEnvironmentsRequest(), timeout=10)
        except grpc.RpcError as exc:
            return exc.code() == DENIED and "recorded" in (exc.details() or "")
        return False

    wait_for(refused_now, timeout=15, what="the mismatched certificate refused")
    for channel in channels:
        channel.close()


def test_a_name_taken_over_from_another_environment_brings_none_of_its_history(
    fleet: Fleet, tmp_path: Path
) -> None:
    a, ci, controller = fleet.admin, fleet.ci, fleet.controller
    prods = [
        (e.seq, e.time_ms, e.message)
        for e in a.ListEvents(wire.admin.ListEventsRequest(node="prod-1"), timeout=10).events
    ]
    assert prods
    moved = "node 'prod-1' is enrolled in another environment: delete it first"  # prod is not named
    bound = wire.admin.CreateTokenRequest(environment="lab", node_name="prod-1")
    err = refused(lambda: ci.CreateToken(bound, timeout=10))
    assert (err.code(), err.details()) == (grpc.StatusCode.FAILED_PRECONDITION, moved)
    a.RevokeNode(wire.admin.RevokeNodeRequest(name="prod-1"), timeout=10)  # revoked, not deleted
    agent = Agent(tmp_path, "prod-1", controller)  # a machine of lab's, enrolled under that name
    agent.start(token(controller, "lab"), ca_hash(controller))
    try:

        def enrolled_in_lab() -> bool:
            node = a.GetNode(wire.admin.GetNodeRequest(name="prod-1"), timeout=10)
            return node.environment == "lab" and node.state == "provisioned"

        wait_for(enrolled_in_lab, timeout=60, what="prod-1 enrolled into lab")
        seen = ci.ListEvents(wire.admin.ListEventsRequest(node="prod-1"), timeout=10).events
        assert seen and seen[0].seq == 1  # its sequence starts afresh
        assert not {(e.seq, e.time_ms, e.message) for e in seen} & set(prods)
        followed = ci.FollowEvents(wire.admin.ListEventsRequest(node="prod-1"), timeout=10)
        first = next(iter(followed))
        followed.cancel()
        assert (first.seq, first.time_ms, first.message) == (seen[0].seq, seen[0].time_ms, seen[0].message)
        # Now lab holds the name: a token bound to it is refused for prod, allowed for lab.
        err = refused(
            lambda: a.CreateToken(
                wire.admin.CreateTokenRequest(environment="prod", node_name="prod-1"), timeout=10
            )
        )
        assert (err.code(), err.details()) == (grpc.StatusCode.FAILED_PRECONDITION, moved)
        assert ci.CreateToken(bound, timeout=10).info.node_name == "prod-1"
    finally:
        agent.kill()


def revoke_admin(controller: Controller, name: str) -> None:
    subprocess.run(
        [
            *(str(BIN / "tether-controller"), "admin", "revoke", "--data-dir", str(controller.data_dir)),
            *("--name", name),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )


def ended_with(call: Any) -> grpc.StatusCode:
    """Read an open stream to its end: the code it ended with (the deadline bounds a stream never cut)."""
    try:
        for _ in call:
            pass
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def test_open_watches_and_follows_end_once_the_admin_certificate_is_revoked(
    fleet: Fleet, tmp_path: Path
) -> None:
    conf = tmp_path / "watcher.conf"
    issue(fleet.controller, conf, "watcher", "--role", "read-only", "--environments", "lab")
    channels: list[grpc.Channel] = []
    watcher = connect(conf, channels)
    try:
        watch = watcher.WatchNodes(wire.admin.WatchNodesRequest(environment="lab"), timeout=60)
        follow_node = watcher.FollowEvents(wire.admin.ListEventsRequest(node="lab-1"), timeout=60)
        follow_env = watcher.FollowEvents(wire.admin.ListEventsRequest(environment="lab"), timeout=60)
        assert next(iter(watch)).node.environment == "lab"  # open, and answering
        assert next(iter(follow_node)).seq >= 1
        assert next(iter(follow_env)).seq >= 1
        revoke_admin(fleet.controller, "watcher")
        for call in (watch, follow_node, follow_env):
            assert ended_with(call) == grpc.StatusCode.UNAUTHENTICATED
    finally:
        for channel in channels:
            channel.close()


def test_an_open_watch_ends_once_the_registry_records_another_scope(fleet: Fleet, tmp_path: Path) -> None:
    conf = tmp_path / "narrowed.conf"
    issue(fleet.controller, conf, "narrowed", "--role", "read-only", "--environments", "lab")
    channels: list[grpc.Channel] = []
    narrowed = connect(conf, channels)
    try:
        watch = narrowed.WatchNodes(wire.admin.WatchNodesRequest(), timeout=60)
        assert next(iter(watch)).node.environment == "lab"
        path = fleet.controller.data_dir / "pki" / "admins.json"
        doc = json.loads(path.read_text())
        for entry in doc["admins"]:
            if entry["name"] == "narrowed":
                entry["environments"] = ["prod"]
        path.write_text(json.dumps(doc))
        assert ended_with(watch) == DENIED
    finally:
        for channel in channels:
            channel.close()
