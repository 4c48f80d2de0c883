"""The real agent bundle: built from wheels, served over HTTP, checked and unpacked by the node-side
program, and run by a bare interpreter (no site-packages) — so it is self-contained.

Building fetches the agent's wheels once with ``pip download`` (then they are cached under
``~/.cache/tether/bundles``, as for an operator); every later run is offline.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tether.bootstrap import nodescripts
from tether.bootstrap.bundle import AgentBundle, BundleBuilder, BundleSpec
from tether.bootstrap.bundle_http import BundleServer
from tether.nodeagent import __version__

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bundle() -> AgentBundle:
    major, minor = sys.version_info[:2]
    import platform

    libc = platform.libc_ver()[1] or "2.17"
    spec = BundleSpec(
        f"{major}.{minor}",
        "amd64" if platform.machine() == "x86_64" else "arm64",
        (int(libc.split(".")[0]), int(libc.split(".")[1])),
    )
    return asyncio.run(BundleBuilder().get(spec))


def unpack(
    python: str, archive: Path, sha: str, agents: Path, bundle_id: str, url: str = "", fresh: str = "0"
) -> subprocess.CompletedProcess[str]:
    argv = [python, "-I", "-c", nodescripts.UNPACK, str(archive), sha, str(agents), bundle_id, url, fresh]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)


def test_the_bundle_runs_on_a_bare_interpreter(bundle: AgentBundle, tmp_path: Path) -> None:
    archive = tmp_path / "cache/agent.tar.gz"
    archive.parent.mkdir()
    archive.write_bytes(bundle.path.read_bytes())
    agents = tmp_path / "opt/agent"
    out = unpack(sys.executable, archive, bundle.sha256, agents, bundle.bundle_id)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "unpacked"
    assert (agents / "current").resolve() == (agents / bundle.bundle_id).resolve()
    assert not archive.exists()
    launch = str(agents / "current/launch.py")
    # -S: not even this virtualenv's site-packages; everything comes from the bundle's lib/.
    version = subprocess.run(
        [sys.executable, "-I", "-S", launch, "version"], capture_output=True, text=True, check=True
    )
    assert version.stdout.strip() == __version__
    bare = [sys.executable, "-I", "-S", launch, "facts"]
    facts = json.loads(subprocess.run(bare, capture_output=True, text=True, check=True).stdout)
    assert facts["arch"] in ("amd64", "arm64")
    where = subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            "-c",
            f"import sys; sys.path[:0] = [{str(agents / 'current/lib')!r}]; import grpc, cryptography, yaml; "
            "print(grpc.__file__, cryptography.__file__, yaml.__file__)",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.count(str(agents / "current/lib")) == 3
    assert list(
        (agents / bundle.bundle_id / "lib/tether/nodeagent/__pycache__").glob("*.pyc")
    )  # byte-compiled


async def test_the_node_downloads_it_and_refuses_a_tampered_copy(bundle: AgentBundle, tmp_path: Path) -> None:
    async with BundleServer("127.0.0.1") as server:
        url = server.add(bundle)
        agents = tmp_path / "agent"
        archive = tmp_path / "cache/agent.tar.gz"
        ok = await asyncio.to_thread(
            unpack, sys.executable, archive, bundle.sha256, agents, bundle.bundle_id, url
        )
        assert ok.returncode == 0, ok.stderr
        assert server.requests == 1
        assert (agents / bundle.bundle_id / "BUNDLE.json").exists()
        # Same bundle again: already unpacked, nothing downloaded; --force (fresh) downloads it again.
        again = await asyncio.to_thread(
            unpack, sys.executable, archive, bundle.sha256, agents, bundle.bundle_id, url
        )
        assert again.stdout.strip() == "present" and server.requests == 1
        fresh = await asyncio.to_thread(
            unpack, sys.executable, archive, bundle.sha256, agents, bundle.bundle_id, url, "1"
        )
        assert fresh.stdout.strip() == "unpacked" and server.requests == 2
        # A checksum the archive does not have: refused, nothing unpacked, nothing left behind.
        wrong = hashlib.sha256(b"something else").hexdigest()
        other = tmp_path / "agent2"
        bad = await asyncio.to_thread(unpack, sys.executable, archive, wrong, other, wrong[:16], url)
        assert bad.returncode != 0
        assert "checksum mismatch" in bad.stderr
        assert not (other / wrong[:16]).exists() and not archive.exists()
        with pytest.raises(urllib.error.HTTPError) as err:
            await asyncio.to_thread(urllib.request.urlopen, url.replace(bundle.sha256, wrong), timeout=10)
        assert err.value.code == 404
        err.value.close()


async def test_an_s3_presigned_url_delivers_it_uploaded_once(bundle: AgentBundle, tmp_path: Path) -> None:
    """S3 here is moto's server on 127.0.0.1; the node-side program downloads through the presigned URL."""
    import boto3
    from moto.server import ThreadedMotoServer

    from tether.bootstrap.delivery import S3Presigned

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        s3 = boto3.client(
            "s3",
            region_name="us-east-1",
            endpoint_url=f"http://{host}:{port}",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        s3.create_bucket(Bucket="artifacts")
        delivery = S3Presigned("s3://artifacts/tether/agents", s3)
        url = await delivery.url(bundle)
        assert "Signature=" in url and f"tether/agents/tether-agent-{bundle.sha256}.tar.gz" in url
        uploaded = s3.head_object(
            Bucket="artifacts", Key=f"tether/agents/tether-agent-{bundle.sha256}.tar.gz"
        )
        assert await delivery.url(bundle)  # a second node: presigned again, not uploaded again
        again = s3.head_object(Bucket="artifacts", Key=f"tether/agents/tether-agent-{bundle.sha256}.tar.gz")
        assert again["LastModified"] == uploaded["LastModified"]
        agents = tmp_path / "agent"
        out = await asyncio.to_thread(
            unpack, sys.executable, tmp_path / "cache/a.tar.gz", bundle.sha256, agents, bundle.bundle_id, url
        )
        assert out.returncode == 0, out.stderr
        assert (agents / "current/launch.py").exists()
    finally:
        server.stop()
