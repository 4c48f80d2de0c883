"""High availability without a load balancer: every node's own, kept current by the controller.

holodeck's HA creates an AWS NLB; tether adopts machines that exist, so when
``cluster.highAvailability.enabled`` names no ``endpoint`` tether does what k0s (node-local load
balancing) and kubespray (``loadbalancer_apiserver_localhost``) do:

* every node of the cluster runs ``tether-apiserver-lb.service`` (``tether.nodeagent.apiserver_lb``,
  a standalone stdlib TCP proxy installed by the ``apiserver-lb`` step before kubeadm init/join:
  ``tether.controller.render.components.apiserver_lb``) on 127.0.0.1:7443, in front of every
  control plane's API server, with health checks (a powered-off control plane is skipped within
  seconds and the connections through it are closed, so clients reconnect through another);
* kubeadm's ``controlPlaneEndpoint`` is ``apiserver.tether.internal:7443`` on every node (the proxy
  keeps that name at 127.0.0.1 in /etc/hosts; kubeadm puts it in the API server certificate), so
  kubelets, admin.conf, kube-proxy and joins all go through the node's own load balancer;
* the controller keeps each node's list of API servers (``/etc/tether/apiserver-backends``) current:
  the list is a pure function of the cluster's state (``backends``): the init node's address from
  the moment it is chosen (the first joiners go through it), then every control plane that joined,
  minus revoked and forgotten (reset, deleted) ones. Whenever it changes, and whenever a node
  connects, every connected node that does not have it yet gets a small task writing it atomically
  (``backends_task``). A control plane's own step also lists its own API server in
  ``LOCAL_LB_SELF``, so kubeadm init reaches itself before any list arrives.

Health (up or down) is the proxy's business, membership the controller's: a control plane that is
powered off stays on the list and is skipped until it answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from tether.controller import wire
from tether.controller.cluster.context import (
    API_PORT,
    INIT_STEP,
    JOIN_STEP,
    LOCAL_LB_BACKENDS,
    LOCAL_LB_ENDPOINT,
)
from tether.controller.hub import Hub
from tether.controller.spec.model import ClusterSpec
from tether.controller.store import NodeRecord, Store
from tether.nodeagent import logs
from tether.nodeagent.model import Event, EventKind, Role, Step

log = logs.get_logger("tether.controller.cluster.apiserver_lb")

BACKENDS_FILE = LOCAL_LB_BACKENDS  # the controller's list (this task)
TASK = "apiserver-backends"
COMMAND_PREFIX = "apiserver-backends-"
RETRY_S = 15.0  # a task that failed is sent again after this long

_SCRIPT = """#!/usr/bin/env bash
# tether cluster task: the API servers behind this node's local load balancer
# (tether-apiserver-lb.service reads the file again when it changes).
set -euo pipefail
file=FILE
mkdir -p "${file%/*}"
tmp=$(mktemp "$file.XXXXXX")
printf '%s\\n' "# written by the tether controller: the cluster's control planes" >"$tmp"
tr ' ' '\\n' <<<"$BACKENDS" >>"$tmp"
chmod 0644 "$tmp"
mv -f "$tmp" "$file"
echo "API servers behind the local load balancer: $BACKENDS"
"""


def local_lb(spec: ClusterSpec | None) -> bool:
    """The cluster runs a load balancer on every node: HA enabled, no endpoint given."""
    return spec is not None and spec.high_availability.enabled and not spec.high_availability.endpoint


def api_address(node: NodeRecord) -> str:
    """``ip:6443`` of the node's API server: the address it reaches the controller from (what
    kubeadm advertises, ``TETHER_NODE_IP``); "" when its facts name no usable address."""
    addresses = node.facts.get("addresses") or ()
    if not addresses:
        return ""
    try:
        ip = ipaddress.ip_address(str(addresses[0]))
    except ValueError:
        return ""
    return f"[{ip}]:{API_PORT}" if ip.version == 6 else f"{ip}:{API_PORT}"


def backend_nodes(
    nodes: Iterable[NodeRecord], *, init_node: str, member: Callable[[str], bool]
) -> list[tuple[str, str]]:
    """(name, ``ip:port``) of the control planes behind every node's load balancer: the init node
    (from the moment it is chosen, before it has initialised: the first joiners come through it)
    and every control plane that joined; never a revoked one, nor one without an address. Init
    node first, then by name; one entry per address."""
    chosen: list[tuple[str, str]] = []
    for n in sorted(nodes, key=lambda n: (n.name != init_node, n.name)):
        if n.revoked or n.role != Role.CONTROL_PLANE.value:
            continue
        if n.name == init_node or member(n.name):
            address = api_address(n)
            if address and all(address != a for _, a in chosen):
                chosen.append((n.name, address))
    return chosen


def backends(
    nodes: Iterable[NodeRecord], *, init_node: str, member: Callable[[str], bool]
) -> tuple[str, ...]:
    """The addresses of ``backend_nodes``: what each node's ``BACKENDS_FILE`` says."""
    return tuple(a for _, a in backend_nodes(nodes, init_node=init_node, member=member))


def backends_task(addresses: Sequence[str]) -> Step:
    """The task writing ``addresses`` (``host:port``) to ``BACKENDS_FILE``, atomically."""
    return Step(
        name=TASK,
        script=_SCRIPT.replace("FILE", BACKENDS_FILE),
        timeout_seconds=60,
        component="kubeadm",
        env={"BACKENDS": " ".join(addresses)},
    ).sealed()


@dataclass
class BackendSync:
    """Pushes ``backends`` to the nodes of every cluster that runs node-local load balancers.

    ``enabled(env)``: the environment's cluster is one (``local_lb``); ``member(node)``: the node
    joined; ``init_node(env)``: the control plane chosen to initialise ("" for none yet).
    What each node was sent lives in memory: after a controller restart every node gets the list
    again when it reconnects."""

    store: Store
    hub: Hub
    enabled: Callable[[str], bool]
    member: Callable[[str], bool]
    init_node: Callable[[str], str]
    _sent: dict[str, tuple[str, ...]] = field(default_factory=dict)
    _retry: dict[str, asyncio.TimerHandle] = field(default_factory=dict)

    def current(self, env: str, *, excluding: str = "") -> tuple[str, ...]:
        nodes = [n for n in self.store.list_nodes(env) if n.name != excluding]
        return backends(nodes, init_node=self.init_node(env), member=self.member)

    def sync(self, env: str, *, excluding: str = "") -> None:
        """Send the current list to every connected node of ``env`` that does not have it."""
        if not self.enabled(env):
            return
        wanted = self.current(env, excluding=excluding)
        if not wanted:
            return  # nothing to send yet (no init node); a node's own file covers kubeadm init
        for n in self.store.list_nodes(env):
            if n.name == excluding or n.revoked or self._sent.get(n.name) == wanted:
                continue
            if not self.hub.connected(n.name):
                self._sent.pop(n.name, None)
                continue
            step = backends_task(wanted)
            sent = self.hub.send(
                n.name,
                wire.agent.ControllerMessage(
                    command=wire.agent.Command(
                        id=f"{COMMAND_PREFIX}{secrets.token_hex(8)}",
                        task=wire.agent.RunTask(step=wire.step_to_pb(step)),
                    )
                ),
            )
            if sent:
                self._sent[n.name] = wanted
                log.info("API server list sent to the node's load balancer", node=n.name, backends=wanted)

    def reachable(self, env: str, endpoint: str) -> str:
        """``endpoint``, unless it is the node-local name (127.0.0.1 on the nodes only): then a
        control plane's own API server, which its certificate names (one whose agent is connected
        first, the init node first among those)."""
        if endpoint != LOCAL_LB_ENDPOINT:
            return endpoint
        nodes = backend_nodes(self.store.list_nodes(env), init_node=self.init_node(env), member=self.member)
        connected = [a for name, a in nodes if self.hub.connected(name)]
        return next(iter(connected + [a for _, a in nodes]), "")

    def on_connect(self, node: NodeRecord) -> None:
        """A node (re)connected: it gets the list again (its task may have been lost), and a control
        plane chosen to initialise just now puts itself on everybody's list."""
        self._sent.pop(node.name, None)
        self.sync(node.environment)

    def on_events(self, node: NodeRecord, events: Sequence[Event]) -> None:
        env = node.environment
        if any(e.step in (INIT_STEP, JOIN_STEP) and e.kind is EventKind.SUCCEEDED for e in events):
            self.sync(env)  # a control plane joined (a worker's join changes nothing: cheap)
        if any(e.step == f"task:{TASK}" and e.kind is EventKind.FAILED for e in events):
            self._sent.pop(node.name, None)
            log.warning("the node could not write its API server list; sending it again", node=node.name)
            self._later(env)

    def forget_node(self, env: str, node: str) -> None:
        """``node`` leaves (reset, deleted, or a fresh machine under its name): off every list."""
        self._sent.pop(node, None)
        self.sync(env, excluding=node)

    def forget_environment(self, env: str) -> None:
        names = {n.name for n in self.store.list_nodes(env)}
        self._sent = {k: v for k, v in self._sent.items() if k not in names}
        timer = self._retry.pop(env, None)
        if timer is not None:
            timer.cancel()

    def _later(self, env: str) -> None:
        if env in self._retry:
            return

        def again() -> None:
            self._retry.pop(env, None)
            self.sync(env)

        with contextlib.suppress(RuntimeError):  # no loop (a synchronous caller): the next trigger
            self._retry[env] = asyncio.get_running_loop().call_later(RETRY_S, again)
