"""The agent bundles this controller hands out for agent upgrades (docs/agent-upgrades.md).

Two sources, one index by version:

* the controller's own version, built on demand with the bootstrap's bundle builder
  (``tether.bootstrap.bundle``) for one platform (``serve --agent-platform``, default the controller's own
  Python and architecture) and cached like a bootstrap's bundle;
* bundles of other versions in a directory (``serve --agent-bundles DIR``, default
  ``DATA_DIR/agent-bundles``), one file per version named ``tether-agent-<version>.tar.gz``.
  ``tether-controller agent-bundle add FILE`` checks a bundle's ``BUNDLE.json`` and copies it there
  under that name; a file dropped there by hand is taken when its name matches the version in its
  manifest (others are skipped with a warning). A file of the controller's own version replaces
  the built one (a bundle for another platform, say).

A version's SHA-256 and size go into plans (``AgentTarget``); ``chunks`` reads a bundle for
``AgentService.FetchAgentBundle``, ``AGENT_BUNDLE_CHUNK_BYTES`` at a time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from tether import nodeagent
from tether.bootstrap.bundle import AgentBundle, BundleBuilder, BundleSpec
from tether.controller.errors import ControllerError, InvalidArgument, NotFound
from tether.nodeagent import logs
from tether.nodeagent.facts import ARCH_ALIASES
from tether.nodeagent.limits import AGENT_BUNDLE_CHUNK_BYTES, AGENT_BUNDLE_MAX_BYTES, size_text
from tether.nodeagent.model import AgentTarget

if TYPE_CHECKING:
    from tether.controller.config import ControllerConfig

log = logs.get_logger("tether.controller.bundles")

PREFIX, SUFFIX = "tether-agent-", ".tar.gz"
VERSION_RE = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}")
MANIFEST_BYTES = 64 * 1024  # a BUNDLE.json larger than this is not one of ours


class Builder(Protocol):
    async def get(self, spec: BundleSpec) -> AgentBundle: ...


@dataclass(frozen=True)
class HeldBundle:
    version: str
    path: Path
    sha256: str
    size: int

    @property
    def target(self) -> AgentTarget:
        return AgentTarget(self.version, self.sha256, self.size)


def bundle_file(directory: Path, version: str) -> Path:
    return directory / f"{PREFIX}{version}{SUFFIX}"


def default_spec() -> BundleSpec:
    """The controller's own Python and architecture."""
    major, minor = sys.version_info[:2]
    return BundleSpec(f"{major}.{minor}", ARCH_ALIASES.get(platform.machine(), platform.machine()))


def parse_platform(text: str) -> BundleSpec:
    """``3.11/amd64`` (``serve --agent-platform``)."""
    python, _, arch = text.partition("/")
    if not re.fullmatch(r"3\.[0-9]{1,2}", python) or arch not in ("amd64", "arm64"):
        raise InvalidArgument(f"{text!r} is not PYTHON/ARCH (like 3.11/amd64)")
    return BundleSpec(python, arch)


def read_manifest(path: Path) -> dict[str, object]:
    """The ``BUNDLE.json`` of a bundle file (its first member: the archive is sorted)."""
    try:
        with tarfile.open(path, mode="r|gz") as tar:
            member = tar.next()
            if member is None or member.name != "BUNDLE.json" or not member.isfile():
                raise InvalidArgument(f"{path.name}: not a tether agent bundle (no BUNDLE.json first)")
            if member.size > MANIFEST_BYTES:
                raise InvalidArgument(f"{path.name}: BUNDLE.json is {size_text(member.size)}")
            fileobj = tar.extractfile(member)
            doc = json.loads(fileobj.read() if fileobj else b"")
    except (OSError, tarfile.TarError, EOFError, ValueError) as exc:
        raise InvalidArgument(f"{path.name}: not a readable agent bundle: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("tether_version"), str):
        raise InvalidArgument(f"{path.name}: BUNDLE.json names no tether_version")
    return doc


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def add_file(directory: Path, source: Path) -> HeldBundle:
    """Copy the bundle ``source`` into ``directory`` under its version's name (atomically)."""
    size = source.stat().st_size
    if size > AGENT_BUNDLE_MAX_BYTES:
        raise InvalidArgument(
            f"{source.name} is {size_text(size)}; agents take at most {size_text(AGENT_BUNDLE_MAX_BYTES)}"
        )
    version = str(read_manifest(source)["tether_version"])
    if not VERSION_RE.fullmatch(version):
        raise InvalidArgument(f"{source.name}: {version!r} is not a version name")
    directory.mkdir(parents=True, exist_ok=True, mode=0o755)
    final = bundle_file(directory, version)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".add-")
    try:
        with os.fdopen(fd, "wb") as out, open(source, "rb") as src:
            shutil.copyfileobj(src, out, 1 << 20)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    return HeldBundle(version, final, _sha256(final), final.stat().st_size)


class AgentBundles:
    """The versions this controller can hand out; ``target`` never blocks on a build."""

    def __init__(
        self,
        directory: Path | None,
        *,
        builder: Builder | None = None,
        spec: BundleSpec | None = None,
        own_version: str = nodeagent.__version__,
    ) -> None:
        self.directory = directory
        self.own_version = own_version
        self.spec = spec or default_spec()
        self._builder = builder
        self._built: HeldBundle | None = None
        self._files: dict[str, tuple[tuple[int, int], HeldBundle | None]] = {}  # name -> (stat, bundle)

    # -- the index ------------------------------------------------------------------------------

    def target(self, version: str) -> AgentTarget | None:
        """The bundle of ``version`` as a plan names it; None when this controller has none (yet)."""
        held = self.held(version)
        return held.target if held else None

    def versions(self) -> list[AgentTarget]:
        found = self._scan()
        if self._built is not None and self._built.version not in found:
            found[self._built.version] = self._built
        return [found[v].target for v in sorted(found)]

    def held(self, version: str) -> HeldBundle | None:
        found = self._scan().get(version)
        if found is None and self._built is not None and version == self._built.version:
            return self._built
        return found

    async def ensure(self, version: str) -> AgentTarget:
        """The target of ``version``, building the controller's own version when it is not yet;
        NotFound when neither the directory nor the builder has it."""
        held = self.held(version or self.own_version)
        if held is not None:
            return held.target
        if (version or self.own_version) != self.own_version:
            where = f" (put tether-agent-{version}.tar.gz in {self.directory})" if self.directory else ""
            raise NotFound(f"no agent bundle of version {version!r}{where}")
        if self._builder is None:
            raise NotFound(f"no agent bundle of version {self.own_version!r} and no builder to make one")
        try:
            bundle = await self._builder.get(self.spec)
        except Exception as exc:  # BundleError: pip could not fetch the wheels, say
            raise ControllerError(f"cannot build the agent bundle {self.own_version}: {exc}") from None
        self._built = HeldBundle(self.own_version, bundle.path, bundle.sha256, bundle.size)
        log.info("agent bundle built", version=self.own_version, sha256=bundle.sha256, size=bundle.size)
        return self._built.target

    def _scan(self) -> dict[str, HeldBundle]:
        """The directory's bundles by version; a file is read again only when it changed."""
        if self.directory is None or not self.directory.is_dir():
            return {}
        seen: dict[str, tuple[tuple[int, int], HeldBundle | None]] = {}
        for entry in os.scandir(self.directory):
            name = entry.name
            if not (name.startswith(PREFIX) and name.endswith(SUFFIX)) or not entry.is_file():
                continue
            st = entry.stat()
            key = (st.st_size, st.st_mtime_ns)
            cached = self._files.get(name)
            if cached is None or cached[0] != key:
                cached = (key, self._load(Path(entry.path)))
            seen[name] = cached
        self._files = seen
        return {held.version: held for _, held in seen.values() if held is not None}

    def _load(self, path: Path) -> HeldBundle | None:
        version = path.name[len(PREFIX) : -len(SUFFIX)]
        try:
            if not VERSION_RE.fullmatch(version):
                raise InvalidArgument(f"{version!r} is not a version name")
            size = path.stat().st_size
            if size > AGENT_BUNDLE_MAX_BYTES:
                raise InvalidArgument(f"{size_text(size)} is over {size_text(AGENT_BUNDLE_MAX_BYTES)}")
            named = read_manifest(path)["tether_version"]
            if named != version:
                raise InvalidArgument(f"its BUNDLE.json says version {named!r}")
            return HeldBundle(version, path, _sha256(path), size)
        except (ControllerError, OSError) as exc:
            log.warning("agent bundle skipped", file=path.name, reason=str(exc))
            return None

    # -- reading --------------------------------------------------------------------------------

    def chunks(
        self, held: HeldBundle, offset: int = 0, chunk_bytes: int = AGENT_BUNDLE_CHUNK_BYTES
    ) -> Generator[tuple[int, bytes], None, None]:
        """(offset, data) from ``offset`` to the end, at most ``chunk_bytes`` each (one open file:
        a bundle replaced meanwhile is read as it was)."""
        chunk_bytes = max(1, min(chunk_bytes, AGENT_BUNDLE_CHUNK_BYTES))
        with open(held.path, "rb") as f:
            f.seek(offset)
            position = offset
            while position < held.size:
                data = f.read(min(chunk_bytes, held.size - position))
                if not data:
                    raise OSError(f"{held.path.name} is shorter than {held.size} bytes")
                yield position, data
                position += len(data)


def bundle_cache(data_dir: Path) -> Path:
    """Where the controller's bundle builds are cached (as for ``AdminService.Bootstrap``)."""
    return Path(os.environ.get("TETHER_BUNDLE_CACHE", "") or data_dir / "bundles")


def agent_bundles(config: ControllerConfig) -> AgentBundles:
    """The controller's bundles as ``serve`` flags set them."""
    return AgentBundles(
        config.agent_bundles_dir or config.data_dir / "agent-bundles",
        builder=BundleBuilder(bundle_cache(config.data_dir)),  # PipWheels honours $TETHER_WHEEL_DIR
        spec=parse_platform(config.agent_platform) if config.agent_platform else None,
    )
