"""A reset node removes the agent: its systemd unit, its install, its config and its state.

The controller's reset plan (``Plan.deprovision``) first runs its steps (leave the cluster); the
agent then reports the reset done (an event on step ``RESET_DONE_STEP``), waits for the
controller to hold it (at most ``tether.nodeagent.limits.RESET_REPORT_SECONDS``), and removes itself
here, once its state database is closed.

Under systemd the agent cannot stop its own unit (``KillMode=control-group``: the stop would kill
it half way). It does not need to: it disables the unit, removes a unit file that an operator's
tool installed (under ``/etc/systemd/system``; a packaged one is the package manager's) and
then exits with ``RESET_EXIT_CODE``, which the unit lists in ``RestartPreventExitStatus=`` and
``SuccessExitStatus=``: the unit ends inactive and is not started again, now or after a reboot.
It does not reload systemd after removing the file: a reload would drop the running unit's
settings with it (LoadState not-found), and the exit would count as a failure. Systemd keeps
them until the unit stopped, then lets the unit go; the next reload finds no file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from tether.nodeagent import logs
from tether.nodeagent.upgrade import Install

log = logs.get_logger("tether.agent.deprovision")

RESET_DONE_STEP = "agent:reset"  # the event that says: every reset step ran, the agent goes now
ADMIN_UNIT_DIR = Path("/etc/systemd/system")  # unit files written by tether bootstrap live here
Run = Callable[[Sequence[str]], int]


@dataclass(frozen=True)
class Removal:
    """What this agent removes when its node is reset."""

    state_dir: Path
    files: tuple[Path, ...] = ()  # its config file and join-token file
    install_root: Path | None = None  # /opt/tether: the bundles and the launcher
    unit: str = ""  # the systemd unit it runs as ("" when not under systemd)
    unit_file: Path | None = None  # the unit's file, when tether's bootstrap installed it

    def describe(self) -> str:
        parts = [str(p) for p in (self.unit_file, self.install_root, *self.files) if p is not None]
        return ", ".join([*([self.unit] if self.unit else []), *parts, str(self.state_dir)])


def systemd_unit(environ: Mapping[str, str], cgroup: Path = Path("/proc/self/cgroup")) -> str:
    """The service unit this process runs as, or "" (not started by systemd)."""
    if not environ.get("INVOCATION_ID"):
        return ""
    try:
        lines = cgroup.read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        for part in reversed(line.rsplit(":", 1)[-1].split("/")):
            if part.endswith(".service"):
                return part
    return ""


def _token_file(config: Path) -> Path | None:
    try:
        doc = yaml.safe_load(config.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    named = doc.get("token_file") if isinstance(doc, dict) else None
    if not isinstance(named, str) or not named:
        return None
    path = Path(named)
    return path if path.is_absolute() else config.parent / path


def plan_removal(
    state_dir: Path,
    config: Path | None,
    *,
    environ: Mapping[str, str] = os.environ,
    install: Install | None = None,
    unit_file: Callable[[str], Path | None] | None = None,
    cgroup: Path = Path("/proc/self/cgroup"),
) -> Removal:
    """What to remove, found before anything is: the unit, the install, the config, the state."""
    files: list[Path] = []
    if config is not None:
        token = _token_file(config)
        files += [config, *([token] if token else [])]
    root = install.agents_dir.parent if install is not None else None
    unit = systemd_unit(environ, cgroup)
    path = (unit_file or _fragment_path)(unit) if unit else None
    if path is not None and path.parent != ADMIN_UNIT_DIR:
        path = None  # a packaged unit (/usr/lib/systemd/system): disabled, but its file stays
    return Removal(state_dir, tuple(files), root, unit, path)


def _fragment_path(unit: str) -> Path | None:
    try:
        out = subprocess.run(
            ["systemctl", "show", "-p", "FragmentPath", "--value", unit],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = out.stdout.strip()
    return Path(text) if out.returncode == 0 and text else None


def _run(argv: Sequence[str]) -> int:
    try:
        return subprocess.run(list(argv), capture_output=True, timeout=60, check=False).returncode
    except (OSError, subprocess.TimeoutExpired):
        return -1


def remove(removal: Removal, run: Run = _run) -> list[str]:
    """Remove everything ``removal`` names; returns what could not be (each with the reason)."""
    problems: list[str] = []
    if removal.unit and run(["systemctl", "disable", "--quiet", removal.unit]) != 0:
        problems.append(f"systemctl disable {removal.unit} failed")
    if removal.unit_file is not None:
        _unlink(removal.unit_file, problems)  # no daemon-reload while it runs (see above)
    if removal.install_root is not None:
        _rmtree(removal.install_root, problems)
    for path in removal.files:
        _unlink(path, problems)
    for parent in {p.parent for p in removal.files}:
        with contextlib.suppress(OSError):
            parent.rmdir()  # only when nothing else is left in it (/etc/tether)
    _rmtree(removal.state_dir, problems)
    return problems


def _unlink(path: Path, problems: list[str]) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        problems.append(f"{path}: {exc.strerror or exc}")


def _rmtree(path: Path, problems: list[str]) -> None:
    def failed(_fn: object, name: str, info: tuple[type[BaseException], BaseException, object]) -> None:
        problems.append(f"{name}: {getattr(info[1], 'strerror', None) or info[1]}")

    if path.is_symlink():
        _unlink(path, problems)
    elif path.exists():
        shutil.rmtree(path, onerror=failed)  # onexc= is 3.12's; nodes run 3.10 and later


__all__ = ["RESET_DONE_STEP", "Removal", "plan_removal", "remove", "systemd_unit"]
