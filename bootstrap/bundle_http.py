"""A small content-addressed HTTP server for agent bundles (nodes reached over SSM download them).

``GET /bundles/<sha256>.tar.gz`` returns a bundle that was registered with ``add``; anything else
is 404. Plain HTTP is enough: a bundle is not secret (our code and public wheels) and the node
checks the SHA-256 it was given over the transport before it unpacks anything, so a tampered
download is refused. The server lives for one bootstrap run (the CLI's ``--serve-bundle``, or
``AdminService.Bootstrap`` on the controller's host) and binds where the nodes can reach it.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from pathlib import Path
from types import TracebackType

from tether.bootstrap.bundle import AgentBundle

_PATH = re.compile(r"/bundles/([0-9a-f]{64})\.tar\.gz")
CHUNK = 1 << 20


class BundleServer:
    def __init__(self, bind_host: str, port: int = 0, advertise_host: str = "") -> None:
        self.bind_host = bind_host
        self.port = port
        self.advertise_host = advertise_host or bind_host
        self._files: dict[str, Path] = {}
        self._server: asyncio.Server | None = None
        self.requests = 0  # bundles served (for tests and timings)

    async def start(self) -> BundleServer:
        self._server = await asyncio.start_server(self._handle, self.bind_host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def add(self, bundle: AgentBundle) -> str:
        self._files[bundle.sha256] = bundle.path
        host = f"[{self.advertise_host}]" if ":" in self.advertise_host else self.advertise_host
        return f"http://{host}:{self.port}/bundles/{bundle.sha256}.tar.gz"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> BundleServer:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 30)
            while (await asyncio.wait_for(reader.readline(), 30)) not in (b"\r\n", b"\n", b""):
                pass  # headers: nothing in them matters
            parts = request.decode("latin-1").split()
            method, target = (parts[0], parts[1]) if len(parts) >= 2 else ("", "")
            m = _PATH.fullmatch(target)
            path = self._files.get(m.group(1)) if m else None
            if method not in ("GET", "HEAD") or path is None or not path.is_file():
                writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                await writer.drain()
                return
            size = path.stat().st_size
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/gzip\r\n"
                + f"Content-Length: {size}\r\n".encode()
                + b"Connection: close\r\n\r\n"
            )
            if method == "GET":
                self.requests += 1
                with path.open("rb") as fh:
                    while chunk := fh.read(CHUNK):
                        writer.write(chunk)
                        await writer.drain()
            await writer.drain()
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
