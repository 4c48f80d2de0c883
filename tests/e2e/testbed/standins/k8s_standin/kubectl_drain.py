"""kubectl cordon, uncordon and drain (stand-in, TEST FIXTURE), with kubectl's words and exit codes.

A node is cordoned through ``spec.unschedulable`` (a PATCH the API server logs, with its time, in
apiserver.log). Nothing runs pods here: the pods ``drain`` finds on a node are those of the
DaemonSets that schedule onto it, which it refuses to touch without ``--ignore-daemonsets`` (as
kubectl does) and otherwise leaves alone with kubectl's warning; there is nothing else to evict.
"""

from __future__ import annotations

import hashlib
import sys
from typing import Any

from k8s_standin import common, objects

DRAIN_FLAGS = {"ignore-daemonsets", "delete-emptydir-data", "force", "timeout", "grace-period"}
GLOBAL_FLAGS = {"kubeconfig", "context", "server", "request-timeout", "namespace"}


class DrainError(Exception):
    pass


def node_names(rest: list[str]) -> list[str]:
    """``NODE...``, ``node NODE...`` or ``node/NODE...`` (cordon takes bare names)."""
    if rest and rest[0] in ("node", "nodes", "no"):
        return rest[1:]
    return [w.split("/", 1)[1] if w.startswith(("node/", "nodes/")) else w for w in rest]


def cordon(api: common.Api, verb: str, rest: list[str]) -> int:
    names = node_names(rest)
    if not names:
        raise DrainError("resource(s) were provided, but no name was specified")
    for name in names:
        _set_unschedulable(api, name, verb == "cordon")
    return 0


def drain(api: common.Api, flags: dict[str, Any], rest: list[str]) -> int:
    unknown = sorted(set(flags) - DRAIN_FLAGS - GLOBAL_FLAGS)
    if unknown:
        raise DrainError(f"unknown flag: --{unknown[0]}")
    names = node_names(rest)
    if len(names) != 1:
        raise DrainError("exactly one NODE name is required (stand-in)")
    name = names[0]
    node = _set_unschedulable(api, name, True)
    daemon_pods = _daemonset_pods(api, node)
    if daemon_pods and not flags.get("ignore-daemonsets"):
        problem = "cannot delete DaemonSet-managed Pods (use --ignore-daemonsets to ignore): "
        problem += ", ".join(daemon_pods)
        print(
            f'error: unable to drain node "{name}" due to error: [{problem}], continuing command...',
            file=sys.stderr,
        )
        print(f"There are pending nodes to be drained:\n {name}\n{problem}", file=sys.stderr)
        return 1
    if daemon_pods:
        print(f"Warning: ignoring DaemonSet-managed Pods: {', '.join(daemon_pods)}", file=sys.stderr)
    print(f"node/{name} drained")
    return 0


def _set_unschedulable(api: common.Api, name: str, value: bool) -> dict[str, Any]:
    node: dict[str, Any] = api.request("GET", f"/api/v1/nodes/{name}")
    verb = "cordoned" if value else "uncordoned"
    if bool(node["spec"].get("unschedulable")) == value:
        print(f"node/{name} already {verb}")
        return node
    node = api.request("PATCH", f"/api/v1/nodes/{name}", {"spec": {"unschedulable": value}})
    print(f"node/{name} {verb}")
    return node


def _daemonset_pods(api: common.Api, node: dict[str, Any]) -> list[str]:
    """namespace/name of the pod each DaemonSet runs on ``node`` (one per DaemonSet that fits it)."""
    out = []
    for ds in api.request("GET", objects.DAEMONSETS.path())["items"]:
        pod = ((ds.get("spec") or {}).get("template") or {}).get("spec") or {}
        if objects.why_unschedulable(pod, node, daemon=True) is None:
            md = ds["metadata"]
            suffix = hashlib.sha256(f"{md['name']}/{node['metadata']['name']}".encode()).hexdigest()[:5]
            out.append(f"{md.get('namespace', 'default')}/{md['name']}-{suffix}")
    return sorted(out)
