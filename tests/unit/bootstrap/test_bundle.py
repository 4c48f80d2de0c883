"""The agent bundle: reproducible archives from wheels plus our packages, built once per key."""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from tether.bootstrap.bundle import BundleBuilder, BundleSpec, PipWheels, build_archive, manifest
from tether.bootstrap.errors import BundleError

SPEC = BundleSpec("3.11", "amd64", (2, 36))


def wheel(tmp: Path, name: str, files: dict[str, bytes]) -> Path:
    path = tmp / name
    with zipfile.ZipFile(path, "w") as zf:
        for member, data in files.items():
            zf.writestr(member, data)
    return path


def grpc_wheel(tmp: Path) -> Path:
    return wheel(
        tmp,
        "grpcio-1.0-cp311-cp311-manylinux2014_x86_64.whl",
        {
            "grpc/__init__.py": b"# grpc\n",
            "grpc/_cython/cygrpc.so": b"\x7fELF",
            "grpcio-1.0.dist-info/METADATA": b"Name: grpcio\n",
            "grpcio-1.0.data/purelib/grpc_extra.py": b"x = 1\n",
            "grpcio-1.0.data/scripts/tool": b"#!/bin/sh\n",
        },
    )


def names(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return tar.getnames()


def test_archive_has_wheels_our_packages_a_launcher_and_a_manifest(tmp_path: Path) -> None:
    data = build_archive(SPEC, [grpc_wheel(tmp_path)])
    members = names(data)
    assert "launch.py" in members and "BUNDLE.json" in members
    assert "lib/grpc/_cython/cygrpc.so" in members
    assert "lib/grpc_extra.py" in members  # .data/purelib lands in lib/
    assert not any("scripts/tool" in m for m in members)
    assert "lib/tether/nodeagent/main.py" in members and "lib/tether/__init__.py" in members
    operator_side = ("lib/tether/controller/", "lib/tether/bootstrap/")
    assert not [m for m in members if m.startswith(operator_side)]
    assert "lib/tether/v1/agent_pb2.py" in members
    assert not any("__pycache__" in m for m in members)
    doc = manifest(data)
    assert doc["python"] == "3.11" and doc["arch"] == "amd64"
    assert list(doc["wheels"]) == ["grpcio-1.0-cp311-cp311-manylinux2014_x86_64.whl"]  # type: ignore[call-overload]


def test_archive_is_reproducible(tmp_path: Path) -> None:
    w = grpc_wheel(tmp_path)
    assert (
        hashlib.sha256(build_archive(SPEC, [w])).digest() == hashlib.sha256(build_archive(SPEC, [w])).digest()
    )
    with tarfile.open(fileobj=io.BytesIO(build_archive(SPEC, [w])), mode="r:gz") as tar:
        assert {(m.mtime, m.uid, m.gid, m.uname) for m in tar.getmembers()} == {(0, 0, 0, "")}


def test_bad_wheels_are_refused(tmp_path: Path) -> None:
    evil = wheel(tmp_path, "evil-1-py3-none-any.whl", {"grpc/x.py": b"", "../../etc/passwd": b"x"})
    with pytest.raises(BundleError, match="unsafe path"):
        build_archive(SPEC, [evil])
    (tmp_path / "broken-1-py3-none-any.whl").write_bytes(b"not a zip")
    with pytest.raises(BundleError, match="not a valid wheel"):
        build_archive(SPEC, [tmp_path / "broken-1-py3-none-any.whl"])
    with pytest.raises(BundleError, match="do not contain grpcio"):
        build_archive(SPEC, [wheel(tmp_path, "x-1-py3-none-any.whl", {"x.py": b""})])


async def test_builder_fetches_once_per_spec_and_caches(tmp_path: Path) -> None:
    calls: list[BundleSpec] = []

    def wheels(spec: BundleSpec, dest: Path) -> Sequence[Path]:
        calls.append(spec)
        return [grpc_wheel(dest)]

    builder = BundleBuilder(tmp_path / "cache", wheels)
    first = await builder.get(SPEC)
    second = await builder.get(SPEC)
    assert first == second
    assert calls == [SPEC]
    assert first.sha256 == hashlib.sha256(first.path.read_bytes()).hexdigest()
    other = await BundleBuilder(tmp_path / "cache", wheels).get(BundleSpec("3.12", "arm64"))
    assert other.sha256 != first.sha256 and len(calls) == 2


def test_platform_tags_and_pip_arguments(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    spec = BundleSpec("3.12", "arm64", (2, 28))
    tags = spec.platforms()
    assert tags[0] == "manylinux2014_aarch64"
    assert tags[-1] == "manylinux_2_28_aarch64"
    assert "manylinux_2_29_aarch64" not in tags
    seen: list[list[str]] = []

    def fake_run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        seen.append(argv)
        return subprocess.CompletedProcess(
            argv, 1, "", "ERROR: No matching distribution found for grpcio==1.0"
        )

    monkeypatch.setattr(subprocess, "run", fake_run)
    with pytest.raises(BundleError, match="No matching distribution"):
        PipWheels(requirements=("grpcio==1.0",), find_links=Path("/wheels"), pip=("pip",))(spec, tmp_path)
    argv = seen[0]
    assert argv[:3] == ["pip", "download", "--quiet"]
    assert "--only-binary=:all:" in argv
    assert argv[argv.index("--find-links") + 1] == "/wheels" and "--no-index" in argv
    assert argv[argv.index("--python-version") + 1] == "3.12"
    assert "cp312" in argv
    assert argv[-1] == "grpcio==1.0"


def test_pip_runs_only_for_a_set_of_wheels_it_never_fetched(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    runs: list[list[str]] = []

    def fake_run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        runs.append(argv)
        grpc_wheel(Path(argv[argv.index("--dest") + 1]))
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    first = PipWheels(requirements=("grpcio==1.0",), pip=("pip",))(SPEC, tmp_path)
    again = PipWheels(requirements=("grpcio==1.0",), pip=("pip",))(SPEC, tmp_path)
    assert first == again
    assert [p.name for p in first] == ["grpcio-1.0-cp311-cp311-manylinux2014_x86_64.whl"]
    assert len(runs) == 1
    PipWheels(requirements=("grpcio==2.0",), pip=("pip",))(SPEC, tmp_path)
    assert len(runs) == 2
