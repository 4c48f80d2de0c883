#!/usr/bin/env python3
"""Build the Debian packages tether-controller and tether-agent (``make deb``) into dist/.

Usage: scripts/build_deb.py [--out DIR] [--python 3.11] [--arch amd64] [--glibc 2.36]
                            [--wheels DIR] [--offline] [--only controller|agent]

Each package is a staged tree packed with ``dpkg-deb --build --root-owner-group`` (no debhelper);
templates and maintainer scripts are in packaging/deb/ (see its README), the units in
packaging/systemd/. Both are self-contained: the wheels they need are fetched for the target
Python with ``pip download`` (into ``--wheels``, default .cache/deb-wheels/TAG; ``--offline``:
only from there, or from ``$TETHER_WHEEL_DIR``) and unpacked into the tree at build time.

- tether-controller ships the project's own wheel (built from pyproject.toml: its import packages
  and console scripts are the one list of what is shipped) and the wheel's dependencies, pinned
  to the versions installed here, under /usr/lib/tether-controller/lib;
- tether-agent ships the bootstrap's agent bundle (``tether.bootstrap.bundle.build_archive``) unpacked
  in the bootstrap's layout (``tether.bootstrap.layout``), with the bootstrap's launcher.
"""

from __future__ import annotations

import argparse
import configparser
import email.parser
import hashlib
import importlib.metadata
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "proto"))  # the tether package

from tether.bootstrap.bundle import (  # noqa: E402  (after the path set-up)
    BundleSpec,
    _wheel_members,
    build_archive,
    pinned_requirements,
)
from tether.bootstrap.layout import DEFAULT_LAYOUT, launcher  # noqa: E402

TEMPLATES = ROOT / "packaging" / "deb"
UNITS = ROOT / "packaging" / "systemd"
CONTROLLER_LIB = "usr/lib/tether-controller/lib"
CONTROLLER_SCRIPTS = ("tether-controller", "tetherctl")  # console scripts put in /usr/bin
MAINTAINER_SCRIPTS = ("postinst", "prerm", "postrm")


class DebError(Exception):
    """A package could not be built (one line, no traceback)."""


@dataclass(frozen=True)
class Target:
    spec: BundleSpec
    wheels: Path  # pip's download directory for this target (a cache)
    offline: bool

    @property
    def python_depends(self) -> str:
        major, minor = self.spec.python.split(".")
        return f"python3 (>= {major}.{minor}), python3 (<< {major}.{int(minor) + 1})"


def _run(argv: Sequence[str], what: str, cwd: Path | None = None, timeout: int = 900) -> str:
    try:
        out = subprocess.run(
            list(argv), cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DebError(f"{what}: {exc}") from None
    if out.returncode != 0:
        tail = "\n".join((out.stderr or out.stdout).strip().splitlines()[-6:])
        raise DebError(f"{what} failed: {tail}")
    return out.stdout


def fetch_wheels(target: Target, requirements: Sequence[str], dest: Path) -> list[Path]:
    """The wheels of ``requirements`` (and their dependencies) for the target, copied into ``dest``."""
    target.wheels.mkdir(parents=True, exist_ok=True)
    dest.mkdir(parents=True, exist_ok=True)
    spec = target.spec
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:"]
    argv += ["--dest", str(dest), "--find-links", str(target.wheels)]
    for platform in spec.platforms():
        argv += ["--platform", platform]
    abi = f"cp{spec.python.replace('.', '')}"
    argv += ["--python-version", spec.python, "--implementation", "cp"]
    argv += ["--abi", abi, "--abi", "abi3", "--abi", "none"]
    extra = os.environ.get("TETHER_WHEEL_DIR", "")
    if extra:
        argv += ["--find-links", extra]
    if target.offline:
        argv.append("--no-index")
    _run([*argv, *requirements], f"pip download for {spec.tag}")
    wheels = sorted(dest.glob("*.whl"))
    for wheel in wheels:  # the next build finds them without an index
        if not (target.wheels / wheel.name).exists():
            shutil.copy2(wheel, target.wheels / wheel.name)
    return wheels


def project_wheel(work: Path) -> Path:
    """The project's wheel, built from a copy of the working tree (tracked and new files)."""
    files = _run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], "git ls-files", ROOT
    )
    src = work / "src"
    for rel in filter(None, files.split("\0")):
        path = ROOT / rel
        if path.is_file() or path.is_symlink():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, src / rel, follow_symlinks=False)
    out = work / "wheel"
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
    _run([*pip_wheel, "--wheel-dir", str(out), str(src)], "building the project wheel")
    found = sorted(out.glob("*.whl"))
    if len(found) != 1:
        raise DebError(f"expected one project wheel, found {[p.name for p in found]}")
    return found[0]


@dataclass(frozen=True)
class WheelInfo:
    name: str
    version: str
    requires: tuple[str, ...]  # Requires-Dist without extras' entries
    scripts: dict[str, str]  # console script -> "module:function"


def wheel_info(wheel: Path) -> WheelInfo:
    with zipfile.ZipFile(wheel) as zf:
        dist_info = next(n.split("/")[0] for n in zf.namelist() if n.split("/")[0].endswith(".dist-info"))
        meta = email.parser.Parser().parsestr(zf.read(f"{dist_info}/METADATA").decode())
        entry_points = configparser.ConfigParser()
        if f"{dist_info}/entry_points.txt" in zf.namelist():
            entry_points.read_string(zf.read(f"{dist_info}/entry_points.txt").decode())
    requires = tuple(r for r in meta.get_all("Requires-Dist") or [] if "extra ==" not in r)
    scripts = dict(entry_points["console_scripts"]) if entry_points.has_section("console_scripts") else {}
    return WheelInfo(meta["Name"], meta["Version"], requires, scripts)


def pinned(requirement: str) -> str:
    """``name[extras]`` at the version installed here (what the tests ran with), else as written."""
    head = requirement.split(";")[0].strip()
    m = re.match(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?", head)
    if not m:
        raise DebError(f"cannot read the requirement {requirement!r}")
    try:
        return f"{m.group(1)}{m.group(2) or ''}=={importlib.metadata.version(m.group(1))}"
    except importlib.metadata.PackageNotFoundError:
        return head


def unpack_wheel(wheel: Path, dest: Path) -> None:
    """Install a wheel's importable files into ``dest`` (like ``pip install --target``, no scripts)."""
    for name, content, mode in _wheel_members(wheel.name, wheel.read_bytes()):
        path = dest / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        path.chmod(mode)


def script_text(entry: str, lib: str) -> str:
    """A console script for ``module:function`` that imports only from ``lib`` (``python3 -I``)."""
    module, _, func = entry.partition(":")
    return (
        "#!/usr/bin/python3 -I\n"
        '"""Installed by the tether-controller package: its own modules, never the system\'s."""\n'
        "import sys\n\n"
        f"sys.path[:0] = [{lib!r}]\n"
        f"from {module.strip()} import {func.strip()}  # noqa: E402\n\n"
        f"sys.exit({func.strip()}())\n"
    )


def stage_controller(target: Target, work: Path) -> tuple[Path, dict[str, str]]:
    """The controller's tree and its control fields."""
    own = project_wheel(work)
    info = wheel_info(own)
    deps = fetch_wheels(target, [pinned(r) for r in info.requires], work / "controller-wheels")
    root = work / "tether-controller"
    for wheel in [*deps, own]:
        unpack_wheel(wheel, root / CONTROLLER_LIB)
    missing = [s for s in CONTROLLER_SCRIPTS if s not in info.scripts]
    if missing:
        raise DebError(f"the project wheel has no console script {', '.join(missing)}")
    for script in CONTROLLER_SCRIPTS:
        _write(root / "usr/bin" / script, script_text(info.scripts[script], f"/{CONTROLLER_LIB}"), 0o755)
    templates = TEMPLATES / "tether-controller"
    _copy(UNITS / "tether-controller.service", root / "lib/systemd/system/tether-controller.service")
    _copy(templates / "controller.env", root / "etc/tether/controller.env")
    _copy(templates / "README.Debian", root / "usr/share/doc/tether-controller/README.Debian")
    _copy(templates / "conffiles", root / "DEBIAN/conffiles")
    return root, {"VERSION": info.version}


def stage_agent(target: Target, work: Path) -> tuple[Path, dict[str, str]]:
    """The agent's tree (the bootstrap's layout) and its control fields."""
    from tether import nodeagent

    wheels = fetch_wheels(target, pinned_requirements(), work / "agent-wheels")
    archive = build_archive(target.spec, wheels)
    bundle_id = hashlib.sha256(archive).hexdigest()[:16]
    root = work / "tether-agent"
    layout = DEFAULT_LAYOUT
    bundle_dir = root / layout.bundle_dir(bundle_id).lstrip("/")
    bundle_dir.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        tar.extractall(bundle_dir, filter="data")
    (root / layout.current.lstrip("/")).symlink_to(bundle_id)
    _write(root / layout.launcher.lstrip("/"), launcher(layout, "/usr/bin/python3").decode(), 0o755)
    _copy(UNITS / "tether-agent.service", root / "lib/systemd/system/tether-agent.service")
    example = TEMPLATES / "tether-agent" / "agent.yaml.example"
    _copy(example, root / "usr/share/doc/tether-agent/agent.yaml.example")
    return root, {"VERSION": nodeagent.__version__, "BUNDLE_ID": bundle_id}


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _copy(src: Path, dest: Path) -> None:
    _write(dest, src.read_text())


def _fill(text: str, fields: dict[str, str]) -> str:
    for key, value in fields.items():
        text = text.replace(f"@{key}@", value)
    left = sorted(set(re.findall(r"@([A-Z_]+)@", text)))
    if left:
        raise DebError(f"template fields not filled: {', '.join(left)}")
    return text


def _installed_kib(root: Path) -> int:
    total = sum(p.lstat().st_size for p in root.rglob("*") if "DEBIAN" not in p.relative_to(root).parts)
    return (total + 1023) // 1024


def pack(package: str, root: Path, fields: dict[str, str], target: Target, out: Path) -> Path:
    """DEBIAN/ (control and maintainer scripts filled in) and ``dpkg-deb --build``."""
    templates = TEMPLATES / package
    fields = {
        **fields,
        "ARCH": target.spec.arch,
        "PYTHON": target.spec.python,
        "PYTHON_DEPENDS": target.python_depends,
        "INSTALLED_SIZE": str(_installed_kib(root)),
    }
    debian = root / "DEBIAN"
    _write(debian / "control", _fill((templates / "control.in").read_text(), fields))
    for script in MAINTAINER_SCRIPTS:
        _write(debian / script, _fill((templates / script).read_text(), fields), 0o755)
    for path in root.rglob("*"):  # dpkg-deb refuses group/other-writable DEBIAN files
        if not path.is_symlink():
            path.chmod(path.stat().st_mode & ~0o022)
    out.mkdir(parents=True, exist_ok=True)
    deb = out / f"{package}_{fields['VERSION']}_{target.spec.arch}.deb"
    _run(
        ["dpkg-deb", "--build", "--root-owner-group", "-Zzstd", str(root), str(deb)],
        f"dpkg-deb --build {package}",
    )
    return deb


def build(target: Target, out: Path, only: Sequence[str] = ("controller", "agent")) -> list[Path]:
    """Both packages (or those named in ``only``) in ``out``; returns their paths."""
    if shutil.which("dpkg-deb") is None:
        raise DebError("dpkg-deb not found (Debian's dpkg package)")
    stages = {"controller": ("tether-controller", stage_controller), "agent": ("tether-agent", stage_agent)}
    debs = []
    with tempfile.TemporaryDirectory(prefix="tether-deb-") as tmp:
        for name in only:
            package, stage = stages[name]
            work = Path(tmp) / name
            work.mkdir()
            root, fields = stage(target, work)
            debs.append(pack(package, root, fields, target, out))
    return debs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="build_deb.py", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "dist")
    p.add_argument("--python", default="3.11", help="the target's python3 (MAJOR.MINOR; Debian 12: 3.11)")
    p.add_argument("--arch", default="amd64", choices=("amd64", "arm64"))
    p.add_argument("--glibc", default="2.36", help="the target's glibc (Debian 12: 2.36)")
    p.add_argument("--wheels", type=Path, default=None, help="wheel cache (default .cache/deb-wheels/TAG)")
    p.add_argument(
        "--offline", action="store_true", help="no package index: only --wheels, $TETHER_WHEEL_DIR"
    )
    p.add_argument("--only", choices=("controller", "agent"), action="append")
    args = p.parse_args(argv)
    major, minor = (int(x) for x in args.glibc.split("."))
    spec = BundleSpec(args.python, args.arch, (major, minor))
    wheels = args.wheels or ROOT / ".cache" / "deb-wheels" / spec.tag
    try:
        debs = build(Target(spec, wheels, args.offline), args.out, args.only or ("controller", "agent"))
    except DebError as exc:
        print(f"build_deb.py: {exc}", file=sys.stderr)
        return 1
    for deb in debs:
        print(f"{deb} ({deb.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
