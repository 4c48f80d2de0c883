"""Scripts the controller sends to a control plane as one-off tasks (not part of any plan).

Pure functions returning ``Step``s; every input travels as environment, never as
script text, and nothing secret is ever printed (the material goes to
``$TETHER_SECRETS_OUT``, which the agent sends over its stream and deletes).
"""

from __future__ import annotations

from collections.abc import Mapping

from tether.controller.cluster.material import CERT_KEY, DEFAULT_TOKEN_TTL_S, TOKEN_TTL
from tether.nodeagent.model import Step

_PREAMBLE = """#!/usr/bin/env bash
# tether cluster task: {what}
set -euo pipefail
export KUBECONFIG=/etc/kubernetes/admin.conf
"""

_REFRESH = """
token=$(kubeadm token create --ttl "${TOKEN_TTL}s")
ca_hash=$(openssl x509 -pubkey -noout -in /etc/kubernetes/pki/ca.crt \\
  | openssl pkey -pubin -outform der | sha256sum | cut -d' ' -f1)
# The endpoint joining nodes use is the cluster's control-plane endpoint (the server in admin.conf).
endpoint=$(awk '$1 == "server:" { gsub(/["\\047]/, "", $2); sub("^https://", "", $2); print $2; exit }' \\
  "$KUBECONFIG")
{
  printf 'JOIN_TOKEN=%s\\n' "$token"
  printf 'ADMIN_KUBECONFIG_B64=%s\\n' "$(base64 -w0 "$KUBECONFIG")"
} >> "$TETHER_SECRETS_OUT"
{
  printf 'JOIN_CA_HASH=sha256:%s\\n' "$ca_hash"
  printf 'JOIN_ENDPOINT=%s\\n' "$endpoint"
  printf '%s=%s\\n' "TOKEN_TTL_NAME" "$TOKEN_TTL"
} >> "$TETHER_OUTPUTS"
if [ "$UPLOAD_CERTS" = 1 ]; then
  cert_key=$(kubeadm init phase upload-certs --upload-certs 2>/dev/null | tail -n 1)
  printf '%s=%s\\n' "CERT_KEY_NAME" "$cert_key" >> "$TETHER_SECRETS_OUT"
fi
echo "fresh join material handed to the agent (token TTL ${TOKEN_TTL}s, certificate key: $UPLOAD_CERTS)"
"""

_LABEL = """
kubectl label node "$NODE" tether.dev/managed=true "tether.dev/role=$ROLE" --overwrite
if [ "$ROLE" = worker ]; then
  kubectl label node "$NODE" node-role.kubernetes.io/worker= --overwrite
fi
# Spec labels were validated as key=value without whitespace at apply time.
for kv in $LABELS; do
  kubectl label node "$NODE" "$kv" --overwrite
done
taint='"key": *"node-role.kubernetes.io/control-plane"'
if [ "$UNTAINT" = 1 ] && kubectl get node "$NODE" -o json | grep -q "$taint"; then
  kubectl taint node "$NODE" node-role.kubernetes.io/control-plane:NoSchedule-
fi
echo "node $NODE labelled"
"""


_DRAIN = """
# kubectl's own answer tells a node the cluster does not know apart from an API server that is down.
if ! out=$(kubectl get node "$NODE" -o name 2>&1); then
  if grep -q NotFound <<<"$out"; then
    echo "node $NODE is not in the cluster: nothing to $ACTION"
    exit 0
  fi
  printf '%s\\n' "$out" >&2
  exit 1
fi
case $ACTION in
  drain)
    kubectl cordon "$NODE"
    kubectl drain "$NODE" --ignore-daemonsets --delete-emptydir-data --timeout="${DRAIN_TIMEOUT}s"
    ;;
  uncordon) kubectl uncordon "$NODE" ;;
  cordon) kubectl cordon "$NODE" ;;
  delete-node) kubectl delete node "$NODE" ;;
esac
echo "node $NODE: $ACTION done"
"""


def refresh_task(*, upload_certs: bool, token_ttl_seconds: int = DEFAULT_TOKEN_TTL_S) -> Step:
    script = _PREAMBLE.format(what="refresh kubeadm join material") + _REFRESH.replace(
        "TOKEN_TTL_NAME", TOKEN_TTL
    ).replace("CERT_KEY_NAME", CERT_KEY)
    return Step(
        name="refresh-join-material",
        script=script,
        timeout_seconds=300,
        component="kubeadm",
        env={"TOKEN_TTL": str(token_ttl_seconds), "UPLOAD_CERTS": "1" if upload_certs else "0"},
    ).sealed()


def label_task(node: str, *, role: str, labels: Mapping[str, str], untaint: bool) -> Step:
    script = _PREAMBLE.format(what="label and taint a node that joined") + _LABEL
    return Step(
        name=f"label-{node}",
        script=script,
        timeout_seconds=120,
        component="kubeadm",
        retries=3,
        env={
            "NODE": node,
            "ROLE": role,
            "LABELS": " ".join(f"{k}={v}" for k, v in sorted(labels.items())),
            "UNTAINT": "1" if untaint else "0",
        },
    ).sealed()


_WHAT = {
    "drain": "drain a node around its disruptive steps",
    "uncordon": "uncordon a node after its disruptive steps",
    "delete-node": "delete a node that left the cluster (kubeadm reset ran on it)",
    "cordon": "cordon a node whose GPUs drifted (hardware.onDrift: cordon)",
}


def drain_task(node: str, *, action: str, nonce: str, timeout_seconds: int) -> Step:
    """``kubectl cordon`` and ``drain`` (action "drain"), ``uncordon``, ``delete node`` (action
    "delete-node", a reset) or ``cordon`` only (GPU drift) a node, run on a control plane.
    ``nonce`` makes each task's digest its own, so its events answer this task only."""
    if action not in _WHAT:
        raise ValueError(f"unknown action {action!r}")
    script = _PREAMBLE.format(what=_WHAT[action]) + _DRAIN
    return Step(
        name=f"{action}-{node}",
        script=script,
        # kubectl's own --timeout ends the drain first; this one bounds the whole task.
        timeout_seconds=timeout_seconds + 60,
        component="kubeadm",
        env={"NODE": node, "ACTION": action, "DRAIN_TIMEOUT": str(timeout_seconds), "TASK_ID": nonce},
    ).sealed()
