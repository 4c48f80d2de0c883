"""The controller's own ``admin.conf``: written on first start, its address kept current."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import replace
from pathlib import Path

from tether.controller.adminconf import AdminConfig
from tether.controller.identity.model import Identity
from tether.nodeagent import logs

log = logs.get_logger("tether.controller")


async def ensure_admin_conf(identity: Identity, path: Path, address: str) -> None:
    """Write ``path`` with a new admin certificate (recorded in the registry) when it is missing;
    else only point it at ``address``. Every replica of one store may write its own: they share
    the CA and the registry, so each works against all."""
    if await asyncio.to_thread(_readdress, path, address):
        return
    ca = identity.ca
    name = socket.gethostname() or "admin"
    key_pem, issued = ca.issue_admin(name, "admin")
    await identity.admins.record(name, "admin", issued)
    # Its name is the certificate's: the audit log and events name the admin by it.
    conf = AdminConfig(address, ca.ca_hash, ca.cert_pem, issued.cert_pem, key_pem, name=name)
    await asyncio.to_thread(conf.write, path)
    log.info("admin credentials written", path=str(path))


def _readdress(path: Path, address: str) -> bool:
    """Point an existing ``path`` at ``address``; False when there is none."""
    if not path.exists():
        return False
    current = AdminConfig.read(path)
    if current.controller != address:
        replace(current, controller=address, context="").write(path)
    return True
