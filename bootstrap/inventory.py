"""Inventories: which machines to adopt, from a tether inventory file or an Environment document.

A tether inventory (every problem in it is reported at once)::

    defaults:                       # optional; each node may override any of these
      env: gpu-lab
      role: worker
      user: root
      identity: ~/.ssh/id_ed25519
      known_hosts: ./known_hosts
    nodes:
      - ssh: 10.0.0.5               # [USER@]HOST[:PORT]
        name: gpu-1
        host_key: ssh-ed25519 AAAA...
      - ssh: ubuntu@10.0.0.6:2222
        jump: ops@bastion.example.com
      - ssm: i-0123456789abcdef0
        region: us-east-1
        role: control-plane

SSH settings a node (or ``defaults``) may also give: ``jump_identity`` (the jump host's key; default
the node's credentials), ``host_key_policy`` (strict | accept-new | off), ``use_agent``,
``agent_socket``, ``connect_timeout``/``handshake_timeout``/``keepalive_interval`` (seconds or Go
durations such as ``30s``) and ``max_retries`` (connection attempts).

An Environment document (``kind: Environment``, holodeck layout) contributes its node list:
``status.cluster.nodes[]`` (name, role, publicIp/privateIp, sshUsername, or instanceId for SSM in
``spec.cluster.region``), or the single ``spec.instance.hostUrl`` of ``provider: ssh``, with
``spec.auth.username``/``privateKey``, ``spec.auth.sshConfig`` (bastion, agent, knownHostsPolicy,
timeouts, retries: ``tether.bootstrap.sshconfig``) for every node, and ``metadata.name`` as the
environment.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import yaml

from tether.bootstrap import sshconfig
from tether.bootstrap.errors import InventoryError
from tether.bootstrap.ssh import SshEndpoint
from tether.controller.spec import bounded_yaml
from tether.controller.spec import load as spec_load
from tether.nodeagent.model import Role

ALIASES = {"environment": "env", "accept_new": "accept_new_host_key", "instance_id": "ssm"}


@dataclass(frozen=True)
class Entry:
    """One machine; empty fields are filled from the command line's flags (``with_defaults``)."""

    ssh: str = ""  # [USER@]HOST[:PORT]
    ssm: str = ""  # instance id
    name: str = ""
    env: str = ""
    role: str = ""
    user: str = ""
    region: str = ""
    identity: str = ""
    known_hosts: str = ""
    host_key: str = ""
    accept_new_host_key: bool | None = None
    jump: str = ""
    jump_identity: str = ""  # the jump host's key file (default: the node's credentials)
    host_key_policy: str = ""  # strict | accept-new | off (holodeck's knownHostsPolicy)
    use_agent: bool | None = None
    agent_socket: str = ""
    connect_timeout: float | None = None  # seconds
    handshake_timeout: float | None = None
    keepalive_interval: float | None = None
    max_retries: int | None = None  # connection attempts

    @property
    def target(self) -> str:
        if self.ssm:
            return f"ssm:{self.ssm}"
        return str(SshEndpoint.parse(self.ssh, self.user or "root"))

    def with_defaults(self, defaults: Entry) -> Entry:
        values = {
            f.name: getattr(defaults, f.name)
            for f in fields(self)
            if getattr(self, f.name) in ("", None) and f.name not in ("ssh", "ssm", "name")
        }
        return replace(self, **values)


KEYS = {f.name for f in fields(Entry)}
BOOLS = {"accept_new_host_key", "use_agent"}
DURATIONS = {"connect_timeout", "handshake_timeout", "keepalive_interval"}


def _entry(raw: Any, where: str, problems: list[str]) -> Entry | None:
    if not isinstance(raw, dict):
        problems.append(f"{where}: expected a mapping")
        return None
    values: dict[str, Any] = {}
    for key, value in raw.items():
        name = ALIASES.get(str(key), str(key))
        if name not in KEYS:
            problems.append(f"{where}.{key}: unknown setting")
            continue
        if name in BOOLS:
            if not isinstance(value, bool):
                problems.append(f"{where}.{key}: expected true or false")
                continue
            values[name] = value
        elif name in DURATIONS:
            try:
                seconds = sshconfig.parse_duration(value)
            except ValueError as exc:
                problems.append(f"{where}.{key}: {exc}")
                continue
            values[name] = seconds or None
        elif name == "max_retries":
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or not 0 <= value <= sshconfig.MAX_RETRIES
            ):
                problems.append(f"{where}.{key}: expected a whole number from 0 to {sshconfig.MAX_RETRIES}")
                continue
            values[name] = value or None
        elif value is None or isinstance(value, (str, int)):
            values[name] = "" if value is None else str(value)
        else:
            problems.append(f"{where}.{key}: expected a string")
    return Entry(**values)


def _check(entry: Entry, where: str, problems: list[str]) -> None:
    if bool(entry.ssh) == bool(entry.ssm):
        problems.append(f"{where}: give exactly one of ssh or ssm")
    if entry.ssh:
        try:
            SshEndpoint.parse(entry.ssh, entry.user or "root")
        except ValueError as exc:
            problems.append(f"{where}.ssh: {exc}")
        if entry.jump:
            try:
                SshEndpoint.parse(entry.jump, entry.user or "root")
            except ValueError as exc:
                problems.append(f"{where}.jump: {exc}")
    if entry.ssm and not entry.region:
        problems.append(f"{where}: an ssm node needs a region (here, in defaults, or --region)")
    if entry.role:
        try:
            Role.parse(entry.role)
        except ValueError as exc:
            problems.append(f"{where}.role: {exc}")
    if entry.host_key and entry.accept_new_host_key:
        problems.append(f"{where}: host_key and accept_new_host_key exclude each other")
    if entry.host_key_policy and entry.host_key_policy not in sshconfig.POLICIES:
        problems.append(f"{where}.host_key_policy: must be one of {', '.join(sshconfig.POLICIES)}")
    if entry.jump_identity and not entry.jump:
        problems.append(f"{where}.jump_identity: there is no jump host")


def load(path: Path, defaults: Entry | None = None, notes: list[str] | None = None) -> list[Entry]:
    """The machines of ``path``, completed with ``defaults`` (the command line's flags); what was
    accepted but not used is appended to ``notes``.

    The file is read as ``tetherctl env apply`` reads it: within the YAML limits (nesting depth,
    node count with aliases expanded), and a file of several documents for its one Environment."""
    try:
        docs = bounded_yaml.load_all(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InventoryError([f"{path}: {exc}"]) from None
    return parse(_one_document(docs, str(path), notes), str(path), defaults or Entry(), notes)


def _one_document(docs: list[Any], source: str, notes: list[str] | None) -> Any:
    """The inventory of a file: its one document, or the one Environment of several (holodeck
    files may hold other documents beside it), picked as the spec loader picks it."""
    try:
        doc, note = spec_load.pick_environment(docs)
    except spec_load.SpecError as exc:
        raise InventoryError([f"{source}: {v.message}" for v in exc.violations]) from None
    if note and notes is not None:
        notes.append(f"{source}: {note}")
    return doc


def parse(doc: Any, source: str, defaults: Entry, notes: list[str] | None = None) -> list[Entry]:
    problems: list[str] = []
    if not isinstance(doc, dict):
        raise InventoryError([f"{source}: expected a mapping with 'nodes'"])
    if spec_load.is_environment(doc):
        raw_nodes, file_defaults = _from_environment(doc, problems, notes if notes is not None else [])
    else:
        unknown = sorted(set(doc) - {"apiVersion", "kind", "defaults", "nodes"})
        problems += [f"{source}: unknown key {k!r}" for k in unknown]
        file_defaults = _entry(doc.get("defaults") or {}, "defaults", problems) or Entry()
        listed = doc.get("nodes")
        raw_nodes = listed if isinstance(listed, list) else []
        if not raw_nodes:
            problems.append(f"{source}: 'nodes' must be a non-empty list")
    merged_defaults = file_defaults.with_defaults(defaults)
    entries: list[Entry] = []
    for i, raw in enumerate(raw_nodes):
        where = f"nodes[{i}]"
        entry = _entry(raw, where, problems)
        if entry is None:
            continue
        entry = entry.with_defaults(merged_defaults)
        _check(entry, where, problems)
        entries.append(entry)
    seen_names: dict[str, int] = {}
    seen_targets: dict[str, int] = {}
    for i, e in enumerate(entries):
        if e.name:
            if e.name in seen_names:
                problems.append(f"nodes[{i}]: node name {e.name!r} also used by nodes[{seen_names[e.name]}]")
            seen_names.setdefault(e.name, i)
        try:
            target = e.target
        except ValueError:
            continue
        if target in seen_targets:
            problems.append(f"nodes[{i}]: {target} is also nodes[{seen_targets[target]}]")
        seen_targets.setdefault(target, i)
    if problems:
        raise InventoryError(problems)
    return entries


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _ssh_config(auth: dict[str, Any], problems: list[str], notes: list[str]) -> dict[str, Any]:
    """Entry defaults from ``spec.auth.sshConfig``."""
    raw = next((v for k, v in auth.items() if str(k).lower() == "sshconfig"), None)
    config, found, unknown = sshconfig.parse(raw)
    problems += [f"{path}: {message}" for path, message in found]
    notes += [f"{path}: unknown field, ignored" for path in unknown]
    out: dict[str, Any] = {
        "host_key_policy": config.known_hosts_policy,
        "use_agent": config.use_agent or None,
        "agent_socket": config.agent_socket,
        "connect_timeout": config.connect_timeout,
        "handshake_timeout": config.handshake_timeout,
        "keepalive_interval": config.keepalive_interval,
        "max_retries": config.max_retries,
    }
    if config.agent_socket and not config.use_agent:
        notes.append("spec.auth.sshConfig.agentSocket: ignored without useAgent: true")
    if config.bastion is not None:
        out["jump"] = config.bastion.endpoint
        out["jump_identity"] = config.bastion.private_key
    return out


def _from_environment(doc: dict[str, Any], problems: list[str], notes: list[str]) -> tuple[list[Any], Entry]:
    spec, status, meta = _mapping(doc.get("spec")), _mapping(doc.get("status")), _mapping(doc.get("metadata"))
    auth, cluster_spec = _mapping(spec.get("auth")), _mapping(spec.get("cluster"))
    defaults = Entry(
        env=str(meta.get("name") or ""),
        user=str(auth.get("username") or ""),
        identity=str(auth.get("privateKey") or ""),
        region=str(cluster_spec.get("region") or ""),
        **_ssh_config(auth, problems, notes),
    )
    cluster_status = _mapping(status.get("cluster"))
    nodes: list[Any] = []
    for raw in cluster_status.get("nodes") or []:
        if not isinstance(raw, dict):
            continue
        address = raw.get("publicIp") or raw.get("privateIp") or ""
        node: dict[str, Any] = {"name": raw.get("name", ""), "role": raw.get("role", "")}
        if address:
            node["ssh"] = str(address)
            if raw.get("sshUsername"):
                node["user"] = raw["sshUsername"]
        elif raw.get("instanceId"):
            node["ssm"] = raw["instanceId"]
        nodes.append(node)
    instance = _mapping(spec.get("instance"))
    if not nodes and spec.get("provider") == "ssh" and instance.get("hostUrl"):
        nodes.append({"ssh": str(instance["hostUrl"])})
    if not nodes:
        problems.append("the Environment lists no nodes (status.cluster.nodes or spec.instance.hostUrl)")
    return nodes, defaults
