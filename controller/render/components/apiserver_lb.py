"""The node-local API server load balancer (``cluster.highAvailability`` enabled, no ``endpoint``).

One step, ``apiserver-lb``, before kubeadm init/join on every node of such a cluster: it writes the
standalone proxy (``tether.nodeagent.apiserver_lb``, carried in the step's environment, so the
step's digest changes with it) and ``tether-apiserver-lb.service``, lists a control plane's own API
server in ``LOCAL_LB_SELF``, starts the unit and waits until ``apiserver.tether.internal`` resolves to
127.0.0.1 and the proxy listens. The list of control planes comes from the controller
(``tether.controller.cluster.apiserver_lb``), not from the plan: it changes as they join and leave,
and a plan that changed with it would run its steps again.
"""

from __future__ import annotations

from importlib import resources

from tether.controller.cluster.context import (
    API_PORT,
    LOCAL_LB_BACKENDS,
    LOCAL_LB_ENDPOINT,
    LOCAL_LB_NAME,
    LOCAL_LB_PORT,
    LOCAL_LB_SELF,
)
from tether.controller.render.shell import q
from tether.controller.render.steps import RenderInput, make_step
from tether.nodeagent.model import Step

STEP = "apiserver-lb"
LISTEN_HOST = "127.0.0.1"
# Read once, at import (rendering does no I/O): the proxy the step installs.
PROXY = resources.files("tether.nodeagent").joinpath("apiserver_lb.py").read_text()


def steps(inp: RenderInput) -> list[Step]:
    cluster = inp.node.cluster
    if cluster is None or not cluster.local_lb:
        return []
    listen = f"{LISTEN_HOST}:{LOCAL_LB_PORT}"
    return [
        make_step(
            inp,
            name=STEP,
            component="kubernetes",
            phase="kubernetes",
            template="apiserver_lb.j2",
            timeout=300,
            requested={"listen": listen, "endpoint": LOCAL_LB_ENDPOINT, "backends": "the controller's list"},
            description=(
                "a TCP load balancer on this node in front of every control plane's API server "
                "(highAvailability without an endpoint); kubeadm's endpoint is this node's own"
            ),
            env={"TETHER_APISERVER_LB": PROXY},
            context={
                "control_plane": cluster.control_plane,
                "listen": q(listen),
                "listen_host": q(LISTEN_HOST),
                "listen_port": q(str(LOCAL_LB_PORT)),
                "name": q(LOCAL_LB_NAME),
                "endpoint": q(LOCAL_LB_ENDPOINT),
                "api_port": q(str(API_PORT)),
                "backends_file": q(LOCAL_LB_BACKENDS),
                "self_file": q(LOCAL_LB_SELF),
            },
        )
    ]
