"""Where the agent lives on a node: one place for every path, the unit name and small file renderings."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

import yaml

from tether.nodeagent import upgrade
from tether.nodeagent.controllers import split_addresses
from tether.nodeagent.limits import UPGRADE_MAX_STARTS

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
    """``/etc/tether/agent.yaml``: no secret in it (the token lives in its own file).

    ``controller`` is HOST:PORT, or several replicas' ``A,B``: then ``controllers: [A, B]``, which
    the agent tries in turn (a Welcome later tells it the live ones).
    """
    addresses = split_addresses(controller)
    dial: dict[str, Any] = (
        {"controller": addresses[0]} if len(addresses) == 1 else {"controllers": list(addresses)}
    )
    doc: dict[str, Any] = {
        **dial,
        "ca_hash": ca_hash,
        "node_name": node_name,
        "environment": environment,
        "role": role,
        "token_file": layout.token,
        "state_dir": layout.state_dir,
    }
    header = "# Written by tether bootstrap. The join token is in token_file (0600) until enrollment.\n"
    return (header + yaml.safe_dump(doc, sort_keys=False)).encode()


LAUNCHER = r"""#!/bin/sh
# Written by tether bootstrap: runs the node agent from the current bundle (AGENTS/current).
# While a self-upgrade is on probation (AGENTS/upgrade.pending), every start of `run` is counted;
# after MAX_STARTS starts, or once its deadline has passed, the new version has failed: `current`
# goes back to the previous bundle and AGENTS/upgrade.rolledback tells the old agent why. This is
# shell on purpose: a broken bundle cannot run Python, let alone its own rollback.
# See docs/agent-upgrades.md.
agents=AGENTS
if [ "$1" = run ] && [ -f "$agents/PENDING" ]; then
    from_bundle=; deadline=0; to_version=; to_sha256=
    while IFS='=' read -r key value; do
        case $key in
            from_bundle) from_bundle=$value ;;
            deadline) deadline=$value ;;
            to_version) to_version=$value ;;
            to_sha256) to_sha256=$value ;;
        esac
    done < "$agents/PENDING"
    printf . >> "$agents/STARTS"
    starts=$(wc -c < "$agents/STARTS")
    reason=
    if [ "$starts" -gt MAX_STARTS ]; then
        reason="version $to_version did not start ($((starts - 1)) starts)"
    elif [ "$(date +%s)" -ge "$deadline" ]; then
        reason="version $to_version did not reach the controller and report health by its deadline"
    fi
    if [ -n "$reason" ] && [ -n "$from_bundle" ] && [ -f "$agents/$from_bundle/launch.py" ]; then
        printf 'version=%s\nsha256=%s\nreason=%s\n' "$to_version" "$to_sha256" "$reason" \
            > "$agents/ROLLED_BACK.tmp" && mv -f "$agents/ROLLED_BACK.tmp" "$agents/ROLLED_BACK"
        ln -sfn "$from_bundle" "$agents/.current-rollback" &&
            mv -Tf "$agents/.current-rollback" "$agents/current"
        rm -f "$agents/PENDING" "$agents/STARTS"
        echo "tether-agent: rolled back to bundle $from_bundle: $reason" >&2
    fi
fi
exec PYTHON -I "$agents/current/launch.py" "$@"
"""


def launcher(layout: Layout, python: str) -> bytes:
    """``/opt/tether/bin/tether-agent``: the chosen interpreter, isolated, running the current bundle,
    and rolling a failed self-upgrade back (``tether.nodeagent.upgrade``)."""
    text = LAUNCHER
    for name, value in (
        ("AGENTS", shlex.quote(layout.agents_dir)),
        ("MAX_STARTS", str(UPGRADE_MAX_STARTS)),
        ("ROLLED_BACK", upgrade.ROLLED_BACK),
        ("PENDING", upgrade.PENDING),
        ("STARTS", upgrade.STARTS),
        ("PYTHON", shlex.quote(python)),
    ):
        text = text.replace(name, value)
    return text.encode()


def marker(**fields: Any) -> bytes:
    return (json.dumps(fields, indent=2, sort_keys=True) + "\n").encode()
