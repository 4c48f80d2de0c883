"""Shared by the stand-ins: paths, argument log (secrets redacted), openssl PKI, kubeconfigs, API client."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import json
import os
import re
import secrets
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from k8s_standin import VERSION, miniyaml

KUBE = Path(os.environ.get("K8S_STANDIN_KUBE_DIR", "/etc/kubernetes"))
PKI = KUBE / "pki"
STATE_DIR = Path(os.environ.get("K8S_STANDIN_STATE_DIR", "/var/lib/k8s-standin"))
LOG_DIR = Path(os.environ.get("K8S_STANDIN_LOG_DIR", "/var/log/kubeadm-standin"))
KUBELET_DIR = Path("/var/lib/kubelet")
API_PORT = 6443
CONNECT_TIMEOUT_S = 4.0  # TCP and TLS set-up of one stand-in HTTPS request (the answer gets the full timeout)
DEFAULT_CRI_SOCKET = "unix:///var/run/containerd/containerd.sock"
TOKEN_RE = re.compile(r"^([a-z0-9]{6})\.([a-z0-9]{16})$")
TOKEN_ANY = re.compile(r"\b([a-z0-9]{6})\.([a-z0-9]{16})\b")
CERT_KEY_RE = re.compile(r"^[0-9a-f]{64}$")
SECRET_FLAGS = ("--token", "--discovery-token", "--tls-bootstrap-token", "--certificate-key")
NODE_GRACE_S = float(os.environ.get("K8S_STANDIN_NODE_GRACE", "15"))


# ---------------------------------------------------------------- logging


def redact(value: str) -> str:
    return f"<redacted sha256:{hashlib.sha256(value.encode()).hexdigest()}>"


def redact_argv(argv: list[str]) -> list[str]:
    """argv with token secrets and certificate keys replaced by their SHA-256 (tests compare hashes)."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(redact(arg))
            hide_next = False
            continue
        flag, eq, value = arg.partition("=")
        if flag in SECRET_FLAGS:
            if eq:
                out.append(f"{flag}={redact(value)}")
            else:
                out.append(arg)
                hide_next = True
            continue
        arg = TOKEN_ANY.sub(lambda m: f"{m.group(1)}.{redact(m.group(2))}", arg)
        out.append(redact(arg) if CERT_KEY_RE.match(arg) else arg)
    return out


def log_invocation(tool: str, argv: list[str], **extra: Any) -> None:
    """Append one JSON line to /var/log/kubeadm-standin/<tool>.log (what tests assert arguments on)."""
    with contextlib.suppress(OSError):
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        entry = {"time": time.time(), "tool": tool, "argv": redact_argv(argv), "uid": os.getuid(), **extra}
        with open(LOG_DIR / f"{tool}.log", "a") as out:
            out.write(json.dumps(entry) + "\n")


def log_record(log: str, **fields: Any) -> None:
    """Append one JSON line with its time to /var/log/kubeadm-standin/<log>.log (what tests read)."""
    with contextlib.suppress(OSError):
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        with open(LOG_DIR / f"{log}.log", "a") as out:
            out.write(json.dumps({"time": time.time(), **fields}) + "\n")


def fail(message: str, code: int = 1) -> int:
    print(message, file=sys.stderr)
    return code


# ---------------------------------------------------------------- PKI (openssl CLI)


def openssl(*args: str, input: bytes | None = None) -> bytes:
    result = subprocess.run(["openssl", *args], input=input, capture_output=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args[:2])} failed: {result.stderr.decode(errors='replace')}")
    return result.stdout


def new_ca(cert: Path, key: Path, cn: str = "kubernetes") -> None:
    cert.parent.mkdir(parents=True, exist_ok=True)
    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(key),
        "-out",
        str(cert),
        "-days",
        "3650",
        "-subj",
        f"/CN={cn}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,digitalSignature,keyEncipherment,keyCertSign",
    )
    key.chmod(0o600)


def new_key_and_csr(key: Path, subject: str) -> bytes:
    """A fresh RSA key at ``key`` and the PEM CSR for ``subject`` (e.g. /O=system:nodes/CN=system:node:n1)."""
    key.parent.mkdir(parents=True, exist_ok=True)
    csr = openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-subj", subject)
    key.chmod(0o600)
    return csr


def sign(
    csr_pem: bytes, ca_cert: Path, ca_key: Path, *, server_sans: list[str] | None = None, days: int = 365
) -> bytes:
    """Sign a CSR with the cluster CA: a client cert, or a server cert when ``server_sans`` is given."""
    if server_sans is not None:
        sans = ",".join(("IP:" if _is_ip(s) else "DNS:") + s for s in dict.fromkeys(server_sans))
        ext = f"subjectAltName={sans}\nextendedKeyUsage=serverAuth\n"
        ext += "keyUsage=critical,digitalSignature,keyEncipherment\n"
    else:
        ext = "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "csr.pem").write_bytes(csr_pem)
        (Path(tmp) / "ext.cnf").write_text(ext)
        return openssl(
            "x509",
            "-req",
            "-in",
            f"{tmp}/csr.pem",
            "-CA",
            str(ca_cert),
            "-CAkey",
            str(ca_key),
            "-set_serial",
            "0x" + secrets.token_hex(16),
            "-days",
            str(days),
            "-extfile",
            f"{tmp}/ext.cnf",
        )


def issue(
    key: Path, cert: Path, subject: str, ca_cert: Path, ca_key: Path, server_sans: list[str] | None = None
) -> None:
    cert.write_bytes(sign(new_key_and_csr(key, subject), ca_cert, ca_key, server_sans=server_sans))


def ca_cert_hash(ca_pem: bytes) -> str:
    """kubeadm's --discovery-token-ca-cert-hash: sha256 of the CA's SubjectPublicKeyInfo (DER)."""
    pub = openssl("x509", "-pubkey", "-noout", input=ca_pem)
    der = openssl("pkey", "-pubin", "-outform", "DER", input=pub)
    return "sha256:" + hashlib.sha256(der).hexdigest()


def csr_subject(csr_pem: bytes) -> dict[str, str]:
    """The CSR's subject as {"CN": ..., "O": ...}."""
    text = openssl("req", "-noout", "-subject", "-nameopt", "RFC2253", input=csr_pem).decode().strip()
    return dict(re.findall(r"(?:^subject=|,)\s*([A-Za-z]+)=((?:[^,\\]|\\.)*)", text))


def _is_ip(text: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in text else socket.AF_INET, text)
    except OSError:
        return False
    return True


# ---------------------------------------------------------------- bootstrap tokens and JWS


def new_token() -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    pick = lambda n: "".join(secrets.choice(alphabet) for _ in range(n))  # noqa: E731
    return f"{pick(6)}.{pick(16)}"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jws_detached(payload: str, token_id: str, token_secret: str) -> str:
    """HS256 JWS with a detached payload, as the bootstrap signer puts in cluster-info."""
    import hmac

    header = b64url(json.dumps({"alg": "HS256", "kid": token_id}, separators=(",", ":")).encode())
    signing_input = f"{header}.{b64url(payload.encode())}".encode()
    signature = hmac.new(token_secret.encode(), signing_input, hashlib.sha256).digest()
    return f"{header}..{b64url(signature)}"


def jws_verify(payload: str, jws: str, token_id: str, token_secret: str) -> bool:
    import hmac

    return hmac.compare_digest(jws, jws_detached(payload, token_id, token_secret))


# ---------------------------------------------------------------- kubeconfig


def kubeconfig(
    server: str, ca_pem: bytes, user: str, cert_pem: bytes, key_pem: bytes, cluster: str = "kubernetes"
) -> str:
    context = f"{user}@{cluster}"
    doc = {
        "apiVersion": "v1",
        "clusters": [
            {"cluster": {"certificate-authority-data": _b64(ca_pem), "server": server}, "name": cluster}
        ],
        "contexts": [{"context": {"cluster": cluster, "user": user}, "name": context}],
        "current-context": context,
        "kind": "Config",
        "preferences": {},
        "users": [
            {
                "name": user,
                "user": {"client-certificate-data": _b64(cert_pem), "client-key-data": _b64(key_pem)},
            }
        ],
    }
    return miniyaml.dump(doc)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


class KubeConfig:
    """The current context of a kubeconfig file: server, CA, client certificate (or token)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        doc = miniyaml.load(path.read_text()) or {}
        ctx_name = doc.get("current-context")
        ctx = next((c["context"] for c in doc.get("contexts") or [] if c.get("name") == ctx_name), None)
        if ctx is None and doc.get("contexts"):
            ctx = doc["contexts"][0]["context"]
        clusters = {c["name"]: c["cluster"] for c in doc.get("clusters") or []}
        users = {u["name"]: u.get("user") or {} for u in doc.get("users") or []}
        cluster = clusters.get(ctx["cluster"]) if ctx else next(iter(clusters.values()), None)
        user = users.get(ctx["user"], {}) if ctx else {}
        if not cluster:
            raise ValueError(f"invalid kubeconfig {path}: no cluster")
        self.server: str = cluster["server"]
        self.ca_pem = _data(cluster, "certificate-authority", path)
        self.insecure = bool(cluster.get("insecure-skip-tls-verify"))
        self.cert_pem = _data(user, "client-certificate", path)
        self.key_pem = _data(user, "client-key", path)
        self.token: str | None = user.get("token")

    def api(self, timeout: float = 10.0) -> Api:
        return Api(self.server, self.ca_pem, self.cert_pem, self.key_pem, token=self.token, timeout=timeout)


def _data(section: dict[str, Any], key: str, base: Path) -> bytes | None:
    if section.get(f"{key}-data"):
        return base64.b64decode(section[f"{key}-data"])
    if section.get(key):
        return (base.parent / section[key]).read_bytes()
    return None


def default_kubeconfig(flag: str | None) -> Path | None:
    if flag:
        return Path(flag)
    env = os.environ.get("KUBECONFIG")
    if env:
        return Path(env.split(":")[0])
    home = Path(os.path.expanduser("~/.kube/config"))
    return home if home.exists() else None


# ---------------------------------------------------------------- API client


class ApiError(Exception):
    def __init__(self, status: int, message: str, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class Unreachable(Exception):
    """No TCP/TLS connection to the API server."""


class Api:
    """A small HTTPS JSON client for the stand-in API server."""

    def __init__(
        self,
        server: str,
        ca_pem: bytes | None,
        cert_pem: bytes | None = None,
        key_pem: bytes | None = None,
        *,
        token: str | None = None,
        timeout: float = 10.0,
        insecure: bool = False,
    ) -> None:
        self.host, self.port = split_endpoint(server, 443)
        self.server = server
        self.token = token
        self.timeout = timeout
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        if insecure or ca_pem is None:
            self.ctx.check_hostname = False
            self.ctx.verify_mode = ssl.CERT_NONE
        else:
            self.ctx.load_verify_locations(cadata=ca_pem.decode())
        if cert_pem and key_pem:
            with tempfile.TemporaryDirectory() as tmp:
                (Path(tmp) / "c.pem").write_bytes(cert_pem)
                (Path(tmp) / "k.pem").write_bytes(key_pem)
                self.ctx.load_cert_chain(f"{tmp}/c.pem", f"{tmp}/k.pem")

    def raw(self, method: str, path: str, data: bytes | None, headers: dict[str, str]) -> tuple[int, bytes]:
        """One HTTPS request; (status, body). Raises Unreachable, or SSLCertVerificationError."""
        # A short connect timeout, the full one for the answer: a powered-off peer (its neighbour
        # entry still fresh, so no quick "no route") must not hold a forwarded request past the
        # client's own timeout, while a slow but live answer still gets its time.
        connect = min(self.timeout, CONNECT_TIMEOUT_S)
        conn = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=connect)
        try:
            conn.connect()
            if conn.sock is not None:
                conn.sock.settimeout(self.timeout)
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        except ssl.SSLCertVerificationError:
            raise
        except (OSError, http.client.HTTPException) as exc:
            raise Unreachable(f"dial tcp {self.host}:{self.port}: {exc}") from exc
        finally:
            conn.close()

    def request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
        hdrs = {"Accept": "application/json", "User-Agent": f"k8s-standin/{VERSION}"}
        if self.token:
            hdrs["Authorization"] = f"Bearer {self.token}"
        hdrs.update(headers or {})
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        status, raw = self.raw(method, path, data, hdrs)
        try:
            payload = json.loads(raw) if raw else None
        except ValueError:
            payload = raw.decode(errors="replace")
        if status >= 400:
            message = payload.get("message") if isinstance(payload, dict) else str(payload)
            raise ApiError(status, message or str(status), payload)
        return payload

    def peer_certificate(self) -> bytes:
        """The server's certificate chain is not exposed by ssl; fetch the leaf (PEM) for diagnostics."""
        with socket.create_connection((self.host, self.port), timeout=self.timeout) as sock:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            with ctx.wrap_socket(sock, server_hostname=self.host) as tls:
                der = tls.getpeercert(binary_form=True) or b""
        return ssl.DER_cert_to_PEM_cert(der).encode()


def node_ip() -> str:
    """The address on the default-route interface, as kubeadm and kubelet pick it."""
    with contextlib.suppress(Exception):
        routes = json.loads(
            subprocess.run(
                ["ip", "-j", "-4", "route", "show", "default"], capture_output=True, text=True
            ).stdout
        )
        dev = routes[0]["dev"]
        addrs = json.loads(
            subprocess.run(
                ["ip", "-j", "-4", "addr", "show", "dev", dev], capture_output=True, text=True
            ).stdout
        )
        return str(addrs[0]["addr_info"][0]["local"])
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    return out[0] if out else "127.0.0.1"


def hostname() -> str:
    return socket.gethostname().lower()


def split_endpoint(endpoint: str, default_port: int = API_PORT) -> tuple[str, int]:
    endpoint = endpoint.removeprefix("https://").rstrip("/")
    if endpoint.startswith("["):
        host, _, rest = endpoint[1:].partition("]")
        return host, int(rest.lstrip(":") or default_port)
    if endpoint.count(":") == 1:
        host, port = endpoint.split(":")
        return host, int(port)
    return endpoint, default_port


def now_iso(ts: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts if ts is not None else time.time()))


def selected(obj: dict[str, Any], selector: str | None) -> bool:
    """Equality-based label selectors (``a=b,c!=d,e``)."""
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in filter(None, (t.strip() for t in (selector or "").split(","))):
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


def version_info() -> dict[str, str]:
    major, minor = VERSION.lstrip("v").split(".")[:2]
    return {
        "major": major,
        "minor": minor,
        "gitVersion": VERSION,
        "gitCommit": "standin",
        "gitTreeState": "clean",
        "buildDate": "2024-12-10T00:00:00Z",
        "goVersion": "go1.22.9",
        "compiler": "gc",
        "platform": "linux/amd64",
    }
