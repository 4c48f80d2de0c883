"""kubectl stand-in (TEST FIXTURE): what tether's scripts and tests run, with kubectl's output and errors.

get (nodes, namespaces, configmaps, deployments, daemonsets, CRDs, custom resources; -o json/yaml/name/
wide/jsonpath; ``--raw PATH``), label/taint nodes, cordon/uncordon/drain them (``kubectl_drain``),
patch (strategic and merge), rollout
status (deployments, daemon sets), wait (--for=condition=..., --for=delete), apply/create (manifests are
recorded in kubectl-apply.log; the stand-in API server keeps the objects it knows and emulates the add-ons
of objects.py), delete, config view/current-context, cluster-info, version. Talks to the stand-in API
server named in the kubeconfig (``--kubeconfig``, ``$KUBECONFIG`` or ``~/.kube/config``).
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from k8s_standin import VERSION, common, kubectl_drain, miniyaml, objects
from k8s_standin.common import ApiError, Unreachable
from k8s_standin.objects import Resource

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
    "-p",
    "--patch",
    "--type",
    "--field-manager",
    "--revision",
    "--grace-period",
}
SHORT = (("o", "output"), ("l", "selector"), ("f", "filename"), ("n", "namespace"), ("A", "all-namespaces"))
SHORT += (("p", "patch"), ("w", "watch"))


class KubectlError(Exception):
    pass


class NotFoundError(Exception):
    """A NotFound answer, printed as kubectl prints it, while the command goes on with other objects."""


def main(argv: list[str]) -> int:
    common.log_invocation("kubectl", argv)
    flags, words = parse(argv)
    try:
        return run(flags, words)
    except (KubectlError, kubectl_drain.DrainError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Unreachable as exc:
        print(
            f"The connection to the server {exc} was refused - did you specify the right host or port?",
            file=sys.stderr,
        )
        return 1
    except ApiError as exc:
        print(server_error(exc), file=sys.stderr)
        return 1


def server_error(exc: ApiError) -> str:
    reason = exc.body.get("reason", "Error") if isinstance(exc.body, dict) else "Error"
    if exc.status == 404 and not (isinstance(exc.body, dict) and exc.body.get("reason")):
        return "Error from server (NotFound): the server could not find the requested resource"
    return f"Error from server ({reason}): {exc}"


def parse(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    flags: dict[str, Any] = {}
    words: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            words += argv[i + 1 :]
            break
        if arg.startswith("-") and arg != "-":
            name, eq, value = arg.partition("=")
            if not eq and len(name) > 2 and name[1] in "on" and name[1] != "-":  # -ojson, -nkube-system
                name, eq, value = name[:2], "=", name[2:]
            takes_value = name in VALUE_FLAGS or (
                name == "--raw" and i + 1 < len(argv) and argv[i + 1].startswith("/")
            )
            if takes_value and not eq:
                i += 1
                value = argv[i] if i < len(argv) else ""
            flags[name.lstrip("-")] = value if (eq or takes_value) else True
        else:
            words.append(arg)
        i += 1
    for short, long in SHORT:
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
    if verb == "config":
        return config(flags, rest)
    api = kubeconfig(flags).api()
    if verb in ("apply", "create", "replace"):
        return apply(api, verb, flags)
    if verb == "cluster-info":
        api.request("GET", "/version")
        print(f"Kubernetes control plane is running at {api.server}")
        print(f"CoreDNS is running at {api.server}/api/v1/namespaces/kube-system/services/kube-dns:dns/proxy")
        print("\nTo further debug and diagnose cluster problems, use 'kubectl cluster-info dump'.")
        return 0
    if verb == "get" and isinstance(flags.get("raw"), str):
        return get_raw(api, flags["raw"])
    client = Client(api, flags)
    if verb == "get":
        res, _ = client.targets(rest)[0] if rest else (None, [])
        if res is None or res == objects.NODES:
            return get_nodes(api, flags, rest)
        return get(client, rest)
    if verb == "label":
        return label(api, flags, rest)
    if verb == "taint":
        return taint(api, flags, rest)
    if verb in ("cordon", "uncordon"):
        return kubectl_drain.cordon(api, verb, rest)
    if verb == "drain":
        return kubectl_drain.drain(api, flags, rest)
    if verb == "delete":
        return delete(client, rest)
    if verb == "wait":
        return wait(client, rest)
    if verb == "patch":
        return patch(client, rest)
    if verb == "rollout":
        return rollout(client, rest)
    raise KubectlError(f'unknown command "{verb}" for "kubectl" (stand-in)')


# ---------------------------------------------------------------------------------------------- resources


class Client:
    """The API plus resource discovery (built-in resources, then the cluster's CRDs) and namespaces."""

    def __init__(self, api: common.Api, flags: dict[str, Any]) -> None:
        self.api = api
        self.flags = flags
        self.namespace = str(flags.get("namespace") or "default")
        self._known: list[Resource] | None = None

    def resource(self, name: str) -> Resource:
        res = objects.resolve(name, list(objects.BUILTIN))
        if res is None:
            if self._known is None:
                crds = self.api.request("GET", objects.CRDS.path())["items"]
                self._known = [*objects.BUILTIN, *(objects.crd_resource(c) for c in crds)]
            res = objects.resolve(name, self._known)
        if res is None:
            raise KubectlError(f'the server doesn\'t have a resource type "{name}"')
        return res

    def targets(self, words: list[str]) -> list[tuple[Resource, list[str]]]:
        """``TYPE [NAME...]`` or ``TYPE/NAME...`` (kubectl's two spellings)."""
        words = [w for w in words if w]
        if not words:
            raise KubectlError("You must provide one or more resources by argument or filename.")
        if "/" not in words[0]:
            return [(self.resource(words[0]), words[1:])]
        out: list[tuple[Resource, list[str]]] = []
        for word in words:
            kind, slash, name = word.partition("/")
            if not slash or not name:
                raise KubectlError(
                    "there is no need to specify a resource type as a separate argument "
                    "when passing arguments in resource/name form"
                )
            out.append((self.resource(kind), [name]))
        return out

    def ns(self, res: Resource) -> str:
        return self.namespace if res.namespaced else ""

    def get(self, res: Resource, name: str) -> dict[str, Any]:
        try:
            obj: dict[str, Any] = self.api.request("GET", res.path(self.ns(res), name))
            return obj
        except ApiError as exc:
            if exc.status == 404:
                raise NotFoundError(
                    f'Error from server (NotFound): {res.qualified} "{name}" not found'
                ) from exc
            raise

    def list(self, res: Resource, all_namespaces: bool = False) -> list[dict[str, Any]]:
        path = res.path("" if all_namespaces else self.ns(res))
        selector = self.flags.get("selector")
        if selector:
            path += "?labelSelector=" + selector
        items: list[dict[str, Any]] = self.api.request("GET", path)["items"]
        if res == objects.NODES:
            items = [n for n in items if common.selected(n, selector)]
        return items


def type_name(res: Resource) -> str:
    return res.type_name


# ---------------------------------------------------------------------------------------------- get


def get_raw(api: common.Api, path: str) -> int:
    status, body = api.raw("GET", path, None, {"Accept": "application/json, */*"})
    if status >= 400:
        try:
            doc = json.loads(body)
            raise ApiError(status, doc.get("message", str(status)), doc)
        except ValueError:
            raise ApiError(status, body.decode(errors="replace")) from None
    sys.stdout.write(body.decode(errors="replace"))
    return 0


def get(client: Client, words: list[str]) -> int:
    flags = client.flags
    out = str(flags.get("output") or "")
    every = bool(flags.get("all-namespaces"))
    found: list[tuple[Resource, dict[str, Any]]] = []
    missing: list[str] = []
    named = False
    for res, names in client.targets(words):
        if names:
            named = True
            for name in names:
                try:
                    found.append((res, client.get(res, name)))
                except NotFoundError as exc:
                    missing.append(str(exc))
        else:
            found += [(res, o) for o in client.list(res, every)]
    requested = sum(len(names) for _, names in client.targets(words))
    single = named and requested == 1 and len(found) == 1
    if out in ("json", "yaml"):
        if found or not missing:
            doc = found[0][1] if single else _list([o for _, o in found])
            print(
                json.dumps(doc, indent=4) if out == "json" else miniyaml.dump(doc),
                end="\n" if out == "json" else "",
            )
    elif out == "name":
        for res, obj in found:
            print(f"{type_name(res)}/{obj['metadata']['name']}")
    elif out.startswith("jsonpath="):
        expr = out.split("=", 1)[1]
        root = found[0][1] if single else _list([o for _, o in found])
        print(jsonpath_doc(expr, root), end="")
    elif found:
        _table(found, every, out == "wide", bool(flags.get("no-headers")))
    elif not missing:
        res = client.targets(words)[0][0]
        where = f" in {client.namespace} namespace" if res.namespaced and not every else ""
        print(f"No resources found{where}.", file=sys.stderr)
    for line in missing:
        print(line, file=sys.stderr)
    return 1 if missing else 0


def _list(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "items": items, "kind": "List", "metadata": {"resourceVersion": ""}}


def _table(found: list[tuple[Resource, dict[str, Any]]], every: bool, wide: bool, no_headers: bool) -> None:
    groups: dict[str, list[dict[str, Any]]] = {}
    kinds: dict[str, Resource] = {}
    for res, obj in found:
        groups.setdefault(res.qualified, []).append(obj)
        kinds[res.qualified] = res
    first = True
    for qualified, items in groups.items():
        res = kinds[qualified]
        header, rows = _columns(res, items, wide)
        if every and res.namespaced:
            header = ["NAMESPACE", *header]
            rows = [[o["metadata"].get("namespace", ""), *r] for o, r in zip(items, rows, strict=True)]
        if len(groups) > 1:
            rows = [[f"{type_name(res)}/{r[1 if every and res.namespaced else 0]}", *r[1:]] for r in rows]
        table = rows if no_headers else [header, *rows]
        widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
        if not first:
            print()
        first = False
        for r in table:
            print("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def _columns(res: Resource, items: list[dict[str, Any]], wide: bool) -> tuple[list[str], list[list[str]]]:
    def age(o: dict[str, Any]) -> str:
        created = time.mktime(time.strptime(o["metadata"]["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ"))
        return _age(time.time() - (created - time.timezone))

    def name(o: dict[str, Any]) -> str:
        return str(o["metadata"]["name"])

    if res == objects.DEPLOYMENTS:
        rows = []
        for o in items:
            st, want = o.get("status") or {}, (o.get("spec") or {}).get("replicas", 1)
            rows.append(
                [
                    name(o),
                    f"{st.get('readyReplicas', 0)}/{want}",
                    str(st.get("updatedReplicas", 0)),
                    str(st.get("availableReplicas", 0)),
                    age(o),
                ]
            )
        return ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"], rows
    if res == objects.DAEMONSETS:
        rows = []
        for o in items:
            st = o.get("status") or {}
            selector = ",".join(
                f"{k}={v}"
                for k, v in (((o.get("spec") or {}).get("template") or {}).get("spec") or {})
                .get("nodeSelector", {})
                .items()
            )
            rows.append(
                [
                    name(o),
                    *(
                        str(st.get(k, 0))
                        for k in (
                            "desiredNumberScheduled",
                            "currentNumberScheduled",
                            "numberReady",
                            "updatedNumberScheduled",
                            "numberAvailable",
                        )
                    ),
                    selector or "<none>",
                    age(o),
                ]
            )
        return [
            "NAME",
            "DESIRED",
            "CURRENT",
            "READY",
            "UP-TO-DATE",
            "AVAILABLE",
            "NODE SELECTOR",
            "AGE",
        ], rows
    if res == objects.CRDS:
        return ["NAME", "CREATED AT"], [[name(o), o["metadata"]["creationTimestamp"]] for o in items]
    if res == objects.NAMESPACES:
        return ["NAME", "STATUS", "AGE"], [
            [name(o), (o.get("status") or {}).get("phase", "Active"), age(o)] for o in items
        ]
    if res == objects.CONFIGMAPS:
        return ["NAME", "DATA", "AGE"], [[name(o), str(len(o.get("data") or {})), age(o)] for o in items]
    return ["NAME", "AGE"], [[name(o), age(o)] for o in items]


def get_nodes(api: common.Api, flags: dict[str, Any], rest: list[str]) -> int:
    if not rest:
        print("You must specify the type of resource to get.", file=sys.stderr)
        return 1
    names = _node_names(rest)
    if names:
        items = [api.request("GET", f"/api/v1/nodes/{n}") for n in names]
    else:
        items = api.request("GET", "/api/v1/nodes")["items"]
    items = [n for n in items if common.selected(n, flags.get("selector"))]
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


# ---------------------------------------------------------------------------------------------- jsonpath


def jsonpath(expr: str, items: list[dict[str, Any]], single: bool) -> str:
    """kubectl -o jsonpath over nodes: the root is the node (single) or {"items": [...]}."""
    return jsonpath_doc(expr, items[0] if single and items else {"items": items})


def jsonpath_doc(expr: str, root: Any) -> str:
    """The forms scripts use: {.a.b[0].c}, [*], [?(@.k=="v")], {range ...}{...}{end}, {"\\n"} literals."""
    tokens = re.findall(r"\{((?:[^{}\"]|\"[^\"]*\")*)\}|([^{]+)", expr)
    out, _ = _jp_render(tokens, 0, root)
    return out


def _jp_render(tokens: list[tuple[str, str]], i: int, current: Any) -> tuple[str, int]:
    out: list[str] = []
    while i < len(tokens):
        inner, text = tokens[i]
        i += 1
        if text:
            out.append(text.replace("\\n", "\n").replace("\\t", "\t"))
            continue
        inner = inner.strip()
        if inner == "end":
            return "".join(out), i
        if inner.startswith("range "):
            values = _walk([current], inner[6:].strip().lstrip("@").lstrip("."))
            body_end = i
            for value in values:
                chunk, body_end = _jp_render(tokens, i, value)
                out.append(chunk)
            if not values:
                _, body_end = _jp_render(tokens, i, None)
            i = body_end
            continue
        if inner.startswith('"') and inner.endswith('"'):
            out.append(json.loads(inner))
            continue
        values = _walk([current], inner.lstrip("@").lstrip("."))
        out.append(
            " ".join(v if isinstance(v, str) else json.dumps(v, separators=(",", ":")) for v in values)
        )
    return "".join(out), i


def _walk(values: list[Any], path: str) -> list[Any]:
    for token in re.findall(r"\[\?\(@\.(\w+)==[\"']?([^\"')]*)[\"']?\)\]|\[(\*|\d+)\]|([^.\[\]]+)", path):
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


# ---------------------------------------------------------------------------------------------- apply, patch


def apply(api: common.Api, verb: str, flags: dict[str, Any]) -> int:
    """The manifest is recorded (source and SHA-256 in kubectl-apply.log); the API server keeps the objects
    it knows (and emulates known add-ons, see objects.py); other objects are recorded only."""
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
        try:
            data = Path(source).read_bytes()
        except OSError as exc:
            raise KubectlError(f'the path "{source}" does not exist') from exc
    docs = _documents(data.decode(errors="replace"))
    kinds = [f"{str(d.get('kind', '')).lower()}/{(d.get('metadata') or {}).get('name', '')}" for d in docs]
    common.LOG_DIR.mkdir(parents=True, exist_ok=True)
    with open(common.LOG_DIR / "kubectl-apply.log", "a") as out:
        record = {
            "time": time.time(),
            "verb": verb,
            "server_side": bool(flags.get("server-side")),
            "source": source,
            "sha256": hashlib.sha256(data).hexdigest(),
            "objects": kinds,
        }
        out.write(json.dumps(record) + "\n")
    namespace = str(flags.get("namespace") or "default")
    results = api.request("POST", "/standin/v1/apply", {"objects": docs, "namespace": namespace})["results"]
    failed = False
    for r in results:
        if "error" in r:
            print(r["error"].replace('from ""', f'from "{source}"'), file=sys.stderr)
            failed = True
            continue
        ref = f"{r['type']}/{r['name']}"
        if r["action"] == "recorded":
            print(f"{ref} {'created' if verb == 'create' else 'configured'} (stand-in: recorded only)")
        elif verb == "create" and r["action"] != "created":
            print(
                f'Error from server (AlreadyExists): error when creating "{source}": {ref} already exists',
                file=sys.stderr,
            )
            failed = True
        elif flags.get("server-side"):
            print(f"{ref} serverside-applied")
        else:
            print(f"{ref} {r['action']}")
    return 1 if failed else 0


def _documents(text: str) -> list[dict[str, Any]]:
    try:
        docs = [d for d in miniyaml.load_all(text) if isinstance(d, dict) and d.get("kind")]
    except Exception:  # a manifest the YAML subset cannot read: kind and name by lines
        docs = []
        doc: dict[str, Any] = {}
        for line in text.splitlines():
            if line.startswith("---"):
                doc = {}
            elif line.startswith(("kind:", "apiVersion:")):
                k, v = line.split(":", 1)
                doc[k] = v.strip()
                if k == "kind":
                    docs.append(doc)
            elif line.startswith("  name:") and doc and "metadata" not in doc:
                doc["metadata"] = {"name": line.split(":", 1)[1].strip()}
    return docs


def patch(client: Client, words: list[str]) -> int:
    flags = client.flags
    text = flags.get("patch")
    if not text:
        raise KubectlError("must specify --patch or --patch-file containing the contents of the patch")
    try:
        change = json.loads(text)
    except ValueError:
        try:
            change = miniyaml.load(text)
        except Exception as exc:
            raise KubectlError(f"unable to parse {text!r}: yaml: {exc}") from exc
    kind = str(flags.get("type") or "strategic")
    types = {
        "strategic": "application/strategic-merge-patch+json",
        "merge": "application/merge-patch+json",
    }
    if kind == "json":
        raise KubectlError("--type json is not supported by the kubectl stand-in")
    if kind not in types:
        raise KubectlError(f'--type must be one of [json merge strategic], not "{kind}"')
    status = 0
    for res, names in client.targets(words):
        if not names:
            raise KubectlError("resource(s) were provided, but no name was specified")
        for name in names:
            try:
                before = client.get(res, name)
            except NotFoundError as exc:
                print(exc, file=sys.stderr)
                status = 1
                continue
            path = res.path(client.ns(res), name)
            after = client.api.request("PATCH", path, change, {"Content-Type": types[kind]})
            same = _content(before) == _content(after)
            print(f"{type_name(res)}/{name} patched{' (no change)' if same else ''}")
    return status


def _content(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    body = {k: v for k, v in obj.items() if k not in ("metadata", "status")}
    return json.dumps([meta.get("labels"), meta.get("annotations"), body], sort_keys=True)


def delete(client: Client, words: list[str]) -> int:
    status = 0
    for res, names in client.targets(words):
        for name in names:
            try:
                client.api.request("DELETE", res.path(client.ns(res), name))
                print(f'{type_name(res)} "{name}" deleted')
            except ApiError as exc:
                if exc.status != 404:
                    raise
                print(f'Error from server (NotFound): {res.qualified} "{name}" not found', file=sys.stderr)
                status = 1
    return status


# ---------------------------------------------------------------------------------------------- waiting


def rollout(client: Client, words: list[str]) -> int:
    if not words or words[0] != "status":
        raise KubectlError(f"the rollout stand-in supports status only, not {words[:1]}")
    res, names = client.targets(words[1:])[0]
    if not names:
        raise KubectlError("required resource name is not specified")
    if res not in (objects.DEPLOYMENTS, objects.DAEMONSETS):
        raise KubectlError(f"no status viewer has been implemented for {res.kind}")
    timeout = _seconds(str(client.flags.get("timeout", "0s")))
    watch = str(client.flags.get("watch", "true")).lower() != "false"
    deadline = time.monotonic() + timeout if timeout else None
    name, last = names[0], ""
    while True:
        try:
            obj = client.get(res, name)
        except NotFoundError as exc:
            print(exc, file=sys.stderr)
            return 1
        message, done = _rollout_message(res, obj)
        if message != last:
            print(message)
            sys.stdout.flush()
            last = message
        if done or not watch:
            return 0
        if deadline is not None and time.monotonic() > deadline:
            raise KubectlError("timed out waiting for the condition")
        time.sleep(1)


def _rollout_message(res: Resource, obj: dict[str, Any]) -> tuple[str, bool]:
    """kubectl's DeploymentStatusViewer / DaemonSetStatusViewer."""
    name, meta, st = obj["metadata"]["name"], obj["metadata"], obj.get("status") or {}
    waiting = f'Waiting for deployment "{name}" rollout to finish:'
    if res == objects.DEPLOYMENTS:
        if meta.get("generation", 0) > st.get("observedGeneration", 0):
            return "Waiting for deployment spec update to be observed...", False
        want = (obj.get("spec") or {}).get("replicas", 1)
        updated, available = st.get("updatedReplicas", 0), st.get("availableReplicas", 0)
        if updated < want:
            return (
                f"{waiting} {updated} out of {want} new replicas have been updated...",
                False,
            )
        if st.get("replicas", 0) > updated:
            return (
                f"{waiting} {st['replicas'] - updated} old replicas are pending termination...",
                False,
            )
        if available < updated:
            return (
                f"{waiting} {available} of {updated} updated replicas are available...",
                False,
            )
        return f'deployment "{name}" successfully rolled out', True
    if meta.get("generation", 0) > st.get("observedGeneration", 0):
        return "Waiting for daemon set spec update to be observed...", False
    want, updated = st.get("desiredNumberScheduled", 0), st.get("updatedNumberScheduled", 0)
    available = st.get("numberAvailable", 0)
    if updated < want:
        return (
            f'Waiting for daemon set "{name}" rollout to finish: {updated} out of {want} new pods have been '
            "updated...",
            False,
        )
    if available < want:
        return (
            f'Waiting for daemon set "{name}" rollout to finish: {available} of {want} updated pods are '
            "available...",
            False,
        )
    return f'daemon set "{name}" successfully rolled out', True


def wait(client: Client, words: list[str]) -> int:
    flags = client.flags
    cond = str(flags.get("for", ""))
    deleting = cond == "delete"
    if not deleting and not cond.lower().startswith("condition="):
        raise KubectlError("--for must be condition=NAME[=VALUE] or delete (stand-in)")
    want_type, _, want_status = cond.split("=", 1)[1].partition("=") if not deleting else ("", "", "")
    timeout = _seconds(str(flags.get("timeout", "30s")))
    targets: list[tuple[Resource, str]] = []
    for res, names in client.targets(words):
        if not names and flags.get("all"):
            names = [o["metadata"]["name"] for o in client.list(res)]
        elif not names:
            raise KubectlError("resource(s) were provided, but no name was specified")
        targets += [(res, n) for n in names]
    deadline = time.monotonic() + timeout
    for res, name in targets:
        while True:
            try:
                obj = client.get(res, name)
            except NotFoundError as exc:
                if deleting:
                    print(f"{type_name(res)}/{name} condition met")
                    break
                print(exc, file=sys.stderr)
                return 1
            if not deleting:
                status = next(
                    (
                        c["status"]
                        for c in (obj.get("status") or {}).get("conditions") or []
                        if c["type"].lower() == want_type.lower()
                    ),
                    "",
                )
                if status.lower() == (want_status or "true").lower():
                    print(f"{type_name(res)}/{name} condition met")
                    break
            if time.monotonic() > deadline:
                raise KubectlError(f"timed out waiting for the condition on {res.plural}/{name}")
            time.sleep(0.5)
    return 0


# ---------------------------------------------------------------------------------------------- config


def config(flags: dict[str, Any], words: list[str]) -> int:
    sub = words[0] if words else ""
    path = common.default_kubeconfig(flags.get("kubeconfig"))
    doc: dict[str, Any] = {}
    if path is not None and path.exists():
        doc = miniyaml.load(path.read_text()) or {}
    elif flags.get("kubeconfig"):
        raise KubectlError(f"stat {path}: no such file or directory")
    if sub == "current-context":
        if not doc.get("current-context"):
            raise KubectlError("current-context is not set")
        print(doc["current-context"])
        return 0
    if sub != "view":
        raise KubectlError(f"the config stand-in supports view and current-context, not {sub!r}")
    view: dict[str, Any] = {
        "apiVersion": "v1",
        "clusters": doc.get("clusters") or [],
        "contexts": doc.get("contexts") or [],
        "current-context": doc.get("current-context", ""),
        "kind": "Config",
        "preferences": doc.get("preferences") or {},
        "users": doc.get("users") or [],
    }
    if flags.get("minify"):
        ctx = next((c for c in view["contexts"] if c.get("name") == view["current-context"]), None)
        if ctx is None:
            raise KubectlError("current-context must exist in order to minify")
        view["contexts"] = [ctx]
        view["clusters"] = [c for c in view["clusters"] if c.get("name") == ctx["context"].get("cluster")]
        view["users"] = [u for u in view["users"] if u.get("name") == ctx["context"].get("user")]
    if not flags.get("raw"):
        for section, entry in (("clusters", "cluster"), ("users", "user")):
            for item in view[section]:
                body = item.get(entry) or {}
                for k in list(body):
                    if k.endswith("-data"):
                        body[k] = "DATA+OMITTED"
                    elif k == "token":
                        body[k] = "REDACTED"
    out = str(flags.get("output") or "yaml")
    if out == "json":
        print(json.dumps(view, indent=4))
    elif out.startswith("jsonpath="):
        print(jsonpath_doc(out.split("=", 1)[1], view), end="")
    else:
        print(miniyaml.dump(view), end="")
    return 0


# ---------------------------------------------------------------------------------------------- nodes


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


def _node_names(rest: list[str]) -> list[str]:
    if rest and rest[0] in ("node", "nodes", "no"):
        return rest[1:]
    return [r.split("/", 1)[1] for r in rest if r.startswith(("node/", "nodes/"))]


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


def _seconds(text: str) -> float:
    import re

    total = 0.0
    for n, unit in re.findall(r"(\d+(?:\.\d+)?)(h|m|s)?", text):
        total += float(n) * {"h": 3600, "m": 60, "s": 1, "": 1}[unit]
    return total
