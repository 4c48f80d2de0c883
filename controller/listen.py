"""The listen address, checked before the controller creates anything on disk.

``preflight`` parses ``HOST:PORT`` (port 0..65535), resolves the host and binds a plain socket on
every address it names, then closes them: a bad address, an unknown host or a port in use is one
``ListenError`` line before the data directory, the CA or the store exist.
"""

from __future__ import annotations

import errno
import socket

from tether.controller.errors import ControllerError

MAX_PORT = 65535
WILDCARDS = ("0.0.0.0", "::", "")  # noqa: S104 (every address: recognised, not bound)


class ListenError(ControllerError):
    """The controller cannot listen where it was told to."""


def parse(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``[V6]:PORT``) as (host, port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ListenError(f"invalid listen address {address!r}: expected HOST:PORT (port 0 picks a free one)")
    number = int(port)
    if number > MAX_PORT:
        raise ListenError(f"invalid listen address {address!r}: port {number} is not in 0-{MAX_PORT}")
    if host.startswith("[") != host.endswith("]"):
        raise ListenError(f"invalid listen address {address!r}: unbalanced brackets around the host")
    if not host.strip("[]"):
        raise ListenError(
            f"invalid listen address {address!r}: name the host "
            f"(0.0.0.0:{number} or [::]:{number} for every address)"
        )
    return host.strip("[]"), number


def preflight(address: str) -> tuple[str, int]:
    """Parse ``address`` and check that it can be bound now; returns (host, port)."""
    host, port = parse(address)
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ListenError(f"cannot listen on {address}: unknown host {host!r} ({exc.strerror})") from None
    problem: OSError | None = None
    bound = 0
    for family, kind, proto, _, sockaddr in dict.fromkeys(infos):
        try:
            _try_bind(family, kind, proto, sockaddr)
            bound += 1
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ListenError(f"cannot listen on {address}: the port is already in use") from None
            problem = problem or exc
    if not bound:
        reason = problem.strerror if problem is not None else "no address to bind"
        raise ListenError(f"cannot listen on {address}: {reason}")
    return host, port


def _try_bind(family: int, kind: int, proto: int, sockaddr: tuple[object, ...]) -> None:
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does: TIME_WAIT is no conflict
        if family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.bind(sockaddr)
