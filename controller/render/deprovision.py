"""The plan of a reset (``tetherctl node reset``): leave the cluster, then the agent removes itself.

A node of a kubeadm cluster runs, in order (the anchors: ``k0sctl reset``, ``kubeadm reset``):

1. ``drain``: a gated step; the controller opens it once a control plane ran ``kubectl cordon`` and
   ``drain`` for the node (``tether.controller.cluster.drain``; at once for a node that never joined);
2. ``kubeadm-reset``: ``kubeadm reset -f`` (it stops the kubelet and, on a control plane, removes
   the node's etcd member), then the CNI configuration, the kubeconfig tether copied to root and
   the node's own API server load balancer (``tether-apiserver-lb``, HA without an endpoint);
3. ``delete-node``: a gated step; another control plane runs ``kubectl delete node`` (after the
   reset: a kubelet still running would register the node again). The cluster's last control
   plane has nobody to ask, and nothing left to delete from.

A node of any other environment has no step. Either way the plan says ``deprovision``: once every
step succeeded, the agent reports the reset done and removes its unit, config and state
(``tether.nodeagent.deprovision``). Pure: no I/O, no clock.
"""

from __future__ import annotations

from tether.controller.cluster.context import DELETE_NODE_GATE, DELETE_NODE_STEP, DRAIN_GATE, DRAIN_STEP
from tether.nodeagent.model import Plan, Step

PHASE = "reset"
KUBEADM_RESET_STEP = "kubeadm-reset"
KUBEADM_RESET_TIMEOUT_S = 600

_HEADER = (
    "#!/usr/bin/env bash\n"
    "# tether step {name}: component reset, phase reset (tetherctl node reset).\n"
    "# Rendered by the tether controller; the agent runs it as root and streams its output.\n"
    "set -euo pipefail\n"
)

# The controller's answer comes with the release: "done", or why kubectl could not do it.
_GATED = """# The controller opens this gate once a control plane ran `kubectl WHAT` for this node (at once
# when there is nothing to do); the result comes with the release.
case ${TETHER_GATE_RESULT:-} in
  done)
    printf '%s\\n' "${TETHER_GATE_MESSAGE:-}"
    ;;
  *)
    printf 'ERROR: %s\\n' "${TETHER_GATE_MESSAGE:-the controller opened the gate without a result}" >&2
    exit 1
    ;;
esac
"""

_KUBEADM_RESET = """if ! command -v kubeadm >/dev/null 2>&1; then
  echo "kubeadm is not installed: this node never joined a cluster; nothing to reset"
  exit 0
fi
# Stops the kubelet, removes /etc/kubernetes and /var/lib/kubelet (and the etcd member of a
# control plane). Like kubeadm reset itself, this leaves iptables/IPVS rules and the installed
# packages alone.
kubeadm reset -f
# kubeadm reset leaves these: the CNI configuration, and the kubeconfig tether copied for root.
rm -rf /etc/cni/net.d
rm -f /root/.kube/config
echo "kubeadm reset done"
# The node's own API server load balancer (highAvailability without an endpoint), if it has one:
# after kubeadm reset, which may still reach the cluster through it.
if [ -f /etc/systemd/system/tether-apiserver-lb.service ]; then
  systemctl disable --now tether-apiserver-lb.service || true
  rm -f /etc/systemd/system/tether-apiserver-lb.service /usr/local/lib/tether/apiserver-lb.py \
    /etc/tether/apiserver-backends /etc/tether/apiserver-backends.local
  rmdir /usr/local/lib/tether 2>/dev/null || true
  systemctl daemon-reload
  if grep -q '# tether-apiserver-lb$' /etc/hosts; then
    hosts=$(grep -v '# tether-apiserver-lb$' /etc/hosts || true)
    printf '%s\n' "$hosts" >/etc/hosts  # in place: /etc/hosts may be a bind mount
  fi
  echo "the API server load balancer (tether-apiserver-lb) is removed"
fi
"""


def _gated(name: str, gate: str, what: str, description: str) -> Step:
    return Step(
        name=name,
        phase=PHASE,
        component="reset",
        script=_HEADER.format(name=name) + _GATED.replace("WHAT", what),
        timeout_seconds=60,
        retries=1,  # each attempt asks the controller again, which runs kubectl again
        gate=gate,
        requested={"gate": gate},
        description=description,
    )


def cluster_steps() -> list[Step]:
    """What a node of a kubeadm cluster runs to leave it."""
    return [
        _gated(
            DRAIN_STEP,
            DRAIN_GATE,
            "drain",
            "cordons and drains the node (a control plane runs kubectl drain) before kubeadm reset",
        ),
        Step(
            name=KUBEADM_RESET_STEP,
            phase=PHASE,
            component="reset",
            script=_HEADER.format(name=KUBEADM_RESET_STEP) + _KUBEADM_RESET,
            timeout_seconds=KUBEADM_RESET_TIMEOUT_S,
            description="kubeadm reset -f: the node leaves the cluster (kubelet stopped, etcd member gone)",
        ),
        _gated(
            DELETE_NODE_STEP,
            DELETE_NODE_GATE,
            "delete node",
            "another control plane deletes the Kubernetes node object (kubectl delete node)",
        ),
    ]


def render_deprovision(*, environment: str, role: str, generation: int, kubeadm_cluster: bool) -> Plan:
    """The reset plan of a node of ``environment`` (``kubeadm_cluster``: its spec has one)."""
    steps = cluster_steps() if kubeadm_cluster else []
    return Plan.build(steps, generation=generation, environment=environment, role=role, deprovision=True)


__all__ = ["KUBEADM_RESET_STEP", "render_deprovision"]
