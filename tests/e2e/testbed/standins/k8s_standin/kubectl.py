"""kubectl stand-in: get nodes, label, taint, cluster-info, version, wait, apply/create (recorded only).

Talks to the stand-in API server named in the kubeconfig (``--kubeconfig``, ``$KUBECONFIG`` or
``~/.kube/config``); output and errors are shaped like kubectl's.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from k8s_standin import VERSION, common, miniyaml
from k8s_standin.common import ApiError, Unreachable

VALUE_FLAGS = {
    "--kubeconfig",
    "-o",
    "--output",
    "-l",
    "--selector",
    "--for",
    "--timeout",
    "-f",
    "--filename",
    "-n",
    "--namespace",
    "--request-timeout",
    "--context",
    "--field-selector",
    "-c",
    "--server",
}


class KubectlError(Exception):
    pass


def main(argv: list[str]) -> int:
    common.log_invocation("kubectl", argv)
    flags, words = parse(argv)
    try:
        return run(flags, words)
    except KubectlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Unreachable as exc:
        print(
            f"The connection to the server {exc} was refused - did you specify the right host or port?",
            file=sys.stderr,
        )
        return 1
    except ApiError as exc:
        print(
            "Error from server "
            f"({(exc.body or {}).get('reason', 'Error') if isinstance(exc.body, dict) else 'Error'}): "
            f"{exc}",
            file=sys.stderr,
        )
        return 1


def parse(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    flags: dict[str, Any] = {}
    words: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("-") and arg != "-":
            name, eq, value = arg.partition("=")
            if name in VALUE_FLAGS and not eq:
                i += 1
                value = argv[i] if i < len(argv) else ""
            flags[name.lstrip("-")] = value if (eq or name in VALUE_FLAGS) else True
        else:
            words.append(arg)
        i += 1
    for short, long in (
        ("o", "output"),
        ("l", "selector"),
        ("f", "filename"),
        ("n", "namespace"),
        ("A", "all-namespaces"),
    ):
        if short in flags:
            flags[long] = flags.pop(short)
    return flags, words


def kubeconfig(flags: dict[str, Any]) -> common.KubeConfig:
    path = common.default_kubeconfig(flags.get("kubeconfig"))
    if path is None:
        raise Unreachable("localhost:8080")
    if not path.exists():
        raise KubectlError(f"stat {path}: no such file or directory")
    return common.KubeConfig(path)


def run(flags: dict[str, Any], words: list[str]) -> int:
    if not words:
        print("kubectl controls the Kubernetes cluster manager (tether test fixture stand-in).")
        return 0
    verb, rest = words[0], words[1:]
    if verb == "version":
        return version(flags)
    if verb in ("apply", "create", "replace"):
        return apply(verb, flags)
    api = kubeconfig(flags).api()
    if verb == "cluster-info":
        api.request("GET", "/version")
        print(f"Kubernetes control plane is running at {api.server}")
        print(f"CoreDNS is running at {api.server}/api/v1/namespaces/kube-system/services/kube-dns:dns/proxy")
        print("\nTo further debug and diagnose cluster problems, use 'kubectl cluster-info dump'.")
        return 0
    if verb == "get":
        return get(api, flags, rest)
    if verb == "label":
        return label(api, flags, rest)
    if verb == "taint":
        return taint(api, flags, rest)
    if verb in ("cordon", "uncordon"):
        for name in _node_names(rest):
            api.request("PATCH", f"/api/v1/nodes/{name}", {"spec": {"unschedulable": verb == "cordon"}})
            print(f"node/{name} {verb}ed")
        return 0
    if verb == "delete" and rest and rest[0] in ("node", "nodes", "no"):
        for name in rest[1:]:
            api.request("DELETE", f"/api/v1/nodes/{name}")
            print(f'node "{name}" deleted')
        return 0
    if verb == "wait":
        return wait(api, flags, rest)
    raise KubectlError(f'unknown command "{verb}" for "kubectl" (stand-in)')


def version(flags: dict[str, Any]) -> int:
    client = {
        "gitVersion": VERSION,
        "major": VERSION[1:].split(".")[0],
        "minor": VERSION.split(".")[1],
        "platform": "linux/amd64",
    }
    server = None
    if not flags.get("client"):
        try:
            server = kubeconfig(flags).api(timeout=5).request("GET", "/version")
        except (Unreachable, KubectlError, ApiError) as exc:
            server = exc
    out = flags.get("output")
    if out in ("json", "yaml"):
        doc: dict[str, Any] = {"clientVersion": client, "kustomizeVersion": "v5.4.2"}
        if isinstance(server, dict):
            doc["serverVersion"] = server
        print(
            json.dumps(doc, indent=2) if out == "json" else miniyaml.dump(doc),
            end="\n" if out == "json" else "",
        )
    else:
        print(f"Client Version: {VERSION}\nKustomize Version: v5.4.2")
        if isinstance(server, dict):
            print(f"Server Version: {server['gitVersion']}")
    if isinstance(server, Exception):
        raise server
    return 0


def apply(verb: str, flags: dict[str, Any]) -> int:
    """Recorded only: the manifest's source and SHA-256 go to /var/log/kubeadm-standin/kubectl-apply.log."""
    source = flags.get("filename")
    if not source:
        raise KubectlError("must specify one of -f and -k")
    if source == "-":
        data = sys.stdin.buffer.read()
    elif source.startswith(("http://", "https://")):
        import urllib.request

        with urllib.request.urlopen(source, timeout=30) as resp:
            data = resp.read()
    else:
        data = Path(source).read_bytes()
    kinds = []
    kind = None
    for line in data.decode(errors="replace").splitlines():
        if line.startswith("kind:"):
            kind = line.split(":", 1)[1].strip().lower()
        elif kind and line.startswith("  name:"):
            kinds.append(f"{kind}/{line.split(':', 1)[1].strip()}")
            kind = None
    common.LOG_DIR.mkdir(parents=True, exist_ok=True)
    with open(common.LOG_DIR / "kubectl-apply.log", "a") as out:
        out.write(
            json.dumps(
                {
                    "time": time.time(),
                    "verb": verb,
                    "source": source,
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "objects": kinds,
                }
            )
            + "\n"
        )
    for obj in kinds or [f"manifest {source}"]:
        print(f"{obj} {'created' if verb == 'create' else 'configured'} (stand-in: recorded only)")
    return 0


def _node_names(rest: list[str]) -> list[str]:
    if rest and rest[0] in ("node", "nodes", "no"):
        return rest[1:]
    return [r.split("/", 1)[1] for r in rest if r.startswith(("node/", "nodes/"))]


def get(api: common.Api, flags: dict[str, Any], rest: list[str]) -> int:
    if not rest or (rest[0] not in ("node", "nodes", "no") and not rest[0].startswith(("node/", "nodes/"))):
        print("No resources found", file=sys.stderr)
        return 0
    names = _node_names(rest)
    if names:
        items = [api.request("GET", f"/api/v1/nodes/{n}") for n in names]
    else:
        items = api.request("GET", "/api/v1/nodes")["items"]
    items = [n for n in items if _selected(n, flags.get("selector"))]
    out = flags.get("output") or ""
    if out == "json":
        doc = (
            items[0]
            if len(names) == 1
            else {"apiVersion": "v1", "items": items, "kind": "List", "metadata": {"resourceVersion": ""}}
        )
        print(json.dumps(doc, indent=4))
        return 0
    if out == "yaml":
        doc = items[0] if len(names) == 1 else {"apiVersion": "v1", "items": items, "kind": "List"}
        print(miniyaml.dump(doc), end="")
        return 0
    if out == "name":
        for n in items:
            print(f"node/{n['metadata']['name']}")
        return 0
    if out.startswith("jsonpath="):
        print(jsonpath(out.split("=", 1)[1], items, single=len(names) == 1), end="")
        return 0
    if not items:
        print("No resources found", file=sys.stderr)
        return 0
    wide = out == "wide"
    header = ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    if wide:
        header += ["INTERNAL-IP", "EXTERNAL-IP", "OS-IMAGE", "KERNEL-VERSION", "CONTAINER-RUNTIME"]
    rows = [] if flags.get("no-headers") else [header]
    for n in items:
        rows.append(_row(n, wide))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return 0


def _row(node: dict[str, Any], wide: bool) -> list[str]:
    md, st = node["metadata"], node["status"]
    ready = next((c["status"] for c in st["conditions"] if c["type"] == "Ready"), "Unknown")
    status = "Ready" if ready == "True" else "NotReady"
    if node["spec"].get("unschedulable"):
        status += ",SchedulingDisabled"
    roles = sorted(
        k.split("/", 1)[1] for k in md.get("labels", {}) if k.startswith("node-role.kubernetes.io/")
    )
    created = time.mktime(time.strptime(md["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
    row = [
        md["name"],
        status,
        ",".join(roles) or "<none>",
        _age(time.time() - created),
        st["nodeInfo"].get("kubeletVersion", ""),
    ]
    if wide:
        ip = next((a["address"] for a in st["addresses"] if a["type"] == "InternalIP"), "<none>")
        info = st["nodeInfo"]
        row += [
            ip,
            "<none>",
            info.get("osImage", ""),
            info.get("kernelVersion", ""),
            info.get("containerRuntimeVersion", ""),
        ]
    return row


def _age(seconds: float) -> str:
    s = int(max(seconds, 0))
    if s < 120:
        return f"{s}s"
    if s < 3600 * 3:
        return f"{s // 60}m"
    if s < 86400 * 2:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def _selected(node: dict[str, Any], selector: str | None) -> bool:
    if not selector:
        return True
    labels = node["metadata"].get("labels", {})
    for term in selector.split(","):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.split("=", 1)
            if labels.get(k.rstrip("=")) != v:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def jsonpath(expr: str, items: list[dict[str, Any]], single: bool) -> str:
    """The common forms: {.items[*].metadata.name}, {.metadata.name}, with [*] and [?(@.type=="Ready")]."""
    root: Any = items[0] if single else {"items": items}
    out = []
    for part in __import__("re").findall(r"\{([^}]*)\}|([^{]+)", expr):
        if part[1]:
            out.append(part[1].replace("\\n", "\n").replace("\\t", "\t"))
            continue
        values = _walk([root], part[0].lstrip("."))
        out.append(" ".join(v if isinstance(v, str) else json.dumps(v) for v in values))
    return "".join(out)


def _walk(values: list[Any], path: str) -> list[Any]:
    import re

    for token in re.findall(r"\[\?\(@\.(\w+)==\"?([^\")]*)\"?\)\]|\[(\*|\d+)\]|([^.\[\]]+)", path):
        flt_key, flt_val, index, key = token
        nxt: list[Any] = []
        for v in values:
            if flt_key:
                nxt += [
                    x
                    for x in (v if isinstance(v, list) else [])
                    if isinstance(x, dict) and str(x.get(flt_key)) == flt_val
                ]
            elif index == "*":
                nxt += v if isinstance(v, list) else list(v.values()) if isinstance(v, dict) else []
            elif index:
                if isinstance(v, list) and int(index) < len(v):
                    nxt.append(v[int(index)])
            elif isinstance(v, dict) and key in v:
                nxt.append(v[key])
            elif isinstance(v, list):
                nxt += [x[key] for x in v if isinstance(x, dict) and key in x]
        values = nxt
    return values


def label(api: common.Api, flags: dict[str, Any], rest: list[str]) -> int:
    names = _targets(api, flags, rest)
    changes = [w for w in rest if "=" in w or w.endswith("-")]
    changes = [w for w in changes if not w.startswith(("node/", "nodes/"))]
    for name in names:
        node = api.request("GET", f"/api/v1/nodes/{name}")
        labels = node["metadata"].get("labels", {})
        patch: dict[str, Any] = {}
        for change in changes:
            if change.endswith("-") and "=" not in change:
                patch[change[:-1]] = None
                continue
            key, value = change.split("=", 1)
            if key in labels and labels[key] != value and not flags.get("overwrite"):
                raise KubectlError(f"'{key}' already has a value ({labels[key]}), and --overwrite is false")
            patch[key] = value
        api.request("PATCH", f"/api/v1/nodes/{name}", {"metadata": {"labels": patch}})
        print(
            f"node/{name} "
            f"{'labeled' if any(v is not None for v in patch.values()) or not patch else 'unlabeled'}"
        )
    return 0


def taint(api: common.Api, flags: dict[str, Any], rest: list[str]) -> int:
    names = _targets(api, flags, rest)
    specs = [w for w in rest if ":" in w or w.endswith("-")]
    specs = [w for w in specs if not w.startswith(("node/", "nodes/")) and w not in names]
    if not specs:
        raise KubectlError("at least one taint update is required")
    for name in names:
        node = api.request("GET", f"/api/v1/nodes/{name}")
        taints: list[dict[str, str]] = list(node["spec"].get("taints", []))
        removed = False
        for spec in specs:
            if spec.endswith("-"):
                key, _, effect = spec[:-1].partition(":")
                key = key.split("=")[0]
                keep = [t for t in taints if not (t["key"] == key and (not effect or t["effect"] == effect))]
                if len(keep) == len(taints):
                    raise KubectlError(f'taint "{spec[:-1]}" not found')
                taints, removed = keep, True
                continue
            keyval, _, effect = spec.rpartition(":")
            if effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
                raise KubectlError(f"invalid taint effect: {effect}, unsupported taint effect")
            key, _, value = keyval.partition("=")
            if any(t["key"] == key and t["effect"] == effect for t in taints):
                if not flags.get("overwrite"):
                    raise KubectlError(
                        f"node {name} already has {key} taint(s) with same effect(s) and --overwrite is false"
                    )
                taints = [t for t in taints if not (t["key"] == key and t["effect"] == effect)]
            new = {"key": key, "effect": effect}
            if value:
                new["value"] = value
            taints.append(new)
        api.request("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": taints}})
        print(f"node/{name} {'untainted' if removed else 'tainted'}")
    return 0


def _targets(api: common.Api, flags: dict[str, Any], rest: list[str]) -> list[str]:
    if flags.get("all"):
        return [n["metadata"]["name"] for n in api.request("GET", "/api/v1/nodes")["items"]]
    if rest and rest[0] in ("node", "nodes", "no"):
        return [w for w in rest[1:2]]
    names = _node_names(rest)
    if not names:
        raise KubectlError("resource(s) were provided, but no name was specified")
    return names


def wait(api: common.Api, flags: dict[str, Any], rest: list[str]) -> int:
    cond = str(flags.get("for", ""))
    if not cond.lower().startswith("condition="):
        raise KubectlError("--for must be condition=NAME (stand-in)")
    want = cond.split("=", 1)[1]
    want_type, _, want_status = want.partition("=")
    timeout = _seconds(str(flags.get("timeout", "30s")))
    if flags.get("all"):
        names = [n["metadata"]["name"] for n in api.request("GET", "/api/v1/nodes")["items"]]
    else:
        names = _node_names(rest)
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            node = api.request("GET", f"/api/v1/nodes/{name}")
            status = next(
                (c["status"] for c in node["status"]["conditions"] if c["type"].lower() == want_type.lower()),
                "",
            )
            if status.lower() == (want_status or "true").lower():
                print(f"node/{name} condition met")
                break
            if time.monotonic() > deadline:
                raise KubectlError(f"timed out waiting for the condition on nodes/{name}")
            time.sleep(0.5)
    return 0


def _seconds(text: str) -> float:
    import re

    total = 0.0
    for n, unit in re.findall(r"(\d+(?:\.\d+)?)(h|m|s)?", text):
        total += float(n) * {"h": 3600, "m": 60, "s": 1, "": 1}[unit]
    return total
