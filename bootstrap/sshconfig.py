"""holodeck's ``spec.auth.sshConfig``: how ``tetherctl bootstrap --inventory env.yaml`` reaches the nodes.

The shape (holodeck's field names; keys match case-insensitively, as Go's JSON decoding does)::

    auth:
      username: ubuntu
      privateKey: ./id_ed25519            # a local file
      sshConfig:
        bastion:                          # connect here first, then to the node through it
          host: bastion.example.com       # HOST or HOST:PORT (tether also takes port: N)
          username: ec2-user              # default: auth.username
          privateKey: ./bastion.pem       # default: the node's credentials
        useAgent: true                    # offer the ssh-agent's keys (to the node)
        agentSocket: /run/user/1000/ssh-agent.sock   # default $SSH_AUTH_SOCK
        knownHostsPolicy: strict          # strict (tether's default) | accept-new | off
        connectTimeout: 10s               # TCP connect (Go durations: 500ms, 30s, 1m30s; or seconds)
        handshakeTimeout: 15s             # SSH handshake and login
        keepaliveInterval: 30s
        maxRetries: 3                     # connection attempts, 1 s apart (default 1)

Pure (no SSH library, nothing of the controller): the spec validator runs this same ``parse``
(``controller/spec/parse_sources``), so ``env validate`` and the bootstrap never disagree.
Nothing here is a credential: keys are named by path and read only when the bootstrap runs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

POLICIES = ("strict", "accept-new", "off")
DEFAULT_PORT = 22
MAX_SECONDS = 3600.0
MAX_RETRIES = 100
DURATIONS = (
    ("connectTimeout", "connect_timeout"),
    ("handshakeTimeout", "handshake_timeout"),
    ("keepaliveInterval", "keepalive_interval"),
)
FIELDS = (
    "bastion",
    "useAgent",
    "agentSocket",
    "knownHostsPolicy",
    "connectTimeout",
    "handshakeTimeout",
    "keepaliveInterval",
    "maxRetries",
)
BASTION_FIELDS = ("host", "port", "username", "privateKey")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_RE = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:ns|us|µs|μs|ms|s|m|h)")
_PART_RE = re.compile(r"([0-9]*\.?[0-9]*)(ns|us|µs|μs|ms|s|m|h)")
_HOST_RE = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::(?P<port>[0-9]{1,5}))?")
_USER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\$?")


@dataclass(frozen=True)
class Bastion:
    host: str
    port: int = DEFAULT_PORT
    username: str = ""  # empty: the node's username
    private_key: str = ""  # a local file path; empty: the node's credentials

    @property
    def endpoint(self) -> str:
        """``[USER@]HOST:PORT`` (IPv6 in brackets), as ``SshEndpoint.parse`` reads it."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return (f"{self.username}@" if self.username else "") + f"{host}:{self.port}"


@dataclass(frozen=True)
class SshConfig:
    bastion: Bastion | None = None
    use_agent: bool = False
    agent_socket: str = ""
    known_hosts_policy: str = ""  # empty: not given (tether verifies strictly)
    connect_timeout: float | None = None  # seconds; None: tether's default
    handshake_timeout: float | None = None
    keepalive_interval: float | None = None
    max_retries: int | None = None  # connection attempts; None: one


def parse_duration(value: Any) -> float:
    """Seconds from a Go duration (``30s``, ``1m30s``, ``500ms``, ``0``) or a plain number of seconds."""
    if isinstance(value, bool) or value is None:
        raise ValueError("must be a duration such as 30s, 1m30s or 500ms")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = str(value).strip()
        if re.fullmatch(r"[0-9]+(?:\.[0-9]+)?", text):
            return parse_duration(float(text))  # plain seconds (Go would want a unit)
        if not text or not re.fullmatch(f"(?:{_DURATION_RE.pattern})+", text):
            raise ValueError("must be a duration such as 30s, 1m30s or 500ms")
        seconds = sum(float(num) * _UNITS[unit] for num, unit in _PART_RE.findall(text) if num)
    if not 0 <= seconds <= MAX_SECONDS:
        raise ValueError(f"must be from 0 to {MAX_SECONDS:.0f}s")
    return seconds


def check_duration(text: str) -> str:
    """The reason ``text`` is not a usable duration, or ``""``."""
    try:
        parse_duration(text)
    except ValueError as exc:
        return str(exc)
    return ""


def split_host(value: str) -> tuple[str, int | None]:
    """``HOST``, ``HOST:PORT`` or ``[V6]:PORT`` -> (host, port or None)."""
    m = _HOST_RE.fullmatch(value.strip())
    if not m:
        raise ValueError("must be a host name or address, optionally with :PORT")
    port = int(m.group("port")) if m.group("port") else None
    if port is not None and not 0 < port < 65536:
        raise ValueError("port must be from 1 to 65535")
    return m.group("host").strip("[]"), port


def check_host(text: str) -> str:
    try:
        split_host(text)
    except ValueError as exc:
        return str(exc)
    return ""


def check_user(text: str) -> str:
    return "" if _USER_RE.fullmatch(text) else "not a user name"


def check_path(text: str) -> str:
    if len(text) > 4096 or any(c in text for c in "\0\n\r"):
        return "not a file path"
    return ""


def parse(raw: Any, path: str = "spec.auth.sshConfig") -> tuple[SshConfig, list[tuple[str, str]], list[str]]:
    """The config, every problem as ``(path, message)``, and the paths of fields tether does not know."""
    problems: list[tuple[str, str]] = []
    unknown: list[str] = []
    if raw is None:
        return SshConfig(), problems, unknown
    if not isinstance(raw, Mapping):
        return SshConfig(), [(path, "must be a mapping")], unknown
    values = _fields(raw, FIELDS, path, problems, unknown)
    bastion = None
    if "bastion" in values:
        key, value = values["bastion"]
        bastion = _bastion(value, _child(path, key), problems, unknown)
    out: dict[str, Any] = {}
    if "useAgent" in values:
        key, value = values["useAgent"]
        if isinstance(value, bool):
            out["use_agent"] = value
        elif value is not None:
            problems.append((_child(path, key), "must be true or false"))
    for name, attr, check in (
        ("agentSocket", "agent_socket", check_path),
        ("knownHostsPolicy", "known_hosts_policy", _check_policy),
    ):
        if name in values:
            key, value = values[name]
            text = _text(value, _child(path, key), problems, check)
            if text:
                out[attr] = text
    for name, attr in DURATIONS:
        if name in values:
            key, value = values[name]
            if value is None or value == "":
                continue
            try:
                seconds = parse_duration(value)
            except ValueError as exc:
                problems.append((_child(path, key), f"{exc} (got {str(value)[:40]!r})"))
                continue
            if seconds > 0:  # holodeck: zero means the default
                out[attr] = seconds
    if "maxRetries" in values:
        key, value = values["maxRetries"]
        if value is None:
            pass
        elif isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_RETRIES:
            problems.append((_child(path, key), f"must be a whole number from 0 to {MAX_RETRIES}"))
        elif value > 0:  # holodeck: zero means the default
            out["max_retries"] = value
    return SshConfig(bastion=bastion, **out), problems, unknown


def _fields(
    raw: Mapping[Any, Any],
    names: tuple[str, ...],
    path: str,
    problems: list[tuple[str, str]],
    unknown: list[str],
) -> dict[str, tuple[str, Any]]:
    """``{canonical name: (key as written, value)}``, matching keys case-insensitively."""
    by_lower = {n.lower(): n for n in names}
    found: dict[str, tuple[str, Any]] = {}
    for key, value in raw.items():
        name = by_lower.get(str(key).lower())
        if name is None:
            unknown.append(_child(path, key))
        elif name in found:
            problems.append((_child(path, key), f"given twice (also as {found[name][0]!r})"))
        else:
            found[name] = (str(key), value)
    return found


def _child(path: str, key: Any) -> str:
    """``path.key``, a key with ``.``, ``[``, ``]`` or ``"`` quoted: the spec reader's paths
    (``tether.controller.spec.reader.child_path``), so the validator reports the same ones."""
    text = str(key)
    if not text or any(c in text for c in '.[]"'):
        return f"{path}[{json.dumps(text, ensure_ascii=False)}]"
    return f"{path}.{text}"


def _text(value: Any, path: str, problems: list[tuple[str, str]], check: Any) -> str:
    if value is None or value == "":
        return ""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        problems.append((path, "must be a string"))
        return ""
    text = str(value)
    reason = str(check(text))
    if reason:
        problems.append((path, f"{reason} (got {text[:80]!r})"))
        return ""
    return text


def _check_policy(text: str) -> str:
    return "" if text in POLICIES else f"must be one of {', '.join(POLICIES)}"


def _bastion(raw: Any, path: str, problems: list[tuple[str, str]], unknown: list[str]) -> Bastion | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        problems.append((path, "must be a mapping"))
        return None
    values = _fields(raw, BASTION_FIELDS, path, problems, unknown)
    host_key, host_value = values.get("host", ("host", None))
    host_text = _text(host_value, f"{path}.{host_key}", problems, check_host)
    if not host_text and host_value in (None, ""):
        problems.append((f"{path}.host", "required when a bastion is given"))
    host, port = split_host(host_text) if host_text else ("", None)
    if "port" in values:
        key, value = values["port"]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
            problems.append((_child(path, key), "must be a whole number from 1 to 65535"))
        elif port is not None and port != value:
            problems.append((_child(path, key), f"host says port {port}, port says {value}"))
        else:
            port = value
    username = privkey = ""
    if "username" in values:
        key, value = values["username"]
        username = _text(value, _child(path, key), problems, check_user)
    if "privateKey" in values:
        key, value = values["privateKey"]
        privkey = _text(value, _child(path, key), problems, check_path)
    return Bastion(host, port or DEFAULT_PORT, username, privkey) if host else None
