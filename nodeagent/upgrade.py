"""Self-upgrade of an installed agent: stage beside the old bundle, switch, restart, commit or roll back.

On disk (``/opt/tether/agent``, the bootstrap's layout; ``docs/agent-upgrades.md``)::

    <id>/                  unpacked bundles (id: the first 16 hex digits of the archive's SHA-256)
    current -> <id>        what the launcher (/opt/tether/bin/tether-agent) runs
    upgrade.pending        key=value: from_bundle, from_version, to_bundle, to_version, to_sha256,
                           deadline (epoch seconds); present while the new version is on probation
    upgrade.starts         one byte per start of ``run`` while pending (the launcher counts them)
    upgrade.rolledback     key=value: version, sha256, reason (written by whoever rolled back)

The old agent stages the new bundle, writes ``upgrade.pending``, points ``current`` at the new
bundle and exits; systemd starts the launcher again. The launcher, a shell script (a broken
bundle cannot run Python, let alone its own rollback), counts the starts: past
``UPGRADE_MAX_STARTS`` or past the deadline it points ``current`` back at the old bundle and
writes ``upgrade.rolledback``. The new agent commits (removes ``upgrade.pending`` and the old
bundle) once it has been welcomed by the controller and has sent a health report; if it cannot by
the deadline it exits, and the launcher rolls back on the next start. The old agent then reports
``rolled_back_from`` in its hello and does not try that bundle again.

This module is the state on disk and the decisions; the download is ``tether.nodeagent.bundlefetch``.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from tether import nodeagent
from tether.nodeagent.errors import AgentError
from tether.nodeagent.facts import ARCH_ALIASES
from tether.nodeagent.model import AgentTarget

PENDING = "upgrade.pending"
STARTS = "upgrade.starts"
ROLLED_BACK = "upgrade.rolledback"
CURRENT = "current"


class UpgradeError(AgentError):
    """A self-upgrade could not be staged; ``retryable``: a later try can succeed (a download)."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


def bundle_id(sha256: str) -> str:
    return sha256[:16]  # as the bootstrap names them (tether.bootstrap.bundle.AgentBundle.bundle_id)


@dataclass(frozen=True)
class Install:
    """Where this agent is installed: the bundles directory and the bundle it runs from."""

    agents_dir: Path
    bundle_id: str

    @classmethod
    def find(cls, module_file: str | None = None) -> Install | None:
        """The install this code runs from, or None (a source checkout, a wheel: no self-upgrade)."""
        here = Path(module_file or nodeagent.__file__ or "").resolve()
        depth = nodeagent.__name__.count(".") + 1  # <agents>/<id>/lib/tether/nodeagent/__init__.py
        if len(here.parents) < depth + 3:
            return None
        lib = here.parents[depth]
        bundle = lib.parent
        agents = bundle.parent
        if lib.name != "lib" or not (bundle / "BUNDLE.json").is_file():
            return None
        if not (bundle / "launch.py").is_file() or not (agents / CURRENT).is_symlink():
            return None
        return cls(agents, bundle.name)

    def path(self, name: str) -> Path:
        return self.agents_dir / name

    def download(self, target: AgentTarget) -> Path:
        return self.path(f".download-{bundle_id(target.sha256)}.part")


@dataclass(frozen=True)
class Pending:
    from_bundle: str
    from_version: str
    to_bundle: str
    to_version: str
    to_sha256: str
    deadline: int  # epoch seconds (the launcher compares it with `date +%s`)


@dataclass(frozen=True)
class RolledBack:
    version: str
    sha256: str
    reason: str
    reported: bool = False


def _parse(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def _write(path: Path, fields: Mapping[str, object]) -> None:
    """``key=value`` lines, written and synced under a temporary name, then renamed."""
    tmp = path.with_name(path.name + ".tmp")
    data = "".join(f"{k}={v}\n" for k, v in fields.items()).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _sync_dir(path.parent)


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_pending(install: Install) -> Pending | None:
    try:
        doc = _parse(install.path(PENDING).read_text())
        return Pending(
            doc["from_bundle"],
            doc["from_version"],
            doc["to_bundle"],
            doc["to_version"],
            doc["to_sha256"],
            int(doc["deadline"]),
        )
    except FileNotFoundError:
        return None
    except (KeyError, ValueError, OSError):
        return None  # damaged: treated as no upgrade under way (the launcher ignores it too)


def read_rolled_back(install: Install) -> RolledBack | None:
    try:
        doc = _parse(install.path(ROLLED_BACK).read_text())
    except OSError:
        return None
    if not doc.get("version"):
        return None
    reported = doc.get("reported") == "1"
    return RolledBack(doc["version"], doc.get("sha256", ""), doc.get("reason", ""), reported)


def mark_reported(install: Install, record: RolledBack) -> None:
    _write(install.path(ROLLED_BACK), {**asdict(record), "reported": "1"})


def _remove(*paths: Path) -> None:
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


# -- staging ----------------------------------------------------------------------------------


def running_platform() -> tuple[str, str]:
    major, minor = sys.version_info[:2]
    return f"{major}.{minor}", ARCH_ALIASES.get(platform.machine(), platform.machine())


def check_manifest(doc: Mapping[str, object], target: AgentTarget) -> None:
    """The bundle is the version the plan names, for this interpreter and architecture."""
    if doc.get("tether_version") != target.version:
        raise UpgradeError(
            f"the bundle says it is version {doc.get('tether_version')!r}, the plan names {target.version!r}",
            retryable=False,
        )
    python, arch = running_platform()
    if doc.get("python") != python or doc.get("arch") != arch:
        raise UpgradeError(
            f"the bundle is built for Python {doc.get('python')} {doc.get('arch')}; "
            f"this node runs Python {python} {arch}",
            retryable=False,
        )


def stage(install: Install, target: AgentTarget, archive: Path) -> str:
    """Unpack ``archive`` (already checked against the target's SHA-256) beside the running bundle;
    returns its id. A bundle of that id already unpacked is used as it is."""
    import compileall  # here, not at the top: an agent that is not upgrading holds neither
    import tarfile

    bid = bundle_id(target.sha256)
    if bid == install.bundle_id:
        raise UpgradeError("the plan's bundle is the one running", retryable=False)
    dest = install.path(bid)
    work = install.path(f".stage-{bid}")
    shutil.rmtree(work, ignore_errors=True)
    try:
        with tarfile.open(archive, "r:gz") as tar:
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(work, **safe)  # type: ignore[arg-type]  # noqa: S202 (checked, data filter)
        doc = json.loads((work / "BUNDLE.json").read_text())
        if not isinstance(doc, dict) or not (work / "launch.py").is_file():
            raise UpgradeError("the bundle has no BUNDLE.json or launch.py", retryable=False)
        check_manifest(doc, target)
        compileall.compile_dir(str(work / "lib"), quiet=2, workers=0)
        shutil.rmtree(dest, ignore_errors=True)
        os.rename(work, dest)
        _sync_dir(install.agents_dir)
    except (tarfile.TarError, EOFError, ValueError, OSError) as exc:
        raise UpgradeError(f"cannot unpack the bundle: {exc}", retryable=False) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
        _remove(archive)
    return bid


def switch(install: Install, pending: Pending) -> None:
    """Record the upgrade as pending, then point ``current`` at the new bundle (in that order: a
    crash between them leaves a pending record the old agent clears on start)."""
    _remove(install.path(STARTS), install.path(ROLLED_BACK))
    _write(install.path(PENDING), asdict(pending))
    link = install.path(f".current-{pending.to_bundle}")
    _remove(link)
    os.symlink(pending.to_bundle, link)
    os.replace(link, install.path(CURRENT))
    _sync_dir(install.agents_dir)


def commit(install: Install) -> None:
    """The running version is healthy: no rollback any more; older bundles and leftovers go."""
    _remove(install.path(PENDING), install.path(STARTS), install.path(ROLLED_BACK))
    _sync_dir(install.agents_dir)
    current = os.readlink(install.path(CURRENT))
    for entry in install.agents_dir.iterdir():
        if entry.name in (current, CURRENT):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        elif entry.name.startswith((".download-", ".current-")):
            _remove(entry)


# -- what a starting agent finds --------------------------------------------------------------


@dataclass(frozen=True)
class Startup:
    """What the agent says in hello, and whether it is on probation (and until when)."""

    upgraded_from: str = ""
    rolled_back: RolledBack | None = None
    deadline: int = 0  # epoch seconds; 0: not on probation
    pending: Pending | None = None


def on_start(install: Install | None) -> Startup:
    """Read (and tidy) the upgrade state a start finds."""
    if install is None:
        return Startup()
    pending = read_pending(install)
    rolled_back = read_rolled_back(install)
    if pending is not None and pending.to_bundle != install.bundle_id:
        # The old bundle runs with a record pending: the switch never happened (a crash in between)
        # or the record is stale. Nothing is on probation; the plan asks again if it still wants it.
        _remove(install.path(PENDING), install.path(STARTS))
        pending = None
    if pending is None:
        return Startup(rolled_back=rolled_back)
    return Startup(upgraded_from=pending.from_version, deadline=pending.deadline, pending=pending)


def new_pending(install: Install, target: AgentTarget, to_bundle: str, deadline_seconds: float) -> Pending:
    return Pending(
        from_bundle=install.bundle_id,
        from_version=nodeagent.__version__,
        to_bundle=to_bundle,
        to_version=target.version,
        to_sha256=target.sha256,
        deadline=int(time.time() + deadline_seconds),
    )
