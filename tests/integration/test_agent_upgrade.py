"""Agent upgrades on loopback: FetchAgentBundle (node identity, only the plan's version, resume, the
digest) and the agent deciding about an upgrade only between steps.

The agent here runs from this source checkout, which cannot restart itself into a bundle: it says
so with one event, at the point where an installed agent would begin the upgrade. The restart,
the new version and the rollback on real systemd nodes are ``tests/e2e/test_agent_upgrade.py``.
"""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from tests.integration.agent_bundles import build_version
from tests.integration.conftest import apply_env, ca_hash, events, nodes, token
from tests.integration.harness import BIN, Agent, Controller, wait_for
from tether.nodeagent import wire
from tether.nodeagent.channel import secure_channel
from tether.nodeagent.identity import IdentityStore
from tether.nodeagent.limits import AGENT_BUNDLE_CHUNK_BYTES

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
V2 = "0.1.0+upgrade.2"
STEPS = """\
    - name: long
      inline: |
        sleep 4
        echo long done
    - name: after
      inline: echo after
"""


@pytest.fixture(scope="module")
def v2_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_version(V2, tmp_path_factory.mktemp("v2"))


@pytest.fixture
def controller(tmp_path: Path, v2_bundle: Path) -> Iterator[Controller]:
    c = Controller(tmp_path)
    added = subprocess.run(
        [
            str(BIN / "tether-controller"),
            "agent-bundle",
            "add",
            str(v2_bundle),
            "--data-dir",
            str(c.data_dir),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert added.returncode == 0, added.stderr
    c.start()
    yield c
    c.kill()


async def fetch(
    agent: Agent, controller: Controller, version: str, offset: int = 0
) -> list[wire.pb.BundleChunk]:
    identity = IdentityStore(agent.state_dir).load()
    async with secure_channel(controller.address, identity.ca_pem, identity.key_pem, identity.cert_pem) as ch:
        call = wire.AgentServiceStub(ch).FetchAgentBundle(
            wire.pb.FetchAgentBundleRequest(version=version, offset=offset), timeout=60
        )
        return [chunk async for chunk in call]


def test_a_node_fetches_only_the_version_its_plan_names_and_can_resume(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path, v2_bundle: Path
) -> None:
    apply_env(controller, tmp_path, "up", "    - name: hi\n      inline: echo hi\n")
    agent = agents("node-a")
    agent.start(token(controller, "up"), ca_hash(controller))
    wait_for(
        lambda: nodes(controller).get("node-a", {}).get("state") == "provisioned", 60, what="provisioned"
    )

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        asyncio.run(fetch(agent, controller, V2))  # no plan names it yet
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED

    controller.ctl("agent", "upgrade", "--env", "up", "--version", V2)
    data = v2_bundle.read_bytes()
    sha = hashlib.sha256(data).hexdigest()

    def fetched() -> list[wire.pb.BundleChunk] | None:
        try:
            return asyncio.run(fetch(agent, controller, V2))
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.PERMISSION_DENIED:  # the rollout has not reached it yet
                raise
            return None

    chunks = wait_for(fetched, 60, what="the node's plan to name the new version")
    assert chunks is not None
    assert b"".join(c.data for c in chunks) == data
    assert chunks[0].sha256 == sha and chunks[0].size == len(data)
    assert all(len(c.data) <= AGENT_BUNDLE_CHUNK_BYTES for c in chunks)
    assert [c.offset for c in chunks] == [i * AGENT_BUNDLE_CHUNK_BYTES for i in range(len(chunks))]

    middle = len(data) // 2 + 7  # a download cut off half-way goes on where it stopped
    rest = asyncio.run(fetch(agent, controller, V2, offset=middle))
    assert rest[0].offset == middle and b"".join(c.data for c in rest) == data[middle:]
    with pytest.raises(grpc.aio.AioRpcError) as past:
        asyncio.run(fetch(agent, controller, V2, offset=len(data) + 1))
    assert past.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as other:
        asyncio.run(fetch(agent, controller, "0.0.1"))
    assert other.value.code() == grpc.StatusCode.PERMISSION_DENIED

    controller.ctl("node", "revoke", "node-a")
    with pytest.raises(grpc.aio.AioRpcError) as revoked:
        asyncio.run(fetch(agent, controller, V2))
    assert revoked.value.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAVAILABLE)


def test_a_plan_naming_a_new_agent_while_a_step_runs_is_acted_on_after_that_step(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    apply_env(controller, tmp_path, "up", STEPS)
    agents("node-b").start(token(controller, "up"), ca_hash(controller))

    def long_started() -> bool:
        return any(
            e["step"] == "custom-long" and e["kind"] == "started" for e in events(controller, "node-b")
        )

    wait_for(long_started, 60, what="the long step to start")
    controller.ctl("agent", "upgrade", "--env", "up", "--version", V2)

    def refusal() -> dict[str, object] | None:
        return next(
            (e for e in events(controller, "node-b") if "cannot restart itself" in str(e["message"])), None
        )

    refused = wait_for(refusal, 60, what="the agent's answer to the new agent version")
    assert refused is not None
    evs = events(controller, "node-b")
    long_done = next(e for e in evs if e["step"] == "custom-long" and e["kind"] == "succeeded")
    assert int(str(long_done["seq"])) < int(str(refused["seq"]))
    assert V2 in str(refused["message"])
    wait_for(lambda: nodes(controller)["node-b"]["state"] == "provisioned", 60, what="provisioned")
    assert nodes(controller)["node-b"]["agent_version"] != V2  # it said why; it did not break
    assert sum("cannot restart itself" in str(e["message"]) for e in events(controller, "node-b")) == 1
