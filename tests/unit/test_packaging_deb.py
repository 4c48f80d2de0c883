"""``scripts/build_deb.py`` (``make deb``): both packages built offline from stand-in wheels, then
inspected with dpkg-deb (control fields, files, units, conffiles, maintainer scripts).

The wheels are small real wheels named and versioned like the pinned dependencies (the real ones
are the e2e tier's: tests/e2e/test_packages.py installs and runs both packages on a node).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build_deb.py"
UNITS = ROOT / "packaging" / "systemd"


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_deb", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("build_deb", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _need_dpkg_deb() -> None:
    if shutil.which("dpkg-deb") is not None:
        return
    if os.geteuid() == 0:
        pytest.fail("dpkg-deb missing on a root machine: run scripts/system-deps (dpkg-dev)")
    pytest.skip("dpkg-deb not installed (Debian's dpkg; scripts/system-deps installs it as root)")


def fake_wheel(dest: Path, requirement: str) -> Path:
    """A real, minimal wheel for ``name==version`` with one importable module."""
    name, _, version = requirement.partition("==")
    name = re.sub(r"\[.*\]", "", name)
    dist = re.sub(r"[-_.]+", "_", name).lower()
    module = "grpc" if dist == "grpcio" else f"fake_{dist}"
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": f"# stand-in for {name} {version}\n".encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    wheel = dest / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return wheel


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    _need_dpkg_deb()
    build_deb = _load_script()
    tmp = tmp_path_factory.mktemp("deb")
    wheels = tmp / "wheels"
    wheels.mkdir()
    # The project wheel's Requires-Dist (what the build pins) are pyproject's dependencies.
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    from tether.bootstrap.bundle import pinned_requirements

    for requirement in {build_deb.pinned(r) for r in requires} | set(pinned_requirements()):
        fake_wheel(wheels, requirement)
    env = {k: v for k, v in os.environ.items() if k not in ("TETHER_WHEEL_DIR", "PIP_FIND_LINKS")}
    env["PIP_NO_INDEX"] = "1"
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--offline", "--wheels", str(wheels), "--out", str(tmp / "dist")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    found = {p.name.split("_")[0]: p for p in (tmp / "dist").glob("*.deb")}
    assert sorted(found) == ["tether-agent", "tether-controller"], out.stdout
    return found


def field(deb: Path, name: str) -> str:
    return subprocess.run(
        ["dpkg-deb", "--field", str(deb), name], capture_output=True, text=True, check=True
    ).stdout.strip()


def contents(deb: Path) -> dict[str, str]:
    """Path (without the leading ./) -> the tar listing's first column (type and mode)."""
    out = subprocess.run(["dpkg-deb", "--contents", str(deb)], capture_output=True, text=True, check=True)
    listing = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        path = parts[5].removeprefix("./").rstrip("/")
        listing[path] = parts[0] + (f" -> {parts[7]}" if len(parts) > 7 and parts[6] == "->" else "")
        assert parts[1] == "root/root", line  # --root-owner-group
    return listing


def extract(deb: Path, dest: Path) -> Path:
    subprocess.run(["dpkg-deb", "-x", str(deb), str(dest)], check=True)
    subprocess.run(["dpkg-deb", "-e", str(deb), str(dest / "DEBIAN")], check=True)
    return dest


def test_file_names_versions_and_dependencies(debs: dict[str, Path]) -> None:
    from tether.nodeagent import __version__

    for package, deb in debs.items():
        assert deb.name == f"{package}_{__version__}_amd64.deb"
        assert field(deb, "Package") == package
        assert field(deb, "Version") == __version__
        assert field(deb, "Architecture") == "amd64"
        depends = field(deb, "Depends")
        assert "python3 (>= 3.11), python3 (<< 3.12)" in depends and "systemd" in depends
        assert int(field(deb, "Installed-Size")) > 0
    assert "adduser" in field(debs["tether-controller"], "Depends")


def test_controller_ships_the_project_wheel_its_launchers_unit_and_config(
    debs: dict[str, Path], tmp_path: Path
) -> None:
    listing = contents(debs["tether-controller"])
    lib = "usr/lib/tether-controller/lib"
    for path in (
        "lib/systemd/system/tether-controller.service",
        "etc/tether/controller.env",
        "usr/share/doc/tether-controller/README.Debian",
        f"{lib}/tether/controller/main.py",
        f"{lib}/fake_structlog/__init__.py",  # a dependency's wheel, unpacked
        f"{lib}/grpc/__init__.py",
    ):
        assert path in listing, path
    for script in ("tether-controller", "tetherctl"):
        assert listing[f"usr/bin/{script}"].startswith("-rwxr-xr-x")
    assert not any(p.startswith("var/") for p in listing)  # state is systemd's (StateDirectory=)
    tree = extract(debs["tether-controller"], tmp_path / "c")
    unit = (tree / "lib/systemd/system/tether-controller.service").read_text()
    assert unit == (UNITS / "tether-controller.service").read_text()
    assert (tree / "DEBIAN/conffiles").read_text().split() == ["/etc/tether/controller.env"]
    launcher = (tree / "usr/bin/tether-controller").read_text()
    assert launcher.startswith("#!/usr/bin/python3 -I\n")
    assert "sys.path[:0] = ['/usr/lib/tether-controller/lib']" in launcher
    assert "from tether.controller.main import main" in launcher
    assert "from tether.controller.cli.main import main" in (tree / "usr/bin/tetherctl").read_text()


def test_controller_unit_is_notify_watchdog_own_user_and_sandboxed() -> None:
    lines = {
        line.split("=", 1)[0]: line.split("=", 1)[1]
        for line in (UNITS / "tether-controller.service").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    }
    assert lines["Type"] == "notify" and lines["WatchdogSec"] == "1min"
    assert lines["User"] == "tether" and lines["StateDirectory"] == "tether-controller"
    assert lines["ProtectSystem"] == "strict" and lines["NoNewPrivileges"] == "yes"
    assert lines["CapabilityBoundingSet"] == ""
    assert "--data-dir /var/lib/tether-controller" in lines["ExecStart"]
    assert lines["EnvironmentFile"] == "-/etc/tether/controller.env"


def test_agent_ships_the_bootstrap_layout(debs: dict[str, Path], tmp_path: Path) -> None:
    from tether.bootstrap.layout import DEFAULT_LAYOUT, launcher

    listing = contents(debs["tether-agent"])
    bundles = [p for p in listing if re.fullmatch(r"opt/tether/agent/[0-9a-f]{16}", p)]
    assert len(bundles) == 1, bundles
    bundle_id = bundles[0].rsplit("/", 1)[1]
    assert listing["opt/tether/agent/current"].startswith("l") and listing[
        "opt/tether/agent/current"
    ].endswith(f"-> {bundle_id}")
    for path in ("BUNDLE.json", "launch.py", "lib/tether/nodeagent/main.py", "lib/grpc/__init__.py"):
        assert f"opt/tether/agent/{bundle_id}/{path}" in listing, path
    assert not any(p.startswith(f"opt/tether/agent/{bundle_id}/lib/controller") for p in listing)
    tree = extract(debs["tether-agent"], tmp_path / "a")
    assert (tree / "lib/systemd/system/tether-agent.service").read_bytes() == (
        UNITS / "tether-agent.service"
    ).read_bytes()
    assert (tree / "opt/tether/bin/tether-agent").read_bytes() == launcher(DEFAULT_LAYOUT, "/usr/bin/python3")
    assert (tree / "usr/share/doc/tether-agent/agent.yaml.example").is_file()
    assert not (tree / "DEBIAN/conffiles").exists()  # agent.yaml is the operator's, not the package's
    prerm = (tree / "DEBIAN/prerm").read_text()
    assert f"/opt/tether/agent/{bundle_id} -name __pycache__" in prerm


def test_maintainer_scripts_are_filled_in_and_valid_shell(debs: dict[str, Path], tmp_path: Path) -> None:
    for package, deb in debs.items():
        tree = extract(deb, tmp_path / package)
        for script in ("postinst", "prerm", "postrm"):
            path = tree / "DEBIAN" / script
            assert path.stat().st_mode & 0o777 == 0o755
            text = path.read_text()
            assert text.startswith("#!/bin/sh\n") and "set -e" in text
            assert "@" not in re.sub(r"\"\$@\"|\$@", "", text), f"{package} {script}: unfilled field"
            subprocess.run(["sh", "-n", str(path)], check=True)
            if shutil.which("shellcheck"):
                checked = subprocess.run(
                    ["shellcheck", "-s", "sh", str(path)], capture_output=True, text=True
                )
                assert checked.returncode == 0, checked.stdout
    controller = extract(debs["tether-controller"], tmp_path / "c2")
    postinst = (controller / "DEBIAN/postinst").read_text()
    assert "adduser --quiet --system --group" in postinst and " tether\n" in postinst
    assert "install -d -o tether -g tether -m 0700 /var/lib/tether-controller" in postinst


def test_fsys_tarball_has_no_files_from_the_build_machine(debs: dict[str, Path]) -> None:
    """Nothing from the working tree's caches (__pycache__, .egg-info) ends up in a package."""
    for deb in debs.values():
        data = subprocess.run(
            ["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True
        ).stdout
        import io

        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            names = tar.getnames()
        assert not [n for n in names if "__pycache__" in n or ".egg-info" in n or n.endswith(".pyc")]
