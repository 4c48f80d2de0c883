"""How the agent bundle reaches the node.

- ``Push``: through the transport itself (SSH: the archive is the stdin of one command).
- ``Served``: the node downloads it from a ``BundleServer`` (the controller's host for
  ``AdminService.Bootstrap``, or ``tetherctl bootstrap --serve-bundle HOST:PORT``).
- ``S3Presigned``: uploaded once to ``s3://BUCKET/PREFIX/<sha256>.tar.gz``; the node downloads
  it through a presigned URL that expires after 15 minutes.

In every case the node gets the SHA-256 over the transport and refuses an archive that does not
match it. SSM cannot push a 14 MB archive through commands, so an SSM node needs a URL.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

from tether.bootstrap.bundle import AgentBundle
from tether.bootstrap.bundle_http import BundleServer
from tether.bootstrap.errors import BundleError

PRESIGN_SECONDS = 900


class Delivery(Protocol):
    description: str

    async def url(self, bundle: AgentBundle) -> str:
        """Where the node downloads ``bundle``; empty: push it through the transport."""


class Push:
    description = "pushed over the transport"

    async def url(self, bundle: AgentBundle) -> str:
        return ""


@dataclass
class Served:
    server: BundleServer
    description: str = "downloaded from the bundle server"

    async def url(self, bundle: AgentBundle) -> str:
        return self.server.add(bundle)


def parse_s3_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://") or len(uri) <= 5:
        raise ValueError(f"invalid S3 location {uri!r}: expected s3://BUCKET[/PREFIX]")
    bucket, _, prefix = uri[5:].partition("/")
    return bucket, prefix.strip("/")


class S3Presigned:
    description = "downloaded from S3 (presigned URL)"

    def __init__(self, uri: str, client: Any) -> None:
        self.bucket, self.prefix = parse_s3_uri(uri)
        self._client = client
        self._lock = asyncio.Lock()

    def _key(self, bundle: AgentBundle) -> str:
        name = f"tether-agent-{bundle.sha256}.tar.gz"
        return f"{self.prefix}/{name}" if self.prefix else name

    async def url(self, bundle: AgentBundle) -> str:
        key = self._key(bundle)
        async with self._lock:  # one upload even when many nodes need the same bundle
            try:
                await asyncio.to_thread(self._upload_once, bundle, key)
                return str(
                    await asyncio.to_thread(
                        self._client.generate_presigned_url,
                        "get_object",
                        Params={"Bucket": self.bucket, "Key": key},
                        ExpiresIn=PRESIGN_SECONDS,
                    )
                )
            except BundleError:
                raise
            except Exception as exc:
                raise BundleError(f"cannot publish the bundle to s3://{self.bucket}/{key}: {exc}") from None

    def _upload_once(self, bundle: AgentBundle, key: str) -> None:
        try:
            head = self._client.head_object(Bucket=self.bucket, Key=key)
            if int(head.get("ContentLength", -1)) == bundle.size:
                return
        except Exception as exc:
            code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
            if code not in ("404", "NoSuchKey", "NotFound"):
                raise
        with bundle.path.open("rb") as fh:
            self._client.put_object(Bucket=self.bucket, Key=key, Body=fh, ContentType="application/gzip")
