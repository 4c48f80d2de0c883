"""Paging (AIP-158) through the real admin API: the generated stub, the SDK and tetherctl.

Node records are written into the controller's store directly (enrolling hundreds or thousands of
agents would only slow the test down); everything is then read back through the API.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.integration.conftest import apply_env
from tests.integration.harness import Controller
from tether.controller import paging, wire
from tether.controller.adminconf import AdminConfig
from tether.controller.client import Client
from tether.controller.client.errors import InvalidArgumentError
from tether.nodeagent.identity import CONTROLLER_SERVER_NAME
from tether.nodeagent.model import Gpu, HostFacts

STEP = '    - name: a\n      inline: "true"\n'
DOCUMENT = (
    "apiVersion: holodeck.nvidia.com/v1alpha1\nkind: Environment\nmetadata:\n  name: {name}\n"
    "spec:\n  customTemplates:\n" + STEP
)
DEFAULT_CLIENT_LIMIT = 4 * 1024 * 1024  # what gRPC clients receive in one message unless told more


def gpu_facts(name: str, addresses: int = 0) -> dict[str, object]:
    """What an 8-GPU node reports about itself (about 1.3 KB encoded as a Node), with ``addresses``
    more addresses (a node with many interfaces: about 14 bytes each)."""
    gpus = tuple(
        Gpu(i, "NVIDIA H200", f"GPU-{name}-{i:02d}-0d9c7a6e-5b4f", "570.86.15", 143771, f"0000:{i:02x}:00.0")
        for i in range(8)
    )
    facts = HostFacts(
        hostname=name,
        os_id="ubuntu",
        os_version_id="22.04",
        os_pretty="Ubuntu 22.04.5 LTS",
        os_family="debian",
        arch="x86_64",
        kernel="6.8.0-1015-nvidia",
        python_version="3.10.12",
        systemd=True,
        nvidia_gpu=True,
        gpus=gpus,
        addresses=("10.20.30.40", "fd00::40", *(f"10.99.{i // 250}.{i % 250}" for i in range(addresses))),
        boot_id="5c1e0d0a-8f3e-4a57-9a1c-2f6b1d3e4f50",
        machine_id="0f1e2d3c4b5a69788796a5b4c3d2e1f0",
    )
    return dataclasses.asdict(facts)


def fill_nodes(controller: Controller, environment: str, names: list[str], addresses: int = 0) -> None:
    """Node records of ``environment`` (enrolled, never connected), straight into the store."""
    now = int(time.time() * 1000)
    facts = json.dumps(gpu_facts("@NAME@", addresses))  # a name needs no escaping in JSON
    rows = [
        (n, environment, "worker", f"{i:064x}", "k" * 64, "tok", now, facts.replace("@NAME@", n), now)
        for i, n in enumerate(names)
    ]
    with contextlib.closing(sqlite3.connect(controller.data_dir / "tether.db", timeout=30)) as conn:
        conn.executemany(
            "INSERT INTO nodes (name, environment, role, cert_fingerprint, key_hash, token_id, enrolled_ms, "
            "facts, last_seen_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        conn.commit()


def admin_channel(controller: Controller, *options: tuple[str, int | str]) -> grpc.Channel:
    """An admin channel at gRPC's default limits (tetherctl's raise them; other clients do not)."""
    conf = AdminConfig.read(controller.config)
    creds = grpc.ssl_channel_credentials(conf.ca_pem, conf.key_pem, conf.cert_pem)
    target = ("grpc.ssl_target_name_override", CONTROLLER_SERVER_NAME)
    return grpc.secure_channel(conf.controller, creds, options=[target, *options])


@pytest.fixture
def stub(controller: Controller) -> Iterator[wire.AdminServiceStub]:
    channel = admin_channel(controller)
    yield wire.AdminServiceStub(channel)
    channel.close()


@pytest.fixture
def sdk(controller: Controller) -> Iterator[Client]:
    with Client.from_admin_conf(controller.config) as client:
        yield client


def node_names(n: int, prefix: str = "gpu") -> list[str]:
    return [f"{prefix}-{i:05d}" for i in range(n)]


def test_list_nodes_pages_through_the_stub_and_the_sdk(
    controller: Controller, stub: wire.AdminServiceStub, sdk: Client, tmp_path: Path
) -> None:
    apply_env(controller, tmp_path, "lab", STEP)
    apply_env(controller, tmp_path, "other", STEP)
    lab = node_names(250)
    fill_nodes(controller, "lab", lab[::-1])  # written out of order: listed by name all the same
    fill_nodes(controller, "other", node_names(30, "cpu"))
    pages, token = [], ""
    while True:
        reply = stub.ListNodes(
            wire.admin.ListNodesRequest(environment="lab", page_size=100, page_token=token), timeout=30
        )
        pages.append([n.name for n in reply.nodes])
        token = reply.next_page_token
        if not token:
            break
    assert [len(p) for p in pages] == [100, 100, 50]
    assert [n for p in pages for n in p] == lab  # every node exactly once, by name
    assert [n.name for n in sdk.iter_nodes("lab", page_size=100)] == lab
    assert [n.name for n in sdk.iter_nodes()] == node_names(30, "cpu") + lab  # every environment
    assert len(sdk.list_nodes("other", page_size=7)) == 30
    first = stub.ListNodes(wire.admin.ListNodesRequest(environment="lab"), timeout=30)
    assert len(first.nodes) == paging.DEFAULT_PAGE_SIZE and first.next_page_token
    one = stub.ListNodes(wire.admin.ListNodesRequest(environment="lab", page_size=5000), timeout=30)
    assert len(one.nodes) == 250 and not one.next_page_token  # 250 < the maximum, well within 2 MiB


def test_a_tampered_or_foreign_page_token_is_invalid_argument(
    controller: Controller, stub: wire.AdminServiceStub, sdk: Client, tmp_path: Path
) -> None:
    apply_env(controller, tmp_path, "lab", STEP)
    fill_nodes(controller, "lab", node_names(30))
    token = stub.ListNodes(
        wire.admin.ListNodesRequest(environment="lab", page_size=10), timeout=30
    ).next_page_token
    raw = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    raw["after"] = "gpu-00025"  # skip ahead by editing the cursor
    edited = base64.urlsafe_b64encode(json.dumps(raw).encode()).decode()
    bad = [
        wire.admin.ListNodesRequest(environment="lab", page_token=edited),
        wire.admin.ListNodesRequest(environment="lab", page_token="not-a-token"),
        wire.admin.ListNodesRequest(environment="", page_token=token),  # other request fields
    ]
    for request in bad:
        with pytest.raises(grpc.RpcError) as exc:
            stub.ListNodes(request, timeout=30)
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "page_token" in (exc.value.details() or "")
    with pytest.raises(grpc.RpcError) as exc:  # a ListNodes token is no ListTokens token
        stub.ListTokens(wire.admin.ListTokensRequest(environment="lab", page_token=token), timeout=30)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(InvalidArgumentError, match="page_token"):
        sdk.call(sdk.stub.ListNodes, bad[0])
    again = stub.ListNodes(wire.admin.ListNodesRequest(environment="lab", page_token=token), timeout=30)
    assert again.nodes[0].name == "gpu-00010"  # the token as handed out still works


def test_tokens_and_environments_page_too(
    controller: Controller, stub: wire.AdminServiceStub, sdk: Client, tmp_path: Path
) -> None:
    envs = [f"env-{i:02d}" for i in range(12)]
    for name in envs:
        sdk.apply_environment(DOCUMENT.format(name=name))
    made = [sdk.create_token("env-03", description=f"t{i}").info.id for i in range(25)]
    made += [sdk.create_token("env-04").info.id for _ in range(3)]
    pages, token = [], ""
    while True:
        reply = stub.ListTokens(
            wire.admin.ListTokensRequest(environment="env-03", page_size=10, page_token=token), timeout=30
        )
        pages.append([t.id for t in reply.tokens])
        token = reply.next_page_token
        if not token:
            break
    assert [len(p) for p in pages] == [10, 10, 5]
    assert sorted(t for p in pages for t in p) == sorted(made[:25])  # each exactly once
    listed = sdk.list_tokens("env-03", page_size=4)
    created = [(t.created_ms, t.id) for t in listed]
    assert created == sorted(created) and {t.id for t in listed} == set(made[:25])  # oldest first
    assert {t.id for t in sdk.iter_tokens(page_size=3)} == set(made)
    env_pages, token = [], ""
    while True:
        env_reply = stub.ListEnvironments(
            wire.admin.ListEnvironmentsRequest(page_size=5, page_token=token), timeout=30
        )
        env_pages.append([e.name for e in env_reply.environments])
        token = env_reply.next_page_token
        if not token:
            break
    assert env_pages == [envs[:5], envs[5:10], envs[10:]]
    assert [e.name for e in sdk.iter_environments(page_size=2)] == envs
    shown = controller.ctl("token", "list", "--env", "env-03").stdout.splitlines()
    assert len(shown) == 26  # tetherctl pages through the same list


def test_tetherctl_pages_through_more_than_its_page(controller: Controller, tmp_path: Path) -> None:
    """tetherctl asks for the largest page (1000): 1,200 nodes take two, and nothing shows it."""
    apply_env(controller, tmp_path, "lab", STEP)
    lab = node_names(1200)
    fill_nodes(controller, "lab", lab)
    started = time.monotonic()
    listed = json.loads(controller.ctl("node", "list", "--env", "lab", "-o", "json").stdout)
    print(f"1200 nodes: tetherctl node list -o json {time.monotonic() - started:.1f}s")
    assert [n["name"] for n in listed] == lab
    assert listed[0]["facts"]["gpus"][7]["name"] == "NVIDIA H200"
    table = controller.ctl("node", "list", "--env", "lab").stdout.splitlines()
    assert len(table) == 1201 and table[1].split()[0] == lab[0] and table[-1].split()[0] == lab[-1]
    # tetherctl wait counts every node of the environment, not those of one page
    out = controller.ctl("wait", "--env", "lab", "--for", "provisioned", "--timeout", "1s", check=False)
    assert out.returncode == 2, out.stderr
    assert "0/1200 provisioned" in out.stderr


def test_fifteen_thousand_nodes_list_at_default_client_limits(controller: Controller, tmp_path: Path) -> None:
    """15,000 nodes of 8 GPUs each: about 14 MB, three times what a gRPC client receives by default
    in one message; the SDK at those defaults reads them all, page by page."""
    apply_env(controller, tmp_path, "fleet", STEP)
    fleet = node_names(15_000)
    fill_nodes(controller, "fleet", fleet)
    started = time.monotonic()
    with Client(admin_channel(controller), timeout=60) as client:  # gRPC's 4 MiB receive limit
        nodes = list(client.iter_nodes("fleet", page_size=paging.MAX_PAGE_SIZE))
    print(f"15000 nodes: the SDK's iterator {time.monotonic() - started:.1f}s")
    assert [n.name for n in nodes] == fleet
    assert sum(n.ByteSize() for n in nodes) > 3 * DEFAULT_CLIENT_LIMIT  # one message could not hold it
    assert nodes[-1].facts.gpus[7].name == "NVIDIA H200"


def test_the_byte_bound_ends_a_page_before_its_size(controller: Controller, tmp_path: Path) -> None:
    """Large nodes (about 4 KB each): a page of 1000 would be 4 MB; it ends at 2 MiB instead, so a
    client that receives no more than that still pages through them all."""
    apply_env(controller, tmp_path, "fleet", STEP)
    fleet = node_names(1500)
    fill_nodes(controller, "fleet", fleet, addresses=200)
    limit = ("grpc.max_receive_message_length", paging.MAX_PAGE_BYTES + 64 * 1024)
    channel = admin_channel(controller, limit)
    try:
        stub = wire.AdminServiceStub(channel)
        request = wire.admin.ListNodesRequest(environment="fleet", page_size=1000)
        first = stub.ListNodes(request, timeout=60)
        with Client(channel, timeout=60) as client:
            every = [n.name for n in client.iter_nodes("fleet", page_size=1000)]
    finally:
        channel.close()
    assert first.ByteSize() <= paging.MAX_PAGE_BYTES + 1024 and first.next_page_token
    assert 300 < len(first.nodes) < 1000
    assert every == fleet
