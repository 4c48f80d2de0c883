"""kube-apiserver-standin: the cluster state a control plane serves on :6443 (TLS with the cluster CA).

Serves a k8s-shaped subset (``/version``, ``/healthz``, cluster-info with JWS signatures, ``/api/v1/nodes``
with merge-patch; the leader logs each cordon and uncordon, with its time, in apiserver.log) plus
``/standin/v1/...`` for what kubeadm does through Secrets (bootstrap tokens, TLS bootstrap, the
certificate key, control-plane members). Every control plane runs one; the first reachable
member (in join order) is the leader: the others forward requests to it and receive its state after each
change, so a load-balanced endpoint answers the same from any control plane and a follower takes over
when the leader is gone.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import json
import os
import ssl
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from k8s_standin import VERSION, common, objects
from k8s_standin.common import PKI, STATE_DIR, Api, Unreachable

STATE_FILE = STATE_DIR / "cluster.json"
PEER_SECRET = STATE_DIR / "peer.secret"
ADMIN_GROUPS = {"system:masters", "kubeadm:cluster-admins"}
CERT_KEY_TTL_S = 2 * 3600


class Store:
    """The cluster state (JSON file); every mutation bumps ``revision``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.RLock()
        self.data: dict[str, Any] = json.loads(path.read_text())

    def save(self) -> None:
        with self.lock:
            self.data["revision"] = int(self.data.get("revision", 0)) + 1
            self._write()

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(self.data, out)
        tmp.replace(self.path)

    def adopt(self, snapshot: dict[str, Any]) -> bool:
        with self.lock:
            if int(snapshot.get("revision", 0)) <= int(self.data.get("revision", 0)):
                return False
            self.data = snapshot
            self._write()
            return True

    def valid_token(self, token: str) -> dict[str, Any] | None:
        match = common.TOKEN_RE.match(token or "")
        if not match:
            return None
        with self.lock:
            self.expire_old()
            record = self.data["tokens"].get(match.group(1))
            if record and hmac.compare_digest(record["secret"], match.group(2)):
                return dict(record)
        return None

    def expire_old(self) -> None:
        """Like the token cleaner: expired bootstrap tokens and the expired certs Secret disappear."""
        now = time.time()
        with self.lock:
            gone = [tid for tid, t in self.data["tokens"].items() if t.get("expires") and t["expires"] <= now]
            for tid in gone:
                del self.data["tokens"][tid]
            key = self.data.get("certificateKey")
            if key and key["expires"] <= now:
                self.data["certificateKey"] = None
                gone.append("certificateKey")
            if gone:
                self.save()


class Server:
    def __init__(self, name: str, address: str, port: int) -> None:
        self.name = name
        self.address = f"{address}:{port}"
        self.store = Store(STATE_FILE)
        self.peer_secret = PEER_SECRET.read_text().strip()
        self.ca_pem = (PKI / "ca.crt").read_bytes()
        self._health: dict[str, tuple[float, bool]] = {}
        self._push = threading.Event()

    # ------------------------------------------------------------ leadership and replication

    def leader(self) -> str | None:
        """Address of the leader, or None when it is us."""
        for member in self.store.data.get("members", []):
            if member["name"] == self.name:
                return None
            if self.healthy(member["address"]):
                return str(member["address"])
        return None

    def healthy(self, address: str) -> bool:
        cached = self._health.get(address)
        if cached and time.monotonic() - cached[0] < 2.0:
            return cached[1]
        try:
            Api(f"https://{address}", self.ca_pem, timeout=1.5).raw("GET", "/healthz", None, {})
            ok = True
        except Exception:
            ok = False
        self._health[address] = (time.monotonic(), ok)
        return ok

    def peer_api(self, address: str, timeout: float = 10.0) -> Api:
        return Api(f"https://{address}", self.ca_pem, timeout=timeout)

    def peer_headers(self, identity: dict[str, Any]) -> dict[str, str]:
        return {"X-Standin-Peer": self.peer_secret, "X-Standin-Identity": json.dumps(identity)}

    def replicator(self) -> None:
        """Push the state to the other members after changes (coalesced)."""
        while True:
            self._push.wait()
            self._push.clear()
            with self.store.lock:
                snapshot = json.dumps(self.store.data).encode()
                members = [m for m in self.store.data.get("members", []) if m["name"] != self.name]
            for member in members:
                with contextlib.suppress(Exception):
                    headers = {**self.peer_headers({"kind": "peer"}), "Content-Type": "application/json"}
                    self.peer_api(member["address"], 3).raw(
                        "POST", "/standin/v1/peer/replicate", snapshot, headers
                    )

    def catch_up(self) -> None:
        """At start, take the newest state any other member has (we may have been down while it changed)."""
        for member in self.store.data.get("members", []):
            if member["name"] == self.name:
                continue
            with contextlib.suppress(Exception):
                status, body = self.peer_api(member["address"], timeout=2).raw(
                    "GET", "/standin/v1/peer/snapshot", None, self.peer_headers({"kind": "peer"})
                )
                if status == 200 and self.store.adopt(json.loads(body)):
                    print(
                        f"caught up from {member['name']} (revision {self.store.data['revision']})",
                        flush=True,
                    )

    def changed(self) -> None:
        self.store.save()
        self._push.set()


class Handler(BaseHTTPRequestHandler):
    server: TLSServer
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        self.request.settimeout(15)

    def log_message(self, format: str, *args: Any) -> None:
        print(f"{self.client_address[0]} {format % args}", flush=True)

    def do_GET(self) -> None:
        self.dispatch("GET")

    def do_POST(self) -> None:
        self.dispatch("POST")

    def do_PUT(self) -> None:
        self.dispatch("PUT")

    def do_PATCH(self) -> None:
        self.dispatch("PATCH")

    def do_DELETE(self) -> None:
        self.dispatch("DELETE")

    # ------------------------------------------------------------ plumbing

    def reply(self, status: int, body: Any) -> None:
        if isinstance(body, bytes):
            data, ctype = body, "application/json"
        elif isinstance(body, str):
            data, ctype = body.encode(), "text/plain; charset=utf-8"
        else:
            data, ctype = json.dumps(body).encode(), "application/json"
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def status(self, code: int, reason: str, message: str) -> None:
        self.reply(
            code,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "message": message,
                "reason": reason,
                "code": code,
            },
        )

    def body(self) -> Any:
        return json.loads(self.raw_body) if self.raw_body else {}

    def identity(self) -> dict[str, Any]:
        srv = self.server.app
        peer = self.headers.get("X-Standin-Peer")
        if peer and hmac.compare_digest(peer, srv.peer_secret):
            return dict(json.loads(self.headers.get("X-Standin-Identity") or "{}"), via_peer=True)
        cert = self.connection.getpeercert() if isinstance(self.connection, ssl.SSLSocket) else None
        if cert:
            subject = {k: v for rdn in cert.get("subject", ()) for k, v in rdn}
            cn, org = subject.get("commonName", ""), subject.get("organizationName", "")
            if org in ADMIN_GROUPS:
                return {"kind": "admin", "name": cn}
            if org == "system:nodes" and cn.startswith("system:node:"):
                return {"kind": "node", "name": cn.removeprefix("system:node:")}
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            return {"kind": "bootstrap", "token": auth.removeprefix("Bearer ").strip()}
        return {"kind": "anonymous"}

    def dispatch(self, method: str) -> None:
        try:
            self._dispatch(method)
        except Exception as exc:  # report, keep serving
            print(f"error: {type(exc).__name__}: {exc}", flush=True)
            with contextlib.suppress(Exception):
                self.status(500, "InternalError", f"{type(exc).__name__}: {exc}")

    def _dispatch(self, method: str) -> None:
        path = urllib.parse.urlsplit(self.path).path.rstrip("/") or "/"
        length = int(self.headers.get("Content-Length") or 0)
        self.raw_body = self.rfile.read(length) if length else b""
        app = self.server.app
        if path in ("/healthz", "/readyz", "/livez"):
            return self.reply(200, "ok")
        if path == "/version":  # indented, as the API server writes it
            return self.reply(200, (json.dumps(common.version_info(), indent=2) + "\n").encode())
        ident = self.identity()
        if path.startswith("/standin/v1/peer/"):
            if not ident.get("via_peer"):
                return self.status(403, "Forbidden", "peers only")
            return self.peer(method, path)
        for _ in range(2):
            leader = app.leader()
            if leader is None:
                break
            try:
                return self.forward(leader, method, ident)
            except Unreachable:
                app._health[leader] = (time.monotonic(), False)
        return self.local(method, path, ident)

    def forward(self, leader: str, method: str, ident: dict[str, Any]) -> None:
        app = self.server.app
        data = self.raw_body or None
        headers = {"Content-Type": self.headers.get("Content-Type", "application/json")}
        if ident.get("kind") == "bootstrap":
            headers["Authorization"] = self.headers["Authorization"]
        headers.update(app.peer_headers({k: v for k, v in ident.items() if k != "via_peer"}))
        status, body = app.peer_api(leader).raw(method, self.path, data, headers)
        self.reply(status, body)

    def peer(self, method: str, path: str) -> None:
        app = self.server.app
        if path == "/standin/v1/peer/replicate" and method == "POST":
            return self.reply(200, {"adopted": app.store.adopt(self.body())})
        if path == "/standin/v1/peer/snapshot" and method == "GET":
            with app.store.lock:
                return self.reply(200, app.store.data)
        return self.status(404, "NotFound", path)

    # ------------------------------------------------------------ the API (leader-local)

    def local(self, method: str, path: str, ident: dict[str, Any]) -> None:
        app = self.server.app
        store = app.store
        store.expire_old()
        now = time.time()
        with store.lock:  # the emulated operators (see objects.py)
            if objects.reconcile(store.data, self.node_list(), now):
                app.changed()
        kind = ident.get("kind")
        parts = path.strip("/").split("/")
        if path == "/api/v1/namespaces/kube-public/configmaps/cluster-info" and method == "GET":
            return self.reply(200, cluster_info(store, app.ca_pem))
        if path == "/standin/v1/bootstrap" and method == "POST":
            return self.tls_bootstrap(ident)
        if path == "/standin/v1/download-certs" and method == "POST":
            return self.download_certs(ident)
        if parts[:3] == ["api", "v1", "nodes"]:
            return self.nodes(method, parts[3:], ident)
        if kind != "admin":
            return self.status(
                401 if kind in ("anonymous", "bootstrap") else 403, "Unauthorized", "Unauthorized"
            )
        if path == "/standin/v1/tokens":
            if method == "GET":
                with store.lock:
                    return self.reply(200, {"items": token_list(store)})
            if method == "POST":
                req = self.body()
                token = req.get("token") or common.new_token()
                if not common.TOKEN_RE.match(token):
                    return self.status(400, "Invalid", f'the bootstrap token "{token}" was not of the form')
                ttl = float(req.get("ttlSeconds", 86400))
                tid, secret = token.split(".")
                with store.lock:
                    store.data["tokens"][tid] = {
                        "secret": secret,
                        "expires": time.time() + ttl if ttl > 0 else None,
                        "usages": req.get("usages") or ["authentication", "signing"],
                        "groups": req.get("groups") or ["system:bootstrappers:kubeadm:default-node-token"],
                        "description": req.get("description", ""),
                        "created": time.time(),
                    }
                    app.changed()
                return self.reply(201, {"token": token})
        if parts[:3] == ["standin", "v1", "tokens"] and len(parts) == 4 and method == "DELETE":
            with store.lock:
                if store.data["tokens"].pop(parts[3], None) is None:
                    return self.status(404, "NotFound", f'secrets "bootstrap-token-{parts[3]}" not found')
                app.changed()
            return self.reply(200, {"deleted": parts[3]})
        if path == "/standin/v1/certificate-key" and method == "PUT":
            req = self.body()
            with store.lock:
                store.data["certificateKey"] = {
                    "sha256": req["sha256"],
                    "expires": time.time() + float(req.get("ttlSeconds", CERT_KEY_TTL_S)),
                }
                app.changed()
            return self.reply(200, {"ok": True})
        if path == "/standin/v1/expire" and method == "POST":
            req = self.body()
            past = time.time() - 1
            with store.lock:
                if req.get("tokens", True):
                    for record in store.data["tokens"].values():
                        record["expires"] = past
                if req.get("certificateKey", True) and store.data.get("certificateKey"):
                    store.data["certificateKey"]["expires"] = past
                app.changed()
            store.expire_old()
            return self.reply(200, {"expired": True})
        if path == "/standin/v1/members":
            if method == "GET":
                return self.reply(200, {"items": store.data["members"]})
            if method == "POST":
                req = self.body()
                with store.lock:
                    members = [m for m in store.data["members"] if m["name"] != req["name"]]
                    members.append({"name": req["name"], "address": req["address"]})
                    store.data["members"] = members
                    app.changed()
                return self.reply(200, {"items": members})
        if parts[:3] == ["standin", "v1", "members"] and len(parts) == 4 and method == "DELETE":
            with store.lock:
                store.data["members"] = [m for m in store.data["members"] if m["name"] != parts[3]]
                app.changed()
            return self.reply(200, {"items": store.data["members"]})
        if path == "/standin/v1/state" and method == "GET":
            with store.lock:
                return self.reply(200, public_state(store.data))
        if path == "/standin/v1/apply" and method == "POST":
            req = self.body()
            with store.lock:
                results = objects.apply(
                    store.data, req.get("objects") or [], req.get("namespace") or "default", now
                )
                app.changed()
            return self.reply(200, {"results": results})
        with store.lock:
            found = objects.route(path, objects.resources(store.data))
        if found is not None:
            return self.objects_api(method, *found)
        return self.status(404, "NotFound", f"the server could not find the requested resource ({path})")

    def node_list(self) -> list[dict[str, Any]]:
        store = self.server.app.store
        with store.lock:
            return [node_object(n) for _, n in sorted(store.data["nodes"].items())]

    def objects_api(self, method: str, res: objects.Resource, namespace: str, name: str) -> None:
        """Namespaces, configmaps, deployments, daemonsets, CRDs, custom resources (admin only)."""
        app = self.server.app
        store = app.store
        now = time.time()
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        try:
            with store.lock:
                if method == "GET" and name:
                    obj = objects.get(store.data, res, namespace, name)
                    if obj is None:
                        raise objects.not_found(res, name)
                    return self.reply(200, objects.render(store.data, obj, self.node_list(), now))
                if method == "GET":
                    items = objects.list_objects(store.data, res, namespace)
                    selector = (query.get("labelSelector") or [""])[0]
                    nodes = self.node_list()
                    rendered = [objects.render(store.data, o, nodes, now) for o in items]
                    rendered = [o for o in rendered if common.selected(o, selector)]
                    return self.reply(
                        200,
                        {
                            "apiVersion": res.api_version,
                            "kind": f"{res.kind}List",
                            "items": rendered,
                            "metadata": {"resourceVersion": str(store.data.get("revision", 1))},
                        },
                    )
                if method == "POST" and not name:
                    body = self.body()
                    body.setdefault("metadata", {})
                    if res.namespaced:
                        body["metadata"]["namespace"] = namespace
                    key = body["metadata"].get("name", "")
                    if objects.get(store.data, res, namespace, key) is not None:
                        raise objects.ApiProblem(
                            409, "AlreadyExists", f'{res.qualified} "{key}" already exists'
                        )
                    obj, _ = objects.put(store.data, res, body, now)
                    app.changed()
                    return self.reply(201, objects.render(store.data, obj, self.node_list(), now))
                if method == "PATCH" and name:
                    ctype = self.headers.get("Content-Type", "application/merge-patch+json")
                    obj = objects.patch(store.data, res, namespace, name, self.body(), ctype, now)
                    app.changed()
                    return self.reply(200, objects.render(store.data, obj, self.node_list(), now))
                if method == "DELETE" and name:
                    objects.delete(store.data, res, namespace, name)
                    app.changed()
                    return self.reply(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
        except objects.ApiProblem as exc:
            return self.status(exc.code, exc.reason, exc.message)
        return self.status(405, "MethodNotAllowed", f"{method} is not supported on {self.path}")

    def tls_bootstrap(self, ident: dict[str, Any]) -> None:
        """Sign a kubelet client CSR for a valid bootstrap token (kubeadm join's TLS bootstrap)."""
        app = self.server.app
        if ident.get("kind") != "bootstrap" or not app.store.valid_token(ident["token"]):
            return self.status(401, "Unauthorized", "Unauthorized")
        req = self.body()
        csr = req["csr"].encode()
        subject = common.csr_subject(csr)
        if subject.get("O") != "system:nodes" or not subject.get("CN", "").startswith("system:node:"):
            return self.status(403, "Forbidden", f"CSR subject {subject} is not a node identity")
        cert = common.sign(csr, PKI / "ca.crt", PKI / "ca.key")
        return self.reply(201, {"certificate": cert.decode()})

    def download_certs(self, ident: dict[str, Any]) -> None:
        """The control-plane certificates (kubeadm-certs Secret), for a valid token and certificate key."""
        app = self.server.app
        if ident.get("kind") != "bootstrap" or not app.store.valid_token(ident["token"]):
            return self.status(401, "Unauthorized", "Unauthorized")
        key = self.body().get("certificateKey", "")
        with app.store.lock:
            stored = app.store.data.get("certificateKey")
            if not stored:
                return self.status(404, "NotFound", 'secrets "kubeadm-certs" not found')
            if not hmac.compare_digest(stored["sha256"], hashlib.sha256(key.encode()).hexdigest()):
                return self.status(403, "Forbidden", "cipher: message authentication failed")
            snapshot = json.loads(json.dumps(app.store.data))
        files = {name: (PKI / name).read_text() for name in ("ca.crt", "ca.key", "sa.key", "sa.pub")}
        return self.reply(200, {"files": files, "peerSecret": app.peer_secret, "snapshot": snapshot})

    def nodes(self, method: str, rest: list[str], ident: dict[str, Any]) -> None:
        app = self.server.app
        store = app.store
        kind = ident.get("kind")
        if kind not in ("admin", "node"):
            return self.status(
                401 if kind in ("anonymous", "bootstrap") else 403, "Unauthorized", "Unauthorized"
            )
        if not rest:
            if method == "GET":
                with store.lock:
                    items = [node_object(n) for _, n in sorted(store.data["nodes"].items())]
                return self.reply(
                    200, {"apiVersion": "v1", "kind": "NodeList", "items": items, "metadata": {}}
                )
            if method == "POST":  # kubelet registers its node
                obj = self.body()
                name = obj["metadata"]["name"]
                if kind == "node" and ident["name"] != name:
                    return self.status(
                        403, "Forbidden", f"node {ident['name']!r} cannot create node {name!r}"
                    )
                with store.lock:
                    if name in store.data["nodes"]:
                        return self.status(409, "AlreadyExists", f'nodes "{name}" already exists')
                    store.data["nodes"][name] = {
                        "name": name,
                        "uid": str(uuid.uuid4()),
                        "created": time.time(),
                        "labels": obj["metadata"].get("labels") or {},
                        "annotations": obj["metadata"].get("annotations") or {},
                        "taints": (obj.get("spec") or {}).get("taints") or [],
                        "unschedulable": False,
                        "status": obj.get("status") or {},
                        "heartbeat": time.time(),
                        "ready": False,
                    }
                    app.changed()
                    return self.reply(201, node_object(store.data["nodes"][name]))
        name = rest[0]
        with store.lock:
            record = store.data["nodes"].get(name)
            if record is None:
                return self.status(404, "NotFound", f'nodes "{name}" not found')
            if method == "GET" and len(rest) == 1:
                return self.reply(200, node_object(record))
            if method == "PATCH" and rest[1:] == ["status"]:  # kubelet heartbeat
                if kind == "node" and ident["name"] != name:
                    return self.status(403, "Forbidden", "a node may only update its own status")
                status = self.body().get("status", {})
                record["status"].update({k: v for k, v in status.items() if k != "ready"})
                record["ready"] = bool(status.get("ready"))
                record["reason"] = status.get("reason", "")
                record["heartbeat"] = time.time()
                app.changed()
                return self.reply(200, node_object(record))
            if kind != "admin":
                return self.status(403, "Forbidden", f'nodes "{name}" is forbidden')
            if method == "PATCH" and len(rest) == 1:
                patch = self.body()
                labels = (patch.get("metadata") or {}).get("labels") or {}
                for key, value in labels.items():
                    if value is None:
                        record["labels"].pop(key, None)
                    else:
                        record["labels"][key] = value
                spec = patch.get("spec") or {}
                if "taints" in spec:
                    record["taints"] = spec["taints"] or []
                if "unschedulable" in spec:
                    value = bool(spec["unschedulable"])
                    if value != bool(record.get("unschedulable")):  # cordoned or uncordoned: when, by whom
                        common.log_record(
                            "apiserver",
                            change="unschedulable",
                            node=name,
                            value=value,
                            by=ident.get("name", ""),
                        )
                    record["unschedulable"] = value
                app.changed()
                return self.reply(200, node_object(record))
            if method == "DELETE" and len(rest) == 1:
                del store.data["nodes"][name]
                app.changed()
                return self.reply(200, {"kind": "Status", "status": "Success"})
        return self.status(405, "MethodNotAllowed", method)


class TLSServer(ThreadingHTTPServer):
    """TLS per connection in the handler thread (a silent client cannot block accept)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], app: Server, ctx: ssl.SSLContext) -> None:
        super().__init__(address, Handler)
        self.app = app
        self.ctx = ctx

    def get_request(self) -> tuple[Any, Any]:
        sock, addr = self.socket.accept()
        return self.ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

    def finish_request(self, request: Any, client_address: Any) -> None:
        try:
            request.settimeout(10)
            request.do_handshake()
        except (OSError, ssl.SSLError):
            return
        super().finish_request(request, client_address)


def cluster_info(store: Store, ca_pem: bytes) -> dict[str, Any]:
    """kube-public/cluster-info: the CA and endpoint, signed (JWS) with every valid bootstrap token."""
    endpoint = store.data["cluster"]["controlPlaneEndpoint"]
    kubeconfig = common.miniyaml.dump(
        {
            "apiVersion": "v1",
            "clusters": [
                {
                    "cluster": {
                        "certificate-authority-data": common._b64(ca_pem),
                        "server": f"https://{endpoint}",
                    },
                    "name": "",
                }
            ],
            "contexts": [],
            "current-context": "",
            "kind": "Config",
            "preferences": {},
            "users": [],
        }
    )
    data = {"kubeconfig": kubeconfig}
    with store.lock:
        for tid, token in store.data["tokens"].items():
            if "signing" in token.get("usages", []):
                data[f"jws-kubeconfig-{tid}"] = common.jws_detached(kubeconfig, tid, token["secret"])
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cluster-info", "namespace": "kube-public"},
        "data": data,
    }


def token_list(store: Store) -> list[dict[str, Any]]:
    return [
        {
            "token": f"{tid}.{t['secret']}",
            "expires": t.get("expires"),
            "usages": t.get("usages", []),
            "groups": t.get("groups", []),
            "description": t.get("description", ""),
        }
        for tid, t in sorted(store.data["tokens"].items(), key=lambda kv: kv[1].get("created", 0))
    ]


def public_state(data: dict[str, Any]) -> dict[str, Any]:
    """The state without secrets (token secrets, certificate key hash)."""
    out = json.loads(json.dumps(data))
    out["tokens"] = {tid: {k: v for k, v in t.items() if k != "secret"} for tid, t in out["tokens"].items()}
    if out.get("certificateKey"):
        out["certificateKey"] = {"expires": out["certificateKey"]["expires"]}
    return out


def node_object(record: dict[str, Any]) -> dict[str, Any]:
    """A v1 Node as kubectl -o json shows it; Ready goes Unknown when the kubelet stops posting status."""
    now = time.time()
    status = record.get("status") or {}
    fresh = now - float(record.get("heartbeat", 0)) < common.NODE_GRACE_S
    if not fresh:
        ready = ("Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status.")
    elif record.get("ready"):
        ready = ("True", "KubeletReady", "kubelet is posting ready status")
    else:
        ready = ("False", "KubeletNotReady", record.get("reason") or "container runtime is down")
    heartbeat = common.now_iso(float(record.get("heartbeat", now)))
    conditions = [
        {
            "type": t,
            "status": "False",
            "reason": f"KubeletHasSufficient{t.removesuffix('Pressure')}",
            "message": "",
            "lastHeartbeatTime": heartbeat,
            "lastTransitionTime": common.now_iso(record["created"]),
        }
        for t in ("MemoryPressure", "DiskPressure", "PIDPressure")
    ]
    conditions.append(
        {
            "type": "Ready",
            "status": ready[0],
            "reason": ready[1],
            "message": ready[2],
            "lastHeartbeatTime": heartbeat,
            "lastTransitionTime": heartbeat,
        }
    )
    spec: dict[str, Any] = {}
    if record.get("taints"):
        spec["taints"] = record["taints"]
    if record.get("unschedulable"):
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": record["name"],
            "uid": record["uid"],
            "creationTimestamp": common.now_iso(record["created"]),
            "labels": record.get("labels", {}),
            "annotations": record.get("annotations", {}),
        },
        "spec": spec,
        "status": {
            "addresses": status.get("addresses", []),
            "conditions": conditions,
            "nodeInfo": status.get("nodeInfo", {}),
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        },
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kube-apiserver-standin")
    parser.add_argument("--name", required=True, help="this control plane's node name")
    parser.add_argument("--advertise-address", required=True)
    parser.add_argument("--bind-address", default="0.0.0.0")
    parser.add_argument("--secure-port", type=int, default=common.API_PORT)
    args = parser.parse_args(argv)
    app = Server(args.name, args.advertise_address, args.secure_port)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(PKI / "apiserver.crt"), str(PKI / "apiserver.key"))
    ctx.load_verify_locations(str(PKI / "ca.crt"))
    ctx.verify_mode = ssl.CERT_OPTIONAL
    httpd = TLSServer((args.bind_address, args.secure_port), app, ctx)
    app.catch_up()
    threading.Thread(target=app.replicator, daemon=True).start()
    print(
        f"kube-apiserver-standin {VERSION} ({args.name}) serving on {args.bind_address}:{args.secure_port}",
        flush=True,
    )
    httpd.serve_forever()
    return 0
