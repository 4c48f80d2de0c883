"""Cluster orchestration by pull.

The controller turns a cluster spec into per-node plans with a gate: every
node runs its base steps at once; the control plane chosen to initialise
(once, durably) runs ``kubeadm init`` and its agent sends the join material
over its stream; the gate then opens and the other nodes join in parallel.
Material that has expired (token TTL, the 2-hour certificate-key window) is
refreshed by asking a control plane's agent, so nodes can join days later.
After each join a control plane labels and taints the new node. With ``spec.rollout.drain`` the
drain and uncordon gates around a node's disruptive steps are answered by ``drain.Drainer``.

Nothing is handed to a revoked node (releases, refresh and label tasks) and nothing from one is
accepted. Init material is accepted once per cluster, from the init node, only while its
``kubeadm-init`` step is running (the step record of its current plan, so with that digest).

Control planes join one at a time (stacked etcd members added in parallel is a known kubeadm
failure), workers in parallel: join material goes to one joining control plane at a time, the
holder of the environment's durable join slot, until its kubeadm-join succeeded or finally
failed (or it was revoked, reset, or held the slot past ``CP_JOIN_SLOT_S``).

Waiters live in memory: after a controller restart agents re-send their gate
requests on reconnect; the join slot is in the store, so a restart never lets two in at once.
A single-node kubeadm environment (no spec.cluster) is a cluster of one (``context.SINGLE_NODE``).
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from tether.controller import wire
from tether.controller.cluster import health
from tether.controller.cluster.apiserver_lb import COMMAND_PREFIX as LB_COMMAND
from tether.controller.cluster.apiserver_lb import BackendSync, local_lb
from tether.controller.cluster.context import (
    DRAIN_GATES,
    INIT_STEP,
    JOIN_GATE,
    JOIN_STEP,
    ClusterContext,
    Position,
    cluster_of,
    context_for,
    preview_context,
    with_port,
)
from tether.controller.cluster.drain import COMMAND_PREFIX as DRAIN_COMMAND
from tether.controller.cluster.drain import Drainer
from tether.controller.cluster.kubeconfig import KubeconfigRefused, sanitise
from tether.controller.cluster.material import KUBECONFIG, JoinMaterial
from tether.controller.cluster.scripts import label_task, refresh_task
from tether.controller.errors import FailedPrecondition, NotFound
from tether.controller.hub import Hub
from tether.controller.nodestate import failing_step, failure_text, node_state
from tether.controller.replicas import chain
from tether.controller.secretbox import SecretBox
from tether.controller.spec import LoadedSpec, load_document
from tether.controller.spec.model import ClusterSpec
from tether.controller.store import EnvironmentRecord, NodeRecord, Store
from tether.nodeagent import logs
from tether.nodeagent.model import ClusterView, Event, EventKind, Role, health_from_dict, now_ms
from tether.nodeagent.secrets import Redactor

log = logs.get_logger("tether.controller.cluster")

REFRESH_RETRY_S = 90.0
REFRESH_BACKOFF_S = 10.0
REFRESH_TASK = "task:refresh-join-material"
LABEL_RETRY_S = 60.0
LABEL_TASK_PREFIX = "task:label-"
# How long a control plane may hold the join slot without finishing: its kubeadm-join's own
# timeout (1200 s, components.cluster) and then some, so a machine that died mid-join frees it.
CP_JOIN_SLOT_S = 1500.0
CP_JOIN_SLOT = "cp-join"
ELSEWHERE = "elsewhere-"  # a refresh another replica asked for: no answer arrives here


@dataclass
class _Waiter:
    node: str
    step: str
    digest: str
    control_plane: bool
    newer_than: int = 0  # the cluster refused material issued at or before this time


@dataclass
class _EnvState:
    waiters: dict[str, _Waiter] = field(default_factory=dict)
    refresh_id: str = ""
    refresh_node: str = ""
    refresh_started: float = 0.0
    refresh_cert_key: bool = False
    released_ms: dict[str, int] = field(default_factory=dict)
    slot_timer: asyncio.TimerHandle | None = None  # re-checks a join slot that may expire


def _key(env: str, what: str) -> str:
    return f"cluster/{env}/{what}"


def _slot_record(**fields: str) -> bytes:
    """A join slot record: its holder (``node``; "" when free), unique (a chain follows it)."""
    record = {**fields, "since_ms": now_ms(), "nonce": secrets.token_hex(8)}
    return json.dumps(record, sort_keys=True).encode()


class Orchestrator:
    """The gate keeper for cluster environments (``tether.controller.gates.GateKeeper``)."""

    def __init__(
        self,
        store: Store,
        hub: Hub,
        box: SecretBox,
        redactor: Redactor,
        specs: Callable[[EnvironmentRecord], LoadedSpec] | None = None,
    ) -> None:
        self._store = store
        # Parsed documents come from the planner's cache (parsed off the event loop at apply
        # and at start-up); on their own (tests) they are parsed here.
        self._parsed = specs or (lambda env: load_document(env.document))
        self._hub = hub
        self._box = box
        self._redactor = redactor
        self._envs: dict[str, _EnvState] = {}
        self._material: dict[str, JoinMaterial] = {}
        self._specs: dict[tuple[str, int], ClusterSpec | None] = {}
        self._labelling: dict[str, float] = {}  # node -> when its label task was sent
        self._slot_lock = asyncio.Lock()  # the join slot's check-and-take
        self._tasks: set[asyncio.Task[None]] = set()
        # Several replicas: (env, node, cert_key) asks the replica holding ``node``'s stream for a refresh.
        self.refresh_elsewhere: Callable[[str, str, bool], None] | None = None
        self._drain = Drainer(
            hub,
            live=self._live,
            member=self._member,
            runner=self._kubectl_runner,
            others=self._other_cps,
            on_cordoned=self._cordoned,
        )
        # HA without an endpoint: every node's load balancer gets the control planes' addresses.
        self._lb = BackendSync(
            store,
            hub,
            enabled=lambda env: local_lb(self.cluster_spec(env)),
            member=self._member,
            init_node=self.init_node,
        )

    # -- spec and placement -------------------------------------------------------------------

    def cluster_spec(self, environment: str) -> ClusterSpec | None:
        env = self._store.get_environment(environment)
        if env is None:
            return None
        key = (env.name, env.generation)
        if key not in self._specs:
            self._specs = {k: v for k, v in self._specs.items() if k[0] != env.name}  # current only
            self._specs[key] = cluster_of(self._parsed(env).spec)
        return self._specs[key]

    def init_node(self, environment: str) -> str:
        raw = self._store.kv_get(_key(environment, "init-node"))
        return raw.decode() if raw else ""

    def _live(self, name: str) -> NodeRecord | None:
        """The node's record, unless it is unknown or revoked (checked before every hand-out)."""
        rec = self._store.get_node(name)
        return rec if rec is not None and not rec.revoked else None

    def _init_running(self, node: NodeRecord) -> bool:
        """The init node's kubeadm-init step (of its current plan) is running now."""
        return any(s.name == INIT_STEP and s.state == "running" for s in self._store.node_steps(node.name))

    def peek(self, node: NodeRecord) -> ClusterContext | None:
        """The node's cluster position without choosing an init node (previews, describe):
        while none is chosen, a control plane is shown as the one that would initialise."""
        return self._position(node, self.init_node(node.environment) or node.name)

    async def context(self, node: NodeRecord) -> ClusterContext | None:
        """The node's cluster position; the first control plane to ask becomes the init node."""
        if self.cluster_spec(node.environment) is None or node.role != Role.CONTROL_PLANE.value:
            return self._position(node, "")
        key = _key(node.environment, "init-node")
        chosen = (await self._store.kv_put_if_absent(key, node.name.encode())).decode()
        if chosen == node.name:
            log.info(
                "control plane chosen to initialise the cluster", environment=node.environment, node=node.name
            )
        return self._position(node, chosen)

    def preview(self, env: EnvironmentRecord, position: str) -> ClusterContext | None:
        """The context a node at ``position`` ("" for none) would get: the same as a real node's
        there (``ValueError`` for an unknown position or a spec without a kubeadm cluster)."""
        return preview_context(self._parsed(env).spec, position)

    def _position(self, node: NodeRecord, init_node: str) -> ClusterContext | None:
        spec = self.cluster_spec(node.environment)
        if spec is None:
            return None
        if node.role != Role.CONTROL_PLANE.value:
            position = Position.WORKER
        else:
            position = Position.INIT if init_node == node.name else Position.CONTROL_PLANE
        return context_for(spec, position)

    # -- material -----------------------------------------------------------------------------

    def material(self, environment: str) -> JoinMaterial | None:
        cached = self._material.get(environment)
        if cached is not None:
            return cached
        blob = self._store.kv_get(_key(environment, "material"))
        if blob is None:
            return None
        material = JoinMaterial.from_bytes(self._box.open(blob, _key(environment, "material")))
        self._redactor.add(*material.secrets())
        self._material[environment] = material
        return material

    async def _save_material(self, environment: str, material: JoinMaterial) -> None:
        key = _key(environment, "material")
        await self._store.kv_put(key, self._box.seal(material.to_bytes(), key))
        self._material[environment] = material
        self._redactor.add(*material.secrets())

    async def forget_material(self, environment: str) -> None:
        """Treat the stored material as expired (operators, tests): the next join refreshes it."""
        current = self.material(environment)
        if current is not None:
            await self._save_material(
                environment,
                JoinMaterial(
                    current.token,
                    current.ca_hash,
                    current.cert_key,
                    current.issued_ms,
                    0,
                    0,
                    current.endpoint,
                ),
            )

    # -- lifecycle of environments and nodes --------------------------------------------------

    async def forget_environment(self, environment: str) -> None:
        """The environment was deleted: its cluster (init choice, material, kubeconfig) goes with it."""
        for key in self._store.kv_keys(_key(environment, "")):
            await self._store.kv_delete(key)
        self._envs.pop(environment, None)
        self._material.pop(environment, None)
        self._lb.forget_environment(environment)
        self._specs = {k: v for k, v in self._specs.items() if k[0] != environment}

    async def forget_node(self, environment: str, node: str) -> None:
        """A machine enrolled afresh under this name (re-imaged): it has joined nothing yet."""
        for mark in (f"labelled/{node}", f"member/{node}"):
            key = _key(environment, mark)
            if self._store.kv_get(key) is not None:  # a name never seen before has neither: no write
                await self._store.kv_delete(key)
        self._labelling.pop(node, None)
        self._drain.forget(node)
        await self._free_join_slot(environment, node)
        self._lb.forget_node(environment, node)

    async def node_revoked(self, node: NodeRecord) -> None:
        """If the chosen init node is revoked before it initialised, the next control plane is chosen."""
        env = node.environment
        state = self._envs.get(env)
        if state is not None:
            state.waiters.pop(node.name, None)
        self._drain.forget(node.name)
        await self._free_join_slot(env, node.name)
        if self.init_node(env) == node.name and not self._joined(node.name):
            # What it may have sent before kubeadm init finished goes too: the next init node's
            # material must be taken, and nobody may join the revoked machine's cluster.
            for name in ("init-node", "init-material", "material", "kubeconfig"):
                await self._store.kv_delete(_key(env, name))
            self._material.pop(env, None)
            log.warning(
                "the chosen init node was revoked before kubeadm init; choosing again",
                environment=env,
                node=node.name,
            )
        self._lb.forget_node(env, node.name)  # a revoked control plane is on nobody's list

    # -- GateKeeper ---------------------------------------------------------------------------

    async def gate_requested(self, node: NodeRecord, step: str, digest: str, attempt: int = 1) -> None:
        if self._live(node.name) is None:
            log.warning("gate request from a revoked node ignored", node=node.name, step=step)
            return
        steps = {s.name: s for s in self._store.node_steps(node.name)}
        gated = step == JOIN_STEP or step in DRAIN_GATES
        if not gated or step not in steps or steps[step].digest != digest:
            log.warning("gate request for a step this node's plan does not gate", node=node.name, step=step)
            return
        if step in DRAIN_GATES:
            await self._drain.gate_requested(node, step, digest)
            return
        env = node.environment
        state = self._envs.setdefault(env, _EnvState())
        control_plane = node.role == Role.CONTROL_PLANE.value
        material = self.material(env)
        # A retry means the cluster refused what the node got: it needs material issued after that.
        # (After a controller restart the earlier release is unknown: anything current may be it.)
        newer_than = 0
        if attempt > 1:
            newer_than = state.released_ms.get(node.name, now_ms())
        stale = material is not None and material.issued_ms <= newer_than
        if material is not None and material.usable_for(control_plane, now_ms()) and not stale:
            if not control_plane or await self._take_join_slot(env, node.name, digest):
                self._release(node.name, step, digest, material, control_plane)
                return
            # Another control plane is joining: this one is released when that join ends.
            state.waiters[node.name] = _Waiter(node.name, step, digest, control_plane, newer_than)
            return
        state.waiters[node.name] = _Waiter(node.name, step, digest, control_plane, newer_than)
        if material is None:
            if self._joined(self.init_node(env)):
                # kubeadm init ran but its material never arrived (the agent died before the ack).
                log.warning(
                    "the cluster exists but its join material was lost; asking for fresh material",
                    environment=env,
                )
                self._request_refresh(env, cert_key=control_plane, force=False)
            else:
                log.info("node waits at its gate for kubeadm init", node=node.name, environment=env)
            return
        log.info(
            "join material expired or refused; asking a control plane for fresh material",
            node=node.name,
            environment=env,
            attempt=attempt,
        )
        self._request_refresh(env, cert_key=control_plane, force=stale)

    async def secrets_received(
        self,
        node: NodeRecord,
        step: str,
        values: Mapping[str, str],
        command_id: str,
        outputs: Mapping[str, str] | None = None,
    ) -> bool:
        """Join material from the init step (once, while it runs) or from the refresh task sent to
        this very node. Refused material is still acknowledged, so the agent stops resending it."""
        if command_id.startswith((DRAIN_COMMAND, LB_COMMAND)) and not values:
            return True  # a kubectl or backends task's (empty) answer: its events are what counts
        env = node.environment
        state = self._envs.setdefault(env, _EnvState())
        source = self._source(node, step, command_id, state)
        if not source:
            return True
        try:
            material = JoinMaterial.from_outputs({**(outputs or {}), **values}, now_ms(), self.material(env))
            kubeconfig, stripped = sanitise(values[KUBECONFIG]) if values.get(KUBECONFIG) else ("", [])
        except (ValueError, KubeconfigRefused) as exc:
            log.error("join material refused", node=node.name, step=step, error=str(exc))
            return True  # acknowledged, so the agent stops resending it; the waiters ask again
        if source == "init" and not await self._first_init(node):
            log.warning("init material already accepted once; dropped", node=node.name, step=step)
            return True
        await self._save_material(env, material)
        if kubeconfig:
            if stripped:
                log.warning("unsafe kubeconfig settings removed", node=node.name, removed=stripped)
            key = _key(env, "kubeconfig")
            await self._store.kv_put(key, self._box.seal(kubeconfig.encode(), key))
        if source == "refresh":
            state.refresh_id = state.refresh_node = ""
        log.info("join material stored", environment=env, source=source, material=material)
        await self._release_waiters(env)
        return True

    def _source(self, node: NodeRecord, step: str, command_id: str, state: _EnvState) -> str:
        """ "init", "refresh", or "" (with a log line) when this material was not asked for."""
        if self._live(node.name) is None:
            log.warning("secret outputs from a revoked node; dropped", node=node.name, step=step)
            return ""
        if command_id:
            asked = bool(state.refresh_id) and hmac.compare_digest(
                command_id.encode(), state.refresh_id.encode()
            )
            if asked and node.name == state.refresh_node:
                return "refresh"
        elif step == INIT_STEP and node.name == self.init_node(node.environment):
            if self._init_running(node):
                return "init"
            log.warning("init material while kubeadm-init is not running; dropped", node=node.name)
            return ""
        log.warning("secret outputs that were not asked for; dropped", node=node.name, step=step)
        return ""

    async def _first_init(self, node: NodeRecord) -> bool:
        """Mark the cluster's init material as accepted; False when it already was."""
        steps = {s.name: s for s in self._store.node_steps(node.name)}
        # A fresh nonce: a resend of the same material (its ack was lost) does not match the mark.
        mark = f"{node.name}:{steps[INIT_STEP].digest}:{secrets.token_hex(8)}".encode()
        return await self._store.kv_put_if_absent(_key(node.environment, "init-material"), mark) == mark

    def _release(
        self, node: str, step: str, digest: str, material: JoinMaterial, control_plane: bool
    ) -> None:
        if self._live(node) is None:
            log.warning("no release for a revoked node", node=node)
            return
        secret_env, env = material.release_env(control_plane)
        if self._hub.send(
            node,
            wire.agent.ControllerMessage(
                release=wire.agent.Release(step=step, digest=digest, secret_env=secret_env, env=env)
            ),
        ):
            node_rec = self._store.get_node(node)
            if node_rec is not None:
                self._envs.setdefault(node_rec.environment, _EnvState()).released_ms[node] = now_ms()
            log.info("gate opened", node=node, gate=JOIN_GATE, control_plane=control_plane)

    async def _release_waiters(self, env: str) -> None:
        state = self._envs.setdefault(env, _EnvState())
        material = self.material(env)
        if material is None:
            return
        need_refresh = need_cert_key = False
        for name, waiter in list(state.waiters.items()):
            if material.usable_for(waiter.control_plane, now_ms()) and material.issued_ms > waiter.newer_than:
                if waiter.control_plane and not await self._take_join_slot(env, name, waiter.digest):
                    continue  # another control plane is joining: this one waits its turn
                if state.waiters.get(name) is not waiter:
                    continue  # revoked or asked again meanwhile
                del state.waiters[name]
                self._release(name, waiter.step, waiter.digest, material, waiter.control_plane)
            else:
                need_refresh = True
                need_cert_key = need_cert_key or waiter.control_plane
        if need_refresh:
            self._request_refresh(env, cert_key=need_cert_key, force=False)

    # -- several replicas ---------------------------------------------------------------------

    async def remote_kv(self, key: str) -> None:
        """Another replica changed ``key``: join material it stored, or a join slot it freed, may
        let this replica's waiters go (their gate requests came here)."""
        parts = key.split("/")
        if len(parts) != 3 or parts[0] != "cluster" or parts[2] not in ("material", CP_JOIN_SLOT):
            return
        env, what = parts[1], parts[2]
        state = self._envs.get(env)
        if what == "material":
            self._material.pop(env, None)
            if state is not None and state.refresh_id.startswith(ELSEWHERE):
                state.refresh_id = state.refresh_node = ""
        if state is not None and state.waiters:
            await self._release_waiters(env)

    def awaits_events_of(self, node: str) -> bool:
        """A kubectl task this replica sent waits for ``node``'s events (it may stream elsewhere)."""
        return self._drain.waits_on(node)

    def remote_events(self, node: NodeRecord, events: Sequence[Event]) -> None:
        """Events ``node`` sent to another replica: the answers of kubectl tasks sent from here."""
        self._drain.on_events(node, events)

    # -- control planes join one at a time ----------------------------------------------------

    def join_slot_holder(self, env: str) -> str:
        """The control plane that holds the environment's join slot now ("" when it is free): it
        was released and its kubeadm-join has not ended (succeeded, or failed its last attempt)."""
        return self._holder_of(env, self._store.kv_get(_key(env, CP_JOIN_SLOT)))

    def _holder_of(self, env: str, raw: bytes | None) -> str:
        """``join_slot_holder`` of the slot record ``raw``."""
        if raw is None:
            return ""
        slot: dict[str, Any] = json.loads(raw)
        holder, since = str(slot.get("node", "")), int(slot.get("since_ms", 0))
        rec = self._live(holder)
        if rec is None or rec.environment != env:
            return ""
        join = next((s for s in self._store.node_steps(holder) if s.name == JOIN_STEP), None)
        if join is None:
            return ""  # a plan without a join step now
        ended = join.state in ("succeeded", "failed", "skipped") and join.updated_ms >= since
        if join.digest == slot.get("digest") and ended:
            return ""  # it ended (the event may have come before a controller restart)
        # (A new plan's join step: the old one may still run; the holder asks again with it.)
        if now_ms() - since > CP_JOIN_SLOT_S * 1000:
            log.warning("a control plane held the join slot too long; the next one may join", node=holder)
            return ""
        return holder

    async def _take_join_slot(self, env: str, node: str, digest: str) -> bool:
        """Take (or keep) the join slot for control plane ``node``; False while another holds it.
        Replicas sharing the store may each see the slot free: one takes it (``replicas.chain``)."""
        async with self._slot_lock:
            slot = _key(env, CP_JOIN_SLOT)
            taken, last = await chain.append(
                self._store,
                slot,
                self._store.kv_get(slot),
                _slot_record(node=node, digest=digest),
                lambda raw: self._holder_of(env, raw) in ("", node),
            )
            if taken:
                await self._store.kv_put(slot, last or b"")
                return True
            holder = self._holder_of(env, last) or "another control plane"
            log.info("control plane waits while another one joins", node=node, joining=holder)
            self._recheck_slot_later(env)
            return False

    async def _free_join_slot(self, env: str, node: str) -> None:
        """``node``'s join ended (or it left): the next waiting control plane may join."""
        async with self._slot_lock:
            slot = _key(env, CP_JOIN_SLOT)
            freed, last = await chain.append(
                self._store,
                slot,
                self._store.kv_get(slot),
                _slot_record(node="", freed=node),  # not a delete: the next take follows this record
                lambda raw: raw is not None and json.loads(raw).get("node") == node,
            )
            if not freed:
                return
            await self._store.kv_put(slot, last or b"")
        log.info("control plane join ended; the join slot is free", environment=env, node=node)
        await self._release_waiters(env)

    def _recheck_slot_later(self, env: str) -> None:
        """A holder that never reports back (its machine died mid-join) frees the slot by time."""
        state = self._envs.setdefault(env, _EnvState())
        if state.slot_timer is not None:
            return

        def fire() -> None:
            state.slot_timer = None
            task = asyncio.ensure_future(self._release_waiters(env))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        state.slot_timer = asyncio.get_running_loop().call_later(CP_JOIN_SLOT_S / 10, fire)

    def _request_refresh(self, env: str, *, cert_key: bool, force: bool) -> None:
        state = self._envs.setdefault(env, _EnvState())
        in_flight = state.refresh_id and time.monotonic() - state.refresh_started < REFRESH_RETRY_S
        if in_flight and not force and (state.refresh_cert_key or not cert_key):
            return
        target = self._refresher(env)
        if target is None:
            log.warning(
                "no control plane is connected to refresh the join material; waiting", environment=env
            )
            return
        if self.refresh_elsewhere is not None and self._hub.session(target) is None:
            # Its stream is on another replica: that one asks, and the answer (stored material)
            # comes back here as a change of the store (``remote_kv``).
            state.refresh_id, state.refresh_node = f"{ELSEWHERE}{secrets.token_hex(16)}", target
            state.refresh_started, state.refresh_cert_key = time.monotonic(), cert_key
            self.refresh_elsewhere(env, target, cert_key)
            log.info("join material refresh asked of another replica", environment=env, node=target)
            return
        self._send_refresh(env, target, cert_key)

    def refresh_here(self, env: str, node: str, cert_key: bool) -> bool:
        """Another replica asks ``node``, whose stream this one holds, for fresh join material."""
        if self._hub.session(node) is None or self._live(node) is None:
            return False
        self._send_refresh(env, node, cert_key)
        return True

    def _send_refresh(self, env: str, target: str, cert_key: bool) -> None:
        state = self._envs.setdefault(env, _EnvState())
        command_id = f"refresh-{secrets.token_hex(16)}"  # unguessable: only this answer is accepted
        state.refresh_id, state.refresh_node = command_id, target
        state.refresh_started, state.refresh_cert_key = time.monotonic(), cert_key
        step = refresh_task(upload_certs=cert_key)
        self._hub.send(
            target,
            wire.agent.ControllerMessage(
                command=wire.agent.Command(id=command_id, task=wire.agent.RunTask(step=wire.step_to_pb(step)))
            ),
        )
        log.info("join material refresh requested", environment=env, node=target, certificate_key=cert_key)

    def _refresh_failed(self, node: NodeRecord) -> None:
        """A refresh task failed on ``node``: try again shortly (on any control plane) for the waiters."""
        env = node.environment
        state = self._envs.setdefault(env, _EnvState())
        if state.refresh_node != node.name:
            return
        state.refresh_id = state.refresh_node = ""
        log.warning("join material refresh failed; retrying", environment=env, node=node.name)
        if state.waiters:
            cert_key = any(w.control_plane for w in state.waiters.values())
            asyncio.get_running_loop().call_later(
                REFRESH_BACKOFF_S, lambda: self._request_refresh(env, cert_key=cert_key, force=False)
            )

    def _refresher(self, env: str) -> str | None:
        """A connected control plane that has joined the cluster (the init node first)."""
        init = self.init_node(env)
        others = sorted(n.name for n in self._store.list_nodes(env) if n.role == Role.CONTROL_PLANE.value)
        candidates = [init, *(n for n in others if n != init)]
        for name in candidates:
            if name and self._hub.connected(name) and self._joined(name) and self._live(name):
                return name
        return None

    def _joined(self, node: str) -> bool:
        return any(
            s.name in (INIT_STEP, JOIN_STEP) and s.state in ("succeeded", "skipped")
            for s in self._store.node_steps(node)
        )

    def _member(self, node: str) -> bool:
        """The node joined its cluster: its init or join step succeeded, in this plan or an earlier
        one (a later plan may change that step, which does not take the node out of the cluster)."""
        rec = self._store.get_node(node)
        if rec is None:
            return False
        return self._joined(node) or self._store.kv_get(_key(rec.environment, f"member/{node}")) is not None

    def member(self, node: str) -> bool:
        """Whether ``node`` has joined its kubeadm cluster (what a reset has to undo)."""
        return self._member(node)

    def _other_cps(self, env: str, node: str) -> bool:
        """The cluster has joined, unrevoked control planes besides ``node`` (connected or not)."""
        return any(
            n.name != node and n.role == Role.CONTROL_PLANE.value and not n.revoked and self._member(n.name)
            for n in self._store.list_nodes(env)
        )

    def _kubectl_runner(self, env: str, node: str) -> str | None:
        """A connected, joined control plane to run kubectl for ``node``: another one than the
        node itself when there is one (the node may be going down), the init node first."""
        init = self.init_node(env)
        others = sorted(n.name for n in self._store.list_nodes(env) if n.role == Role.CONTROL_PLANE.value)
        ready = [
            name
            for name in (init, *(n for n in others if n != init))
            if name and self._hub.connected(name) and self._member(name) and self._live(name)
        ]
        return next((n for n in ready if n != node), node if node in ready else None)

    # -- events and connections ---------------------------------------------------------------

    async def on_connect(self, node: NodeRecord) -> None:
        """A node (re)connected: a control plane can now do pending refreshes and labelling."""
        if self._live(node.name) is not None:
            self._lb.on_connect(node)  # first: the init node may have been chosen just now
        if self.cluster_spec(node.environment) is None or node.role != Role.CONTROL_PLANE.value:
            return
        if self._live(node.name) is None:
            return
        state = self._envs.get(node.environment)
        if state is not None and state.waiters and self.material(node.environment) is not None:
            await self._release_waiters(node.environment)
        self._label_pending(node.environment)
        self._drain.on_connect(node.environment)

    async def on_events(self, node: NodeRecord, events: Sequence[Event]) -> None:
        if self.cluster_spec(node.environment) is None:
            return
        self._drain.on_events(node, events)
        self._lb.on_events(node, events)
        for e in events:
            ended = e.kind is EventKind.SUCCEEDED or (e.kind is EventKind.FAILED and not e.will_retry)
            if e.step == JOIN_STEP and ended and node.role == Role.CONTROL_PLANE.value:
                await self._free_join_slot(node.environment, node.name)
            if e.kind is EventKind.SUCCEEDED and e.step in (INIT_STEP, JOIN_STEP):
                await self._store.kv_put(_key(node.environment, f"member/{node.name}"), b"1")
                self._label_pending(node.environment)
            elif e.step == REFRESH_TASK and e.kind is EventKind.FAILED:
                self._refresh_failed(node)
            elif e.step.startswith(LABEL_TASK_PREFIX) and e.kind is EventKind.SUCCEEDED:
                target = e.step.removeprefix(LABEL_TASK_PREFIX)
                self._labelling.pop(target, None)
                await self._store.kv_put(
                    _key(node.environment, f"labelled/{target}"),
                    self._labels_digest(node.environment, target).encode(),
                )
                log.info("node labelled and tainted", node=target)

    def _labels_digest(self, env: str, node: str) -> str:
        spec = self.cluster_spec(env)
        rec = self._store.get_node(node)
        if spec is None or rec is None:
            return ""
        pool = spec.control_plane if rec.role == Role.CONTROL_PLANE.value else spec.workers
        return repr((rec.role, sorted(pool.labels.items()), spec.control_plane.dedicated))

    def _label_pending(self, env: str) -> None:
        spec = self.cluster_spec(env)
        if spec is None:
            return
        target_cp = self._refresher(env)
        if target_cp is None:
            return
        for n in self._store.list_nodes(env):
            if n.revoked or not self._joined(n.name):
                continue
            done = self._store.kv_get(_key(env, f"labelled/{n.name}"))
            if done is not None and done.decode() == self._labels_digest(env, n.name):
                continue
            if time.monotonic() - self._labelling.get(n.name, -LABEL_RETRY_S) < LABEL_RETRY_S:
                continue  # a label task for it is in flight
            self._labelling[n.name] = time.monotonic()
            control_plane = n.role == Role.CONTROL_PLANE.value
            pool = spec.control_plane if control_plane else spec.workers
            step = label_task(
                n.name,
                role=n.role,
                labels=dict(pool.labels),
                untaint=control_plane and not spec.control_plane.dedicated,
            )
            self._hub.send(
                target_cp,
                wire.agent.ControllerMessage(
                    command=wire.agent.Command(
                        id=f"label-{n.name}-{now_ms()}", task=wire.agent.RunTask(step=wire.step_to_pb(step))
                    )
                ),
            )

    # -- hardware.onDrift: cordon --------------------------------------------------------------

    async def cordon(self, node: str, environment: str, why: str) -> str:
        """A node whose GPUs drifted (``why``: the conditions raised): a joined control plane runs
        ``kubectl cordon`` on it (never uncordoned automatically). Says what was done."""
        if self.cluster_spec(environment) is None:
            return "no kubeadm cluster (spec.cluster): nothing to cordon"
        if not self._member(node):
            return f"{node} has not joined the cluster: nothing to cordon"
        log.warning("cordoning a node whose GPUs drifted (hardware.onDrift: cordon)", node=node, why=why)
        return self._drain.cordon(node, environment)

    def _cordoned(self, node: str, ok: bool, message: str) -> None:
        """The cordon task answered: the node's event stream says so."""
        line = f"hardware.onDrift cordon: {message}" if ok else f"hardware.onDrift cordon failed: {message}"
        self._hub.send(node, wire.agent.ControllerMessage(notice=wire.agent.Notice(message=line)))

    # -- health and kubeconfig ----------------------------------------------------------------

    def health(self, environment: str) -> health.Report:
        spec = self.cluster_spec(environment)
        if spec is None:
            raise FailedPrecondition(
                f"environment {environment!r} has no kubeadm cluster (Kubernetes is not installed by kubeadm)"
            )
        members: list[health.Member] = []
        views: list[ClusterView] = []
        for n in self._store.list_nodes(environment):
            if n.revoked:
                continue
            steps = self._store.node_steps(n.name)
            session = self._hub.session(n.name)
            reported = (
                session.health
                if session and session.health
                else (health_from_dict(n.health) if n.health else None)
            )
            services = dict(reported.services) if reported else {}
            if reported is not None and reported.cluster is not None and n.role == Role.CONTROL_PLANE.value:
                views.append(reported.cluster)
            failed = failing_step(steps)
            members.append(
                health.Member(
                    name=n.name,
                    role=n.role,
                    agent_state=node_state(n, steps, session is not None).value,
                    joined=self._joined(n.name),
                    kubelet=services.get("kubelet", ""),
                    runtime=next(
                        (services[r] for r in ("containerd", "crio", "docker") if r in services), ""
                    ),
                    failure=f"{failed.name}: {failure_text(failed)}" if failed else "",
                    conditions=tuple(
                        health.NodeCondition(
                            str(kind),
                            str(c.get("reason", "")),
                            str(c.get("message", "")),
                            int(c.get("since_ms", 0)),
                        )
                        for kind, c in sorted(n.hardware.get("conditions", {}).items())
                    ),
                )
            )
        view = max(views, key=lambda v: v.time_ms) if views else None
        return health.assess(
            environment,
            members,
            view,
            desired_control_planes=spec.control_plane.count,
            desired_workers=spec.workers.count,
            endpoint=self._endpoint(environment),
            init_node=self.init_node(environment),
        )

    def kubeconfig(self, environment: str, server: str = "") -> str:
        key = _key(environment, "kubeconfig")
        blob = self._store.kv_get(key)
        if blob is None:
            raise NotFound(
                f"environment {environment!r} has no kubeconfig yet (kubeadm init has not finished)"
            )
        # Cleaned again on the way out: one stored by an older controller was kept as sent.
        clean, _ = sanitise(self._box.open(blob, key).decode())
        doc = yaml.safe_load(base64.b64decode(clean))
        address = (
            server
            or self._remote_server(environment)
            or self._lb.reachable(environment, self._endpoint(environment))
        )
        if not address:
            raise FailedPrecondition("no API endpoint is known; pass --server HOST:PORT")
        url = address if address.startswith("https://") else f"https://{with_port(address)}"
        for cluster in doc.get("clusters", []):
            cluster.setdefault("cluster", {})["server"] = url
        return str(yaml.safe_dump(doc, sort_keys=False))

    def _endpoint(self, environment: str) -> str:
        material = self.material(environment)
        return material.endpoint if material is not None else ""

    def _remote_server(self, environment: str) -> str:
        """kubernetes.remoteAccess with K8sEndpointHost: the exported kubeconfig names that host
        (holodeck rewrites its server to the host it reached the node by)."""
        env = self._store.get_environment(environment)
        if env is None:
            return ""
        k8s = self._parsed(env).spec.kubernetes
        return with_port(k8s.endpoint_host) if k8s.remote_access and k8s.endpoint_host else ""
