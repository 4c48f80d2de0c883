"""Objects besides nodes in the stand-in API server (TEST FIXTURE): namespaces, configmaps, deployments,
daemonsets, CRDs and custom resources, with the status their controllers would give them.

Nothing runs pods. Status is computed when an object is read: a Deployment's pods run ``POD_START_S``
after its generation changed, when a Ready node matches their node selector and tolerations and they have
a network (host network, or the cluster's CNI: calico-node rolled out); a DaemonSet has one pod per node
it matches; CRDs are Established. Two upstream add-ons are emulated by what they would create:

- kubeadm's CoreDNS Deployment and kube-proxy DaemonSet (``kubeadm_addons``, at ``kubeadm init``);
- the tigera operator: applying its manifest creates its namespace and Deployment (the manifest itself is
  only recorded); once the operator runs, with ``KUBERNETES_SERVICE_HOST``/``PORT`` (when set) naming a
  real API server, it registers its CRDs; an Installation then makes calico-system with the calico-node
  DaemonSet and calico-kube-controllers; an APIServer makes calico-apiserver.

Pure functions over the cluster state dict (``state["objects"]``) and the rendered Node objects, so the
API server, kubectl and the unit tests share them.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import uuid
from dataclasses import dataclass
from typing import Any

from k8s_standin import common

POD_START_S = float(os.environ.get("K8S_STANDIN_POD_START", "2"))
TIGERA_GROUP = "operator.tigera.io"
TIGERA_CRDS = ("installations", "apiservers", "goldmanes", "whiskers", "tigerastatuses", "imagesets")
CNI_NOT_READY = (
    "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady "
    "message:Network plugin returns error: cni plugin not initialized"
)


class ApiProblem(Exception):
    """An API error: HTTP status, reason, message (what the server answers as a v1 Status)."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


# ---------------------------------------------------------------------------------------------- resources


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    short: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def qualified(self) -> str:
        """kubectl's fully qualified resource name: ``deployments.apps``, ``namespaces``."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def type_name(self) -> str:
        """How ``-o name`` and action lines spell the type: ``deployment.apps``, ``namespace``."""
        return f"{self.singular}.{self.group}" if self.group else self.singular

    def path(self, namespace: str = "", name: str = "") -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        return f"{base}/{name}" if name else base

    def names(self) -> set[str]:
        out = {self.plural, self.singular, *self.short}
        if self.group:
            out |= {f"{n}.{self.group}" for n in (self.plural, self.singular)}
        return out


NODES = Resource("", "v1", "Node", "nodes", False, ("no",))
NAMESPACES = Resource("", "v1", "Namespace", "namespaces", False, ("ns",))
CONFIGMAPS = Resource("", "v1", "ConfigMap", "configmaps", True, ("cm",))
DEPLOYMENTS = Resource("apps", "v1", "Deployment", "deployments", True, ("deploy",))
DAEMONSETS = Resource("apps", "v1", "DaemonSet", "daemonsets", True, ("ds",))
CRDS = Resource(
    "apiextensions.k8s.io",
    "v1",
    "CustomResourceDefinition",
    "customresourcedefinitions",
    False,
    ("crd", "crds"),
)
BUILTIN = (NODES, NAMESPACES, CONFIGMAPS, DEPLOYMENTS, DAEMONSETS, CRDS)


def crd_resource(crd: dict[str, Any]) -> Resource:
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    versions = spec.get("versions") or [{"name": "v1"}]
    version = next((v["name"] for v in versions if v.get("storage")), versions[0]["name"])
    return Resource(
        spec.get("group", ""),
        version,
        names.get("kind", ""),
        names.get("plural", ""),
        spec.get("scope", "Namespaced") == "Namespaced",
        tuple(names.get("shortNames") or ()),
    )


def resources(state: dict[str, Any]) -> list[Resource]:
    """The built-in resources and those of every stored CRD."""
    crds = [o for k, o in _objects(state).items() if k.startswith(f"{CRDS.qualified}/")]
    return [*BUILTIN, *(crd_resource(c) for c in crds)]


def resolve(name: str, known: list[Resource]) -> Resource | None:
    """A resource as kubectl names it on the command line (plural, singular, short, ``.group``)."""
    name = name.lower()
    return next((r for r in known if name in r.names()), None)


def by_kind(api_version: str, kind: str, known: list[Resource]) -> Resource | None:
    return next((r for r in known if r.api_version == api_version and r.kind == kind), None)


def route(path: str, known: list[Resource]) -> tuple[Resource, str, str] | None:
    """``(resource, namespace, name)`` for a REST path of a known resource (nodes excluded), or None."""
    parts = path.strip("/").split("/")
    if parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = ""
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    elif len(rest) in (1, 2) and rest[0] == "namespaces" and not group:
        return (NAMESPACES, "", rest[1] if len(rest) == 2 else "")
    if not rest or len(rest) > 2:
        return None
    res = next(
        (
            r
            for r in known
            if r.group == group and r.version == version and r.plural == rest[0] and r != NODES
        ),
        None,
    )
    if res is None or (namespace and not res.namespaced):
        return None
    return (res, namespace, rest[1] if len(rest) == 2 else "")


# ---------------------------------------------------------------------------------------------- the store


def _objects(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    objs: dict[str, dict[str, Any]] = state.setdefault("objects", {})
    return objs


def key(res: Resource, namespace: str, name: str) -> str:
    return f"{res.qualified}/{namespace if res.namespaced else ''}/{name}"


def not_found(res: Resource, name: str) -> ApiProblem:
    return ApiProblem(404, "NotFound", f'{res.qualified} "{name}" not found')


def get(state: dict[str, Any], res: Resource, namespace: str, name: str) -> dict[str, Any] | None:
    return _objects(state).get(key(res, namespace, name))


def list_objects(state: dict[str, Any], res: Resource, namespace: str = "") -> list[dict[str, Any]]:
    prefix = f"{res.qualified}/"
    out = [
        o
        for k, o in sorted(_objects(state).items())
        if k.startswith(prefix) and (not namespace or o["metadata"].get("namespace") == namespace)
    ]
    return out


def put(state: dict[str, Any], res: Resource, obj: dict[str, Any], now: float) -> tuple[dict[str, Any], str]:
    """Create or update (the applied fields are merged into the stored object, as server-side apply keeps
    fields other managers set). Returns the stored object and ``created``/``configured``/``unchanged``."""
    meta = obj.get("metadata") or {}
    name, namespace = meta.get("name", ""), meta.get("namespace", "") if res.namespaced else ""
    if not name:
        raise ApiProblem(
            422, "Invalid", f"{res.kind} is invalid: metadata.name: Required value: name is required"
        )
    if res.namespaced:
        if not namespace:
            raise ApiProblem(400, "BadRequest", "the namespace of the object does not match the request")
        if get(state, NAMESPACES, "", namespace) is None:
            raise ApiProblem(404, "NotFound", f'namespaces "{namespace}" not found')
    k = key(res, namespace, name)
    stored = _objects(state).get(k)
    body = {
        f: copy.deepcopy(v) for f, v in obj.items() if f not in ("apiVersion", "kind", "metadata", "status")
    }
    if stored is None:
        new = {
            "apiVersion": res.api_version,
            "kind": res.kind,
            "metadata": {
                "name": name,
                **({"namespace": namespace} if res.namespaced else {}),
                "uid": str(uuid.uuid4()),
                "creationTimestamp": common.now_iso(now),
                "generation": 1,
                **{f: dict(meta[f]) for f in ("labels", "annotations") if meta.get(f)},
            },
            **body,
            "_standin": {"changed": now},
        }
        _objects(state)[k] = new
        return new, "created"
    before = json.dumps(_public(stored), sort_keys=True)
    spec_before = json.dumps(stored.get("spec"), sort_keys=True)
    for f in ("labels", "annotations"):
        if meta.get(f):
            stored["metadata"].setdefault(f, {}).update(meta[f])
    for f, v in body.items():
        stored[f] = strategic_merge(stored.get(f), v) if isinstance(v, dict) else v
    return stored, _touch(stored, before, spec_before, now)


def patch(
    state: dict[str, Any],
    res: Resource,
    namespace: str,
    name: str,
    change: Any,
    content_type: str,
    now: float,
) -> dict[str, Any]:
    stored = get(state, res, namespace, name)
    if stored is None:
        raise not_found(res, name)
    if not isinstance(change, dict):
        raise ApiProblem(400, "BadRequest", "the stand-in takes merge and strategic merge patches only")
    strategic = "strategic-merge-patch" in content_type
    if strategic and res.group not in ("", "apps"):
        raise ApiProblem(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: "
            "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
        )
    before = json.dumps(_public(stored), sort_keys=True)
    spec_before = json.dumps(stored.get("spec"), sort_keys=True)
    change = {k: v for k, v in change.items() if k not in ("apiVersion", "kind", "status", "_standin")}
    merged = strategic_merge(stored, change) if strategic else merge_patch(stored, change)
    merged["metadata"].update(
        {k: stored["metadata"][k] for k in ("name", "uid", "creationTimestamp", "generation")}
    )
    stored.clear()
    stored.update(merged)
    _touch(stored, before, spec_before, now)
    return stored


def delete(state: dict[str, Any], res: Resource, namespace: str, name: str) -> None:
    if _objects(state).pop(key(res, namespace, name), None) is None:
        raise not_found(res, name)


def _touch(stored: dict[str, Any], before: str, spec_before: str, now: float) -> str:
    if json.dumps(stored.get("spec"), sort_keys=True) != spec_before:
        stored["metadata"]["generation"] = int(stored["metadata"].get("generation", 1)) + 1
        stored["_standin"]["changed"] = now
    return "unchanged" if json.dumps(_public(stored), sort_keys=True) == before else "configured"


def _public(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k != "_standin"}


# Strategic merge: lists of these fields merge by the key, other lists are replaced (as in k8s.io/api).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
}


def strategic_merge(base: Any, change: Any, field: str = "") -> Any:
    if isinstance(change, dict) and isinstance(base, dict):
        out = copy.deepcopy(base)
        for k, v in change.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = strategic_merge(out.get(k), v, k)
        return out
    if isinstance(change, list) and isinstance(base, list) and field in MERGE_KEYS:
        mk = MERGE_KEYS[field]
        out_list = copy.deepcopy(base)
        for item in change:
            at = next(
                (
                    i
                    for i, b in enumerate(out_list)
                    if isinstance(b, dict) and isinstance(item, dict) and b.get(mk) == item.get(mk)
                ),
                None,
            )
            if at is None:
                out_list.append(copy.deepcopy(item))
            else:
                out_list[at] = strategic_merge(out_list[at], item)
        return out_list
    return copy.deepcopy(change)


def merge_patch(base: Any, change: Any) -> Any:
    """RFC 7386."""
    if not isinstance(change, dict):
        return copy.deepcopy(change)
    out = copy.deepcopy(base) if isinstance(base, dict) else {}
    for k, v in change.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


# ---------------------------------------------------------------------------------------------- status


def render(
    state: dict[str, Any], obj: dict[str, Any], nodes: list[dict[str, Any]], now: float
) -> dict[str, Any]:
    """The object as the API server shows it: with the status its controller would have written."""
    out = _public(copy.deepcopy(obj))
    out["metadata"]["resourceVersion"] = str(state.get("revision", 1))
    kind = obj["kind"]
    if kind == "Deployment":
        out["status"] = deployment_status(obj, nodes, cni_ready(state, nodes, now), now)
    elif kind == "DaemonSet":
        out["status"] = daemonset_status(obj, nodes, cni_ready(state, nodes, now), now)
    elif kind == "CustomResourceDefinition":
        names = (obj.get("spec") or {}).get("names") or {}
        since = obj["metadata"]["creationTimestamp"]
        out["status"] = {
            "acceptedNames": names,
            "conditions": [
                _condition("NamesAccepted", "True", "NoConflicts", "no conflicts found", since),
                _condition(
                    "Established",
                    "True",
                    "InitialNamesAccepted",
                    "the initial names have been accepted",
                    since,
                ),
            ],
            "storedVersions": [crd_resource(obj).version],
        }
    elif kind == "Namespace":
        out["status"] = {"phase": "Active"}
    return out


def _condition(kind: str, status: str, reason: str, message: str, since: str) -> dict[str, str]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
        "lastUpdateTime": since,
    }


def _ready(node: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])


def tolerates(tolerations: list[dict[str, Any]], taint: dict[str, Any]) -> bool:
    for t in tolerations or []:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t["key"] == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and t.get("value", "") == taint.get("value", ""):
            return True
    return False


def why_unschedulable(pod: dict[str, Any], node: dict[str, Any], daemon: bool = False) -> str | None:
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in (pod.get("nodeSelector") or {}).items()):
        return "didn't match Pod's node affinity/selector"
    for taint in node["spec"].get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(
            pod.get("tolerations"), taint
        ):
            return f"had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"
    if node["spec"].get("unschedulable") and not daemon:
        return "were unschedulable"
    return None


def cni_ready(state: dict[str, Any], nodes: list[dict[str, Any]], now: float) -> bool:
    """The cluster network is up once calico-node has rolled out (it runs on the host network)."""
    ds = get(state, DAEMONSETS, "calico-system", "calico-node")
    if ds is None:
        return False
    status = daemonset_status(ds, nodes, False, now)
    return status["desiredNumberScheduled"] > 0 and status["numberReady"] == status["desiredNumberScheduled"]


def pod_problem(pod: dict[str, Any], nodes: list[dict[str, Any]], network: bool) -> str | None:
    """Why a Deployment's pod would not run, in the scheduler's and kubelet's words (None: it runs)."""
    reasons: dict[str, int] = {}
    fit = False
    for node in nodes:
        why = why_unschedulable(pod, node) or (
            None if _ready(node) else "had untolerated taint {node.kubernetes.io/not-ready: }"
        )
        if why is None:
            fit = True
        else:
            reasons[why] = reasons.get(why, 0) + 1
    if not fit:
        detail = ", ".join(f"{n} node(s) {why}" for why, n in sorted(reasons.items()))
        return f"0/{len(nodes)} nodes are available: {detail or 'no nodes'}"
    if not pod.get("hostNetwork") and not network:
        return CNI_NOT_READY
    return None


def deployment_status(
    obj: dict[str, Any], nodes: list[dict[str, Any]], network: bool, now: float
) -> dict[str, Any]:
    spec = obj.get("spec") or {}
    name = obj["metadata"]["name"]
    replicas = int(spec.get("replicas", 1))
    pod = (spec.get("template") or {}).get("spec") or {}
    problem = pod_problem(pod, nodes, network)
    started = problem is None and now - float(obj["_standin"]["changed"]) >= POD_START_S
    available = replicas if started else 0
    since = common.now_iso(float(obj["_standin"]["changed"]))
    template = json.dumps(spec.get("template"), sort_keys=True).encode()
    rs = f"{name}-{hashlib.sha256(template).hexdigest()[:10]}"
    status: dict[str, Any] = {
        "observedGeneration": obj["metadata"]["generation"],
        "replicas": replicas,
        "updatedReplicas": replicas,
    }
    if available:
        status.update(readyReplicas=available, availableReplicas=available)
        conditions = [
            _condition(
                "Available", "True", "MinimumReplicasAvailable", "Deployment has minimum availability.", since
            ),
            _condition(
                "Progressing",
                "True",
                "NewReplicaSetAvailable",
                f'ReplicaSet "{rs}" has successfully progressed.',
                since,
            ),
        ]
    else:
        status["unavailableReplicas"] = replicas
        conditions = [
            _condition(
                "Available",
                "False",
                "MinimumReplicasUnavailable",
                "Deployment does not have minimum availability.",
                since,
            ),
            _condition(
                "Progressing",
                "True",
                "ReplicaSetUpdated",
                f'ReplicaSet "{rs}" is progressing. (stand-in: pods '
                f"{'are starting' if problem is None else 'pending: ' + problem})",
                since,
            ),
        ]
    status["conditions"] = conditions
    return status


def daemonset_status(
    obj: dict[str, Any], nodes: list[dict[str, Any]], network: bool, now: float
) -> dict[str, Any]:
    spec = obj.get("spec") or {}
    pod = (spec.get("template") or {}).get("spec") or {}
    eligible = [n for n in nodes if why_unschedulable(pod, n, daemon=True) is None]
    runs = (pod.get("hostNetwork") or network) and now - float(obj["_standin"]["changed"]) >= POD_START_S
    ready = sum(1 for n in eligible if _ready(n)) if runs else 0
    status: dict[str, Any] = {
        "currentNumberScheduled": len(eligible),
        "desiredNumberScheduled": len(eligible),
        "numberMisscheduled": 0,
        "numberReady": ready,
        "observedGeneration": obj["metadata"]["generation"],
        "updatedNumberScheduled": len(eligible),
    }
    if ready:
        status["numberAvailable"] = ready
    if len(eligible) - ready:
        status["numberUnavailable"] = len(eligible) - ready
    return status


# ---------------------------------------------------------------------------------------------- add-ons


def _deployment(
    namespace: str, name: str, pod: dict[str, Any], replicas: int = 1, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    match = {"k8s-app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or match},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": match},
            "strategy": {"type": "RollingUpdate"},
            "template": {"metadata": {"labels": match}, "spec": pod},
        },
    }


def _daemonset(namespace: str, name: str, pod: dict[str, Any]) -> dict[str, Any]:
    match = {"k8s-app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": namespace, "labels": match},
        "spec": {
            "selector": {"matchLabels": match},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {"metadata": {"labels": match}, "spec": pod},
        },
    }


def _namespace(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name, **(labels or {})}},
    }


def _container(name: str, image: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": image, "imagePullPolicy": "IfNotPresent", **extra}


LINUX = {"kubernetes.io/os": "linux"}
CP_TOLERATION = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}
ALL_TOLERATIONS = [{"operator": "Exists"}]


def kubeadm_addons(state: dict[str, Any], now: float) -> None:
    """What ``kubeadm init`` creates besides the control plane: namespaces, CoreDNS, kube-proxy."""
    for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
        put(state, NAMESPACES, _namespace(ns), now)
    coredns = {
        "nodeSelector": LINUX,
        "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}, CP_TOLERATION],
        "priorityClassName": "system-cluster-critical",
        "containers": [
            _container(
                "coredns", "registry.k8s.io/coredns/coredns:v1.11.3", args=["-conf", "/etc/coredns/Corefile"]
            )
        ],
    }
    put(
        state,
        DEPLOYMENTS,
        _deployment("kube-system", "coredns", coredns, replicas=2, labels={"k8s-app": "kube-dns"}),
        now,
    )
    proxy = {
        "hostNetwork": True,
        "nodeSelector": LINUX,
        "tolerations": ALL_TOLERATIONS,
        "priorityClassName": "system-node-critical",
        "containers": [
            _container(
                "kube-proxy",
                f"registry.k8s.io/kube-proxy:{common.VERSION}",
                command=["/usr/local/bin/kube-proxy", "--config=/var/lib/kube-proxy/config.conf"],
            )
        ],
    }
    put(state, DAEMONSETS, _daemonset("kube-system", "kube-proxy", proxy), now)


def tigera_operator_manifest() -> list[dict[str, Any]]:
    """What Calico's tigera-operator.yaml creates that matters here (its CRDs come from the operator)."""
    pod = {
        "nodeSelector": LINUX,
        "tolerations": [
            {"effect": "NoExecute", "operator": "Exists"},
            {"effect": "NoSchedule", "operator": "Exists"},
        ],
        "serviceAccountName": "tigera-operator",
        "terminationGracePeriodSeconds": 60,
        "hostNetwork": True,
        "dnsPolicy": "ClusterFirstWithHostNet",
        "containers": [
            _container(
                "tigera-operator",
                "quay.io/tigera/operator:v1.40.0",
                command=["operator"],
                args=["-manage-crds=true"],
                env=[
                    {"name": "WATCH_NAMESPACE", "value": ""},
                    {"name": "OPERATOR_NAME", "value": "tigera-operator"},
                ],
                envFrom=[{"configMapRef": {"name": "kubernetes-services-endpoint", "optional": True}}],
            )
        ],
    }
    deployment = _deployment("tigera-operator", "tigera-operator", pod, labels={"k8s-app": "tigera-operator"})
    deployment["spec"]["selector"] = {"matchLabels": {"name": "tigera-operator"}}
    deployment["spec"]["template"]["metadata"]["labels"] = {
        "name": "tigera-operator",
        "k8s-app": "tigera-operator",
    }
    return [
        _namespace(
            "tigera-operator", {"name": "tigera-operator", "pod-security.kubernetes.io/enforce": "privileged"}
        ),
        deployment,
    ]


def is_tigera_operator_manifest(docs: list[dict[str, Any]]) -> bool:
    return any(
        d.get("kind") == "Deployment" and (d.get("metadata") or {}).get("name") == "tigera-operator"
        for d in docs
    )


def _crd(group: str, plural: str, kind: str, scope: str = "Cluster") -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()},
            "scope": scope,
            "versions": [{"name": "v1", "served": True, "storage": True}],
        },
    }


TIGERA_KINDS = {
    "installations": "Installation",
    "apiservers": "APIServer",
    "goldmanes": "Goldmane",
    "whiskers": "Whisker",
    "tigerastatuses": "TigeraStatus",
    "imagesets": "ImageSet",
}


def operator_problem(state: dict[str, Any], nodes: list[dict[str, Any]], now: float) -> str | None:
    """Why the tigera operator is not working (None: it runs and reaches the API server)."""
    dep = get(state, DEPLOYMENTS, "tigera-operator", "tigera-operator")
    if dep is None:
        return "not installed"
    status = deployment_status(dep, nodes, cni_ready(state, nodes, now), now)
    if not status.get("availableReplicas"):
        return "not available"
    containers = dep["spec"]["template"]["spec"].get("containers") or []
    env = {e["name"]: e.get("value", "") for c in containers for e in c.get("env") or [] if "name" in e}
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
    if host is None:
        return None  # the kubernetes Service through kube-proxy (host network pods can use it)
    cluster = state.get("cluster") or {}
    servers = {m["address"] for m in state.get("members", [])} | {cluster.get("controlPlaneEndpoint", "")}
    if f"{host}:{port}" not in servers:
        return f"dial tcp {host}:{port}: connect: connection refused (not an API server of this cluster)"
    return None


def reconcile(state: dict[str, Any], nodes: list[dict[str, Any]], now: float) -> bool:
    """The emulated operators' work; True when something was created."""
    made = False

    def ensure(res: Resource, obj: dict[str, Any]) -> None:
        nonlocal made
        meta = obj["metadata"]
        if get(state, res, meta.get("namespace", ""), meta["name"]) is None:
            put(state, res, obj, now)
            made = True

    if operator_problem(state, nodes, now) is not None:
        return False
    for plural in TIGERA_CRDS:
        ensure(CRDS, _crd(TIGERA_GROUP, plural, TIGERA_KINDS[plural]))
    installation = by_kind(f"{TIGERA_GROUP}/v1", "Installation", resources(state))
    if installation and get(state, installation, "", "default") is not None:
        ensure(NAMESPACES, _namespace("calico-system", {"pod-security.kubernetes.io/enforce": "privileged"}))
        node = {
            "hostNetwork": True,
            "nodeSelector": LINUX,
            "tolerations": [
                {"key": "CriticalAddonsOnly", "operator": "Exists"},
                {"effect": "NoSchedule", "operator": "Exists"},
                {"effect": "NoExecute", "operator": "Exists"},
            ],
            "priorityClassName": "system-node-critical",
            "containers": [_container("calico-node", "quay.io/calico/node:v3.31.5")],
        }
        ensure(DAEMONSETS, _daemonset("calico-system", "calico-node", node))
        controllers = {
            "nodeSelector": LINUX,
            "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}, CP_TOLERATION],
            "containers": [_container("calico-kube-controllers", "quay.io/calico/kube-controllers:v3.31.5")],
        }
        ensure(DEPLOYMENTS, _deployment("calico-system", "calico-kube-controllers", controllers))
    apiserver = by_kind(f"{TIGERA_GROUP}/v1", "APIServer", resources(state))
    if apiserver and get(state, apiserver, "", "default") is not None:
        ensure(NAMESPACES, _namespace("calico-apiserver"))
        pod = {
            "nodeSelector": LINUX,
            "tolerations": [CP_TOLERATION],
            "containers": [_container("calico-apiserver", "quay.io/calico/apiserver:v3.31.5")],
        }
        ensure(DEPLOYMENTS, _deployment("calico-apiserver", "calico-apiserver", pod, replicas=2))
    return made


def apply(
    state: dict[str, Any], docs: list[dict[str, Any]], default_namespace: str, now: float
) -> list[dict[str, Any]]:
    """kubectl apply: [{"type", "name", "action"} or {"error"}] per object. Manifests of known add-ons
    are replaced by what they create; objects of kinds the stand-in does not keep are recorded only."""
    if is_tigera_operator_manifest(docs):
        docs = tigera_operator_manifest()
    known = resources(state)
    out: list[dict[str, Any]] = []
    for doc in docs:
        if not isinstance(doc, dict) or not doc.get("kind"):
            continue
        meta = doc.setdefault("metadata", {})
        res = by_kind(str(doc.get("apiVersion", "")), str(doc["kind"]), known)
        if res is None:
            api_version = str(doc.get("apiVersion", ""))
            group = api_version.rpartition("/")[0]
            if "." in group and not group.endswith(".k8s.io"):  # a custom resource without its CRD
                out.append(
                    {
                        "error": f'resource mapping not found for name: "{meta.get("name", "")}" namespace: '
                        f'"{meta.get("namespace", "")}" from "": no matches for kind "{doc["kind"]}" in '
                        f'version "{api_version}"\nensure CRDs are installed first'
                    }
                )
            else:
                out.append({"type": doc["kind"].lower(), "name": meta.get("name", ""), "action": "recorded"})
            continue
        if res == NODES:
            out.append({"type": "node", "name": meta.get("name", ""), "action": "recorded"})
            continue
        if res.namespaced and not meta.get("namespace"):
            meta["namespace"] = default_namespace
        try:
            _, action = put(state, res, doc, now)
        except ApiProblem as exc:
            out.append({"error": f"Error from server ({exc.reason}): error when creating: {exc.message}"})
            continue
        if res == CRDS:
            known = resources(state)
        out.append({"type": res.type_name, "name": meta["name"], "action": action})
    return out
