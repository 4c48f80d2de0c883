"""The bare baseline: a minimal grpc.aio server with the controller's transport and message sizes.

Same TLS set-up as the controller (one port, client certificates required, a P-256 CA plus the
anonymous enrollment identity as roots), same server options, same event loop (uvloop when
installed), and replies of the same sizes; but no parsing beyond one tag byte, no auth mapping,
no store, no hub. What the controller costs on top of this is what tether adds.

    python -m bench.bare --listen 127.0.0.1:0 --pki DIR --heartbeat-seconds N
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from bench.messages import TAG_EVENTS, TAG_HELLO, canned_replies
from tether.controller.ca import CertificateAuthority
from tether.controller.transport import SERVER_OPTIONS
from tether.nodeagent import anonymous, wire
from tether.nodeagent.identity import generate_key, make_csr


class Bare:
    def __init__(self, heartbeat: int, enroll_reply: bytes) -> None:
        self.replies = canned_replies(heartbeat)
        self.enroll_reply = enroll_reply
        self.streams = 0
        self.messages = 0

    async def connect(self, requests: AsyncIterator[bytes], context: Any) -> None:
        r = self.replies
        self.streams += 1
        try:
            async for msg in requests:
                self.messages += 1
                tag = msg[0] if msg else 0
                if tag == TAG_EVENTS:
                    await context.write(r["ack"])
                elif tag == TAG_HELLO:
                    await context.write(r["welcome"])
                    await context.write(r["settings"])
                    await context.write(r["plan"])
        finally:
            self.streams -= 1

    async def enroll(self, request: bytes, context: Any) -> bytes:
        return self.enroll_reply


async def serve(args: argparse.Namespace) -> None:
    ca = CertificateAuthority.load_or_create(args.pki)
    key_pem, chain_pem = ca.server_credentials(["127.0.0.1"])
    creds = grpc.ssl_server_credentials(
        [(key_pem, chain_pem)],
        root_certificates=ca.cert_pem + anonymous.CERT_PEM,
        require_client_auth=True,
    )
    # An enrollment reply of the real size: a node certificate, the CA, names and a seq.
    sample = ca.sign_node_csr(make_csr(generate_key(), "bench-00000"), "bench-00000", 30)
    enroll_reply = wire.pb.EnrollResponse(
        certificate_pem=sample.cert_pem,
        ca_pem=ca.cert_pem,
        node_name="bench-00000",
        environment="bench",
        role="worker",
        next_seq=1,
    ).SerializeToString()
    bare = Bare(args.heartbeat_seconds, enroll_reply)
    handler = grpc.method_handlers_generic_handler(
        "bench.Bare",
        {
            "Connect": grpc.stream_stream_rpc_method_handler(bare.connect),
            "Enroll": grpc.unary_unary_rpc_method_handler(bare.enroll),
        },
    )
    server = grpc.aio.server(options=SERVER_OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_secure_port(args.listen, creds)
    if port == 0:
        raise SystemExit(f"cannot listen on {args.listen}")
    await server.start()
    host = args.listen.rpartition(":")[0]
    print(f"bare listening on {host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--listen", default="127.0.0.1:0")
    p.add_argument("--pki", type=Path, required=True)
    p.add_argument("--heartbeat-seconds", type=int, default=30)
    args = p.parse_args()
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
