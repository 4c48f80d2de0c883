"""The controller's agent bundles: the directory by version, the own version built on demand, chunks."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from tests.unit.nodeagent.test_upgrade import archive
from tether.bootstrap.bundle import AgentBundle, BundleSpec
from tether.controller.agentbundles import AgentBundles, add_file, bundle_file
from tether.controller.errors import InvalidArgument, NotFound
from tether.nodeagent.limits import AGENT_BUNDLE_CHUNK_BYTES


class FakeBuilder:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.specs: list[BundleSpec] = []

    async def get(self, spec: BundleSpec) -> AgentBundle:
        self.specs.append(spec)
        data = self.path.read_bytes()
        return AgentBundle(self.path, hashlib.sha256(data).hexdigest(), len(data), spec)


def test_bundles_in_the_directory_are_found_by_the_version_in_their_name(tmp_path: Path) -> None:
    d = tmp_path / "bundles"
    d.mkdir()
    data = archive("2.0")
    bundle_file(d, "2.0").write_bytes(data)
    bundle_file(d, "3.0").write_bytes(archive("3.1"))  # name and manifest disagree: skipped
    (d / "notes.txt").write_text("not a bundle")
    bundles = AgentBundles(d, own_version="1.0")
    target = bundles.target("2.0")
    assert target is not None and target.size == len(data)
    assert target.sha256 == hashlib.sha256(data).hexdigest()
    assert bundles.target("3.0") is None and bundles.target("1.0") is None
    assert [t.version for t in bundles.versions()] == ["2.0"]
    bundle_file(d, "4.0").write_bytes(archive("4.0"))  # dropped in while running: seen at once
    assert [t.version for t in bundles.versions()] == ["2.0", "4.0"]
    os.remove(bundle_file(d, "2.0"))
    assert bundles.target("2.0") is None


def test_add_checks_the_manifest_and_names_the_file_after_its_version(tmp_path: Path) -> None:
    src = tmp_path / "some-name.tar.gz"
    src.write_bytes(archive("5.0"))
    held = add_file(tmp_path / "bundles", src)
    assert held.path == bundle_file(tmp_path / "bundles", "5.0") and held.version == "5.0"
    assert AgentBundles(tmp_path / "bundles").target("5.0") == held.target
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not gzip")
    with pytest.raises(InvalidArgument):
        add_file(tmp_path / "bundles", junk)


async def test_the_own_version_is_built_on_demand_and_a_file_of_it_wins(tmp_path: Path) -> None:
    built = tmp_path / "built.tar.gz"
    built.write_bytes(archive("1.0"))
    builder = FakeBuilder(built)
    bundles = AgentBundles(tmp_path / "bundles", builder=builder, own_version="1.0")
    assert bundles.target("1.0") is None  # never blocks on a build
    target = await bundles.ensure("")
    assert target.version == "1.0" and bundles.target("1.0") == target and len(builder.specs) == 1
    assert await bundles.ensure("1.0") == target and len(builder.specs) == 1
    with pytest.raises(NotFound):
        await bundles.ensure("7.0")
    (tmp_path / "bundles").mkdir()
    other = archive("1.0", arch="arm64")
    bundle_file(tmp_path / "bundles", "1.0").write_bytes(other)
    replaced = bundles.target("1.0")
    assert replaced is not None and replaced.sha256 == hashlib.sha256(other).hexdigest()


def test_chunks_resume_at_an_offset_and_are_bounded(tmp_path: Path) -> None:
    d = tmp_path / "bundles"
    d.mkdir()
    data = archive("2.0", extra=os.urandom(3 * AGENT_BUNDLE_CHUNK_BYTES // 2))
    bundle_file(d, "2.0").write_bytes(data)
    bundles = AgentBundles(d)
    held = bundles.held("2.0")
    assert held is not None
    chunks = list(bundles.chunks(held))
    assert all(len(c) <= AGENT_BUNDLE_CHUNK_BYTES for _, c in chunks) and len(chunks) == 2
    assert b"".join(c for _, c in chunks) == data
    tail = list(bundles.chunks(held, offset=1000, chunk_bytes=10 * AGENT_BUNDLE_CHUNK_BYTES))
    assert tail[0][0] == 1000 and b"".join(c for _, c in tail) == data[1000:]
    assert all(len(c) <= AGENT_BUNDLE_CHUNK_BYTES for _, c in tail)
