"""The agent bundle: everything the node agent needs, for one Python version and architecture.

Built on the operator's side so the node needs no internet: ``pip download --only-binary=:all:``
fetches the wheels of the agent's dependencies for the node's platform (pinned to the versions
installed here, so generated protobuf code and runtime always match), they are unpacked into
``lib/`` next to our ``tether`` package (``tether.nodeagent`` and the generated ``tether.v1``,
never the controller), and the lot is written as a
reproducible ``tar.gz`` (sorted entries, fixed times and owners: the same inputs give the same
SHA-256). Bundles are cached under ``$XDG_CACHE_HOME/tether/bundles`` by a key over everything
that goes in. The node checks the SHA-256 before unpacking (``tether.bootstrap.install``).

Layout inside the archive::

    BUNDLE.json       manifest: tether version, python, arch, wheel hashes, source digest
    launch.py         puts lib/ first on sys.path and runs tether.nodeagent.main
    lib/              unpacked wheels + tether/ (__init__.py, nodeagent/, v1/)
"""

from __future__ import annotations

import asyncio
import fcntl
import gzip
import hashlib
import importlib
import importlib.metadata
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tether import nodeagent
from tether.bootstrap.errors import BundleError

REQUIREMENTS = ("grpcio", "protobuf", "cryptography", "structlog", "pyyaml")
PACKAGES = ("tether.nodeagent", "tether.v1")  # ours, copied as source (never the controller)
MACHINES = {"amd64": "x86_64", "arm64": "aarch64"}
LAUNCH_PY = '''\
"""tether agent bundle launcher: the bundle's lib/ first on sys.path, then the agent's CLI."""
import os
import sys

sys.path[:0] = [os.path.join(os.path.dirname(os.path.realpath(__file__)), "lib")]
from tether.nodeagent.main import main  # noqa: E402

sys.exit(main())
'''


@dataclass(frozen=True)
class BundleSpec:
    python: str  # "3.11"
    arch: str  # "amd64" | "arm64"
    glibc: tuple[int, int] = (2, 17)

    @property
    def tag(self) -> str:
        return f"cp{self.python.replace('.', '')}-{self.arch}-glibc{self.glibc[0]}.{self.glibc[1]}"

    def platforms(self) -> list[str]:
        machine = MACHINES[self.arch]
        tags = [f"manylinux2014_{machine}"]
        tags += [f"manylinux_2_{minor}_{machine}" for minor in range(17, max(17, self.glibc[1]) + 1)]
        return tags


@dataclass(frozen=True)
class AgentBundle:
    path: Path
    sha256: str
    size: int
    spec: BundleSpec

    @property
    def bundle_id(self) -> str:
        return self.sha256[:16]


WheelSource = Callable[[BundleSpec, Path], Sequence[Path]]


def pinned_requirements() -> list[str]:
    """The agent's dependencies at the versions installed here."""
    pins = []
    for name in REQUIREMENTS:
        try:
            pins.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pins.append(name)
    return pins


def _wheel_dir_from_env() -> Path | None:
    value = os.environ.get("TETHER_WHEEL_DIR", "")
    return Path(value) if value else None


@dataclass(frozen=True)
class PipWheels:
    """Fetch wheels with ``pip download`` for the target platform (``find_links``: offline; by default
    ``$TETHER_WHEEL_DIR`` when set, so air-gapped operators and the test suite never reach an index)."""

    requirements: tuple[str, ...] = field(default_factory=lambda: tuple(pinned_requirements()))
    find_links: Path | None = field(default_factory=_wheel_dir_from_env)
    pip: tuple[str, ...] = (sys.executable, "-m", "pip")

    def __call__(self, spec: BundleSpec, dest: Path) -> Sequence[Path]:
        """The wheels for ``spec`` in ``dest``; pip runs only when this set was never fetched."""
        key = hashlib.sha256(
            json.dumps([spec.tag, list(self.requirements), str(self.find_links or "")]).encode()
        ).hexdigest()[:16]
        record = dest / f"wheels-{key}.json"
        if record.exists():
            names = json.loads(record.read_text())
            if all((dest / n).is_file() for n in names):
                return [dest / n for n in names]
        with tempfile.TemporaryDirectory(dir=dest) as tmp:
            self._download(spec, Path(tmp))
            names = sorted(p.name for p in Path(tmp).glob("*.whl"))
            for name in names:
                os.replace(Path(tmp, name), dest / name)
        record.write_text(json.dumps(names))
        return [dest / n for n in names]

    def _download(self, spec: BundleSpec, dest: Path) -> None:
        abi = f"cp{spec.python.replace('.', '')}"
        argv = [*self.pip, "download", "--quiet", "--only-binary=:all:", "--dest", str(dest)]
        for platform in spec.platforms():
            argv += ["--platform", platform]
        argv += ["--python-version", spec.python, "--implementation", "cp"]
        argv += ["--abi", abi, "--abi", "abi3", "--abi", "none"]
        if self.find_links is not None:
            argv += ["--no-index", "--find-links", str(self.find_links)]
        argv += list(self.requirements)
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BundleError(f"pip download failed: {exc}") from None
        if out.returncode != 0:
            tail = "\n".join(out.stderr.strip().splitlines()[-4:])
            raise BundleError(f"cannot fetch the agent's wheels for {spec.tag}: {tail}")


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tether" / "bundles"


def source_digest() -> str:
    """SHA-256 over our packages' source (paths and contents)."""
    h = hashlib.sha256()
    for rel, data in _package_files():
        h.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def _package_files() -> list[tuple[str, bytes]]:
    """Our source in the bundle, by module path: ``tether/*.py`` and the ``PACKAGES``."""
    import tether

    top = Path(tether.__file__ or "").parent
    files = [(f"tether/{path.name}", path.read_bytes()) for path in sorted(top.glob("*.py"))]
    for name in PACKAGES:
        root = Path(importlib.import_module(name).__file__ or "").parent
        prefix = name.replace(".", "/")
        for path in sorted(root.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            files.append((f"{prefix}/{path.relative_to(root).as_posix()}", path.read_bytes()))
    return files


class BundleBuilder:
    """Builds (once) and caches bundles; safe to share between concurrent bootstraps."""

    def __init__(self, cache_dir: Path | None = None, wheels: WheelSource | None = None) -> None:
        self.cache_dir = cache_dir or default_cache_dir()
        self.wheels: WheelSource = wheels or PipWheels()
        self._locks: dict[str, asyncio.Lock] = {}

    async def get(self, spec: BundleSpec) -> AgentBundle:
        lock = self._locks.setdefault(spec.tag, asyncio.Lock())
        async with lock:
            return await asyncio.to_thread(self._get, spec)

    def _get(self, spec: BundleSpec) -> AgentBundle:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        key = hashlib.sha256(
            json.dumps([spec.tag, source_digest(), repr(self.wheels)], sort_keys=True).encode()
        ).hexdigest()[:20]
        final = self.cache_dir / f"tether-agent-{spec.tag}-{key}.tar.gz"
        with open(self.cache_dir / ".lock", "w") as lockfile:
            fcntl.flock(lockfile, fcntl.LOCK_EX)  # other processes building the same bundle
            if not final.exists():
                wheel_dir = self.cache_dir / "wheels" / spec.tag
                wheel_dir.mkdir(parents=True, exist_ok=True)
                wheels = self.wheels(spec, wheel_dir)
                data = build_archive(spec, wheels)
                tmp = final.with_suffix(".tmp")
                tmp.write_bytes(data)
                os.replace(tmp, final)
        data = final.read_bytes()
        return AgentBundle(final, hashlib.sha256(data).hexdigest(), len(data), spec)


def build_archive(spec: BundleSpec, wheels: Sequence[Path]) -> bytes:
    """The reproducible tar.gz for ``spec`` from ``wheels`` and our packages."""
    entries: dict[str, tuple[bytes, int]] = {}
    manifest_wheels = {}
    for wheel in wheels:
        data = wheel.read_bytes()
        manifest_wheels[wheel.name] = hashlib.sha256(data).hexdigest()
        for name, content, mode in _wheel_members(wheel.name, data):
            entries[f"lib/{name}"] = (content, mode)
    if not any(name.startswith("lib/grpc/") for name in entries) and wheels:
        raise BundleError(f"the wheels for {spec.tag} do not contain grpcio")
    for rel, data in _package_files():
        entries[f"lib/{rel}"] = (data, 0o644)
    import tether

    manifest = {
        "tether_version": nodeagent.__version__,
        "python": spec.python,
        "arch": spec.arch,
        "glibc": f"{spec.glibc[0]}.{spec.glibc[1]}",
        "wheels": manifest_wheels,
        "source_sha256": source_digest(),
        "generated_package": tether.__name__,
    }
    entries["BUNDLE.json"] = (json.dumps(manifest, indent=2, sort_keys=True).encode(), 0o644)
    entries["launch.py"] = (LAUNCH_PY.encode(), 0o644)
    return _tar_gz(entries)


def _wheel_members(wheel_name: str, data: bytes) -> list[tuple[str, bytes, int]]:
    members = []
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            for info in zf.infolist():
                if info.is_dir():
                    continue
                name = info.filename
                parts = name.split("/")
                if parts[0].endswith(".data"):
                    if len(parts) > 2 and parts[1] in ("purelib", "platlib"):
                        name = "/".join(parts[2:])
                    else:
                        continue  # scripts, headers, data: not needed to import the package
                if ".." in name.split("/") or name.startswith("/"):
                    raise BundleError(f"{wheel_name}: unsafe path {info.filename!r}")
                mode = 0o755 if (info.external_attr >> 16) & 0o111 else 0o644
                members.append((name, zf.read(info), mode))
    except zipfile.BadZipFile as exc:
        raise BundleError(f"{wheel_name} is not a valid wheel: {exc}") from None
    return members


def _tar_gz(entries: dict[str, tuple[bytes, int]]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs: set[str] = set()
        for name in sorted(entries):
            parts = name.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    tar.addfile(_info(d, 0, 0o755, tarfile.DIRTYPE))
            content, mode = entries[name]
            tar.addfile(_info(name, len(content), mode, tarfile.REGTYPE), io.BytesIO(content))
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, compresslevel=6) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def _info(name: str, size: int, mode: int, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.type = size, mode, kind
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    return info


def manifest(data: bytes) -> dict[str, object]:
    """The BUNDLE.json of a bundle archive."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        member = tar.extractfile("BUNDLE.json")
        if member is None:
            raise BundleError("the bundle has no BUNDLE.json")
        doc = json.loads(member.read())
    if not isinstance(doc, dict):
        raise BundleError("BUNDLE.json is not an object")
    return doc
