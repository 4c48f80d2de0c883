"""Where the agent lives on a node: one place for every path, the unit name and small file renderings."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

import yaml

UNIT_NAME = "tether-agent.service"


@dataclass(frozen=True)
class Layout:
    etc_dir: str = "/etc/tether"  # agent.yaml and the join token, 0700 / 0600 root
    state_dir: str = "/var/lib/tether"  # the agent's identity and journal; never touched by --force
    opt_dir: str = "/opt/tether"  # bundles (agent/<id>/), the launcher (bin/tether-agent)
    cache_dir: str = "/var/cache/tether"  # the downloaded bundle archive, removed after unpacking
    unit_dir: str = "/etc/systemd/system"

    @property
    def config(self) -> str:
        return f"{self.etc_dir}/agent.yaml"

    @property
    def token(self) -> str:
        return f"{self.etc_dir}/join-token"

    @property
    def disabled(self) -> str:
        return f"{self.etc_dir}/disabled"  # the unit's kill switch

    @property
    def marker(self) -> str:
        return f"{self.state_dir}/bootstrap.json"

    @property
    def identity_files(self) -> tuple[str, ...]:
        return tuple(f"{self.state_dir}/{n}" for n in ("key.pem", "cert.pem", "node.json"))

    @property
    def cert(self) -> str:
        return f"{self.state_dir}/cert.pem"

    @property
    def agents_dir(self) -> str:
        return f"{self.opt_dir}/agent"

    def bundle_dir(self, bundle_id: str) -> str:
        return f"{self.agents_dir}/{bundle_id}"

    @property
    def current(self) -> str:
        return f"{self.agents_dir}/current"

    @property
    def launcher(self) -> str:
        return f"{self.opt_dir}/bin/tether-agent"

    @property
    def unit(self) -> str:
        return f"{self.unit_dir}/{UNIT_NAME}"

    def archive(self, sha256: str) -> str:
        return f"{self.cache_dir}/agent-{sha256[:16]}.tar.gz"


DEFAULT_LAYOUT = Layout()


def agent_config(
    layout: Layout, *, controller: str, ca_hash: str, node_name: str, environment: str, role: str
) -> bytes:
    """``/etc/tether/agent.yaml``: no secret in it (the token lives in its own file)."""
    doc: dict[str, Any] = {
        "controller": controller,
        "ca_hash": ca_hash,
        "node_name": node_name,
        "environment": environment,
        "role": role,
        "token_file": layout.token,
        "state_dir": layout.state_dir,
    }
    header = "# Written by tether bootstrap. The join token is in token_file (0600) until enrollment.\n"
    return (header + yaml.safe_dump(doc, sort_keys=False)).encode()


def launcher(layout: Layout, python: str) -> bytes:
    """``/opt/tether/bin/tether-agent``: the chosen interpreter, isolated, running the current bundle."""
    entry = shlex.quote(f"{layout.current}/launch.py")
    return (
        "#!/bin/sh\n"
        "# Written by tether bootstrap: runs the node agent from the current bundle.\n"
        f'exec {shlex.quote(python)} -I {entry} "$@"\n'
    ).encode()


def marker(**fields: Any) -> bytes:
    return (json.dumps(fields, indent=2, sort_keys=True) + "\n").encode()
