"""The testbed's package server process: static files (apt repo, download mirror, images) over HTTP.

Standalone (stdlib only) so it runs detached from the process that started it:
``python3 httpserve.py --root DIR --bind IP --port-file FILE`` binds a free port and writes it to FILE.
"""

from __future__ import annotations

import argparse
import functools
import sys
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class Handler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write(f"{self.client_address[0]} {format % args}\n")
        sys.stderr.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--bind", required=True)
    parser.add_argument("--port-file", type=Path, required=True)
    args = parser.parse_args()
    ThreadingHTTPServer.daemon_threads = True
    server = ThreadingHTTPServer((args.bind, 0), functools.partial(Handler, directory=str(args.root)))
    tmp = args.port_file.with_suffix(".tmp")
    tmp.write_text(str(server.server_address[1]))
    tmp.rename(args.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
