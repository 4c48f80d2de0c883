"""The testbed's TCP load balancer (like an NLB in front of the control planes' :6443).

Standalone (stdlib only): ``python3 lb.py --bind IP --port-file FILE --backends FILE``. Each new
connection goes to the next backend in round-robin order that accepts a TCP connection; the backends
file (a JSON list of ``host:port``) is read again for every connection, so tests can change it live.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import sys
from pathlib import Path

_counter = itertools.count()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _handle(
    backends_file: Path, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter
) -> None:
    try:
        backends = json.loads(backends_file.read_text())
    except (OSError, ValueError):
        backends = []
    start = next(_counter)
    for i in range(len(backends)):
        host, port = backends[(start + i) % len(backends)].rsplit(":", 1)
        try:
            server_r, server_w = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout=1.0)
        except (OSError, asyncio.TimeoutError):
            continue
        await asyncio.gather(_pipe(client_r, server_w), _pipe(server_r, client_w))
        return
    sys.stderr.write(f"no backend of {backends} accepts connections\n")
    client_w.close()


async def _main(args: argparse.Namespace) -> None:
    server = await asyncio.start_server(lambda r, w: _handle(args.backends, r, w), args.bind, 0)
    port = server.sockets[0].getsockname()[1]
    tmp = args.port_file.with_suffix(".tmp")
    tmp.write_text(str(port))
    tmp.rename(args.port_file)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bind", required=True)
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--backends", type=Path, required=True)
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
