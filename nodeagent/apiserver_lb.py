"""tether-apiserver-lb: the node-local TCP load balancer in front of a cluster's API servers.

With ``cluster.highAvailability.enabled`` and no ``endpoint`` there is no load balancer to name,
so every node of the cluster runs this one (the k0s "node-local load balancing" and kubespray
``loadbalancer_apiserver_localhost`` design). The step ``apiserver-lb``
(``tether.controller.render.components.apiserver_lb``) writes this file to the node and runs it
as ``tether-apiserver-lb.service``; kubeadm's ``controlPlaneEndpoint`` is
``apiserver.tether.internal:7443``, a name this process keeps mapped to 127.0.0.1 in /etc/hosts.

STANDALONE: the standard library only, no import of tether (the node runs it with its own
python3, outside the agent, so a stopped or upgrading agent never takes the API away).

* Listens on ``--listen`` (127.0.0.1:7443) and pipes each connection, as bytes (TLS passes
  through untouched), to one backend.
* Backends: the union of the ``--backends`` files, one ``host:port`` per line (``#`` comments).
  The controller rewrites ``/etc/tether/apiserver-backends`` (every control plane that joined)
  as control planes join, leave or are reset; a control plane's step writes its own API server
  to ``/etc/tether/apiserver-backends.local``, so kubeadm init reaches itself through here before
  the controller has said anything. The files are read again when they change (checked every
  second) and before each new connection.
* Health: every backend gets a TCP connect every ``--check-interval`` seconds (timeout
  ``--connect-timeout``). A backend that fails (there or when a client is dialled to it) is down:
  new connections skip it, and its open connections are closed at once so that their clients
  reconnect through another one (a powered-off machine sends no reset; haproxy's
  ``on-marked-down shutdown-sessions``). It is up again once a check connects.
* Each connection goes to the next backend that is up, round robin; a dial that fails tries the
  next one, then the ones marked down. With none answering, the client is held (up to ``--wait``
  seconds, re-dialling) rather than refused: a node may be told to join before the controller's
  backend list has reached it, and kubeadm init starts its API server behind this.
* ``--hosts-name``: kept in /etc/hosts as ``127.0.0.1 NAME`` (checked at start and whenever the
  file changes: cloud-init may rewrite it at boot).
* At most ``--max-connections`` client connections at once; one over that is closed at once.
* One line on stdout (the journal) per change: backends, up, down, no backend.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import os
import socket
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

LISTEN = "127.0.0.1:7443"
HOSTS_FILE = Path("/etc/hosts")
HOSTS_MARK = "# tether-apiserver-lb"
CHUNK = 65536


def split_address(text: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` -> (host, port); ValueError when it is neither."""
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536 or any(c.isspace() for c in host):
        raise ValueError(f"not host:port: {text!r}")
    return host, int(port)


def parse_backends(text: str) -> list[str]:
    """The ``host:port`` lines of a backends file (blank lines, ``#`` comments and bad lines skipped)."""
    out: list[str] = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            split_address(line)
        except ValueError:
            continue
        if line not in out:
            out.append(line)
    return out


def hosts_with(text: str, name: str) -> str | None:
    """``/etc/hosts`` text with ``127.0.0.1 name`` in it, or None when it already maps ``name``
    to 127.0.0.1 (a line of ours that maps it elsewhere is replaced)."""
    lines = text.splitlines()
    for line in lines:
        words = line.split("#", 1)[0].split()
        if len(words) > 1 and name in words[1:] and words[0] == "127.0.0.1":
            return None
    kept = [line for line in lines if not line.rstrip().endswith(HOSTS_MARK)]
    kept.append(f"127.0.0.1 {name} {HOSTS_MARK}")
    return "\n".join(kept) + "\n"


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class Backend:
    def __init__(self, address: str) -> None:
        self.address = address
        self.host, self.port = split_address(address)
        self.up: bool | None = None  # None: not checked yet (tried like one that is up)
        self.sessions: set[asyncio.StreamWriter] = set()  # both ends of each connection piped to it

    def close_sessions(self) -> None:
        for writer in list(self.sessions):
            with contextlib.suppress(Exception):
                writer.close()
        self.sessions.clear()


class Balancer:
    def __init__(
        self,
        files: Iterable[Path],
        *,
        check_interval: float = 2.0,
        connect_timeout: float = 1.0,
        wait: float = 15.0,
        max_connections: int = 1024,
        hosts_name: str = "",
        hosts_file: Path = HOSTS_FILE,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.files = [Path(f) for f in files]
        self.check_interval = check_interval
        self.connect_timeout = connect_timeout
        self.wait = wait
        self.max_connections = max_connections
        self.hosts_name = hosts_name
        self.hosts_file = hosts_file
        self.say = say or (lambda line: print(line, flush=True))
        self.backends: dict[str, Backend] = {}
        self.connections = 0
        self._stamps: list[tuple[int, int, int] | None] | None = None
        self._hosts_stamp: tuple[int, int, int] | None = None
        self._next = 0
        self._starved = False

    # -- configuration ------------------------------------------------------------------------

    def reload(self) -> bool:
        """Read the backends files again when one changed; True when the set changed."""
        stamps = [_stamp(p) for p in self.files]
        if stamps == self._stamps:
            return False
        self._stamps = stamps
        wanted: list[str] = []
        for path in self.files:
            try:
                text = path.read_text()
            except OSError:
                continue
            wanted += [a for a in parse_backends(text) if a not in wanted]
        if list(self.backends) == wanted:
            return False
        for address in [a for a in self.backends if a not in wanted]:
            self.backends.pop(address).close_sessions()
        self.backends = {a: self.backends.get(a) or Backend(a) for a in wanted}
        self.say(f"backends: {' '.join(wanted) or '(none)'}")
        return True

    def ensure_hosts(self) -> None:
        """Keep ``127.0.0.1 hosts_name`` in the hosts file (written in place: it may be a bind mount)."""
        if not self.hosts_name:
            return
        stamp = _stamp(self.hosts_file)
        if stamp is not None and stamp == self._hosts_stamp:
            return
        try:
            text = self.hosts_file.read_text() if stamp is not None else ""
            new = hosts_with(text, self.hosts_name)
            if new is not None:
                with open(self.hosts_file, "w") as out:
                    out.write(new)
                self.say(f"{self.hosts_file}: {self.hosts_name} is 127.0.0.1")
        except OSError as exc:
            self.say(f"cannot keep {self.hosts_name} in {self.hosts_file}: {exc}")
        self._hosts_stamp = _stamp(self.hosts_file)

    # -- health -------------------------------------------------------------------------------

    def mark(self, backend: Backend, up: bool, why: str = "") -> None:
        was = backend.up
        backend.up = up
        if up and was is not True:
            self.say(f"backend {backend.address} up")
        elif not up and was is not False:
            self.say(f"backend {backend.address} down{': ' + why if why else ''}")
            backend.close_sessions()  # their clients reconnect, through another backend

    async def dial(self, backend: Backend) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.wait_for(
            asyncio.open_connection(backend.host, backend.port), timeout=self.connect_timeout
        )

    async def check(self, backend: Backend) -> None:
        try:
            _, writer = await self.dial(backend)
        except (OSError, asyncio.TimeoutError) as exc:
            if backend.address in self.backends:
                self.mark(backend, False, _why(exc))
            return
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
        if backend.address in self.backends:
            self.mark(backend, True)

    async def watch(self) -> None:
        """Files every second, health every ``check_interval``."""
        last_check = 0.0
        while True:
            self.ensure_hosts()
            changed = self.reload()
            if changed or time.monotonic() - last_check >= self.check_interval:
                last_check = time.monotonic()
                await asyncio.gather(*(self.check(b) for b in list(self.backends.values())))
            await asyncio.sleep(min(1.0, self.check_interval))

    # -- connections --------------------------------------------------------------------------

    def candidates(self) -> list[Backend]:
        """Up (or unchecked) backends from the next in turn, then the ones marked down."""
        backends = list(self.backends.values())
        if not backends:
            return []
        self._next = (self._next + 1) % len(backends)
        turn = backends[self._next :] + backends[: self._next]
        return [b for b in turn if b.up is not False] + [b for b in turn if b.up is False]

    async def connect(self) -> tuple[Backend, asyncio.StreamReader, asyncio.StreamWriter] | None:
        deadline = time.monotonic() + self.wait
        while True:
            self.reload()
            for backend in self.candidates():
                try:
                    reader, writer = await self.dial(backend)
                except (OSError, asyncio.TimeoutError) as exc:
                    if backend.address in self.backends:
                        self.mark(backend, False, _why(exc))
                    continue
                if self._starved:
                    self._starved = False
                    self.say(f"connections go to {backend.address} again")
                if backend.address in self.backends:
                    self.mark(backend, True)
                return backend, reader, writer
            if not self._starved:
                self._starved = True
                self.say("no backend answers; holding new connections")
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(0.25)

    async def handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self.connections >= self.max_connections:
            client_w.close()
            return
        self.connections += 1
        try:
            found = await self.connect()
            if found is None:
                client_w.close()
                return
            backend, up_r, up_w = found
            _keepalive(up_w)
            backend.sessions.update((client_w, up_w))
            try:
                await asyncio.gather(_pipe(client_r, up_w), _pipe(up_r, client_w))
            finally:
                backend.sessions.discard(client_w)
                backend.sessions.discard(up_w)
                for w in (client_w, up_w):
                    with contextlib.suppress(Exception):
                        w.close()
        finally:
            self.connections -= 1


def _why(exc: BaseException) -> str:
    return "timed out" if isinstance(exc, asyncio.TimeoutError) else (str(exc) or type(exc).__name__)


def _keepalive(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until EOF, then pass the EOF on (half close); an error closes the writer."""
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof() and not writer.is_closing():
            writer.write_eof()
        else:
            writer.close()
    except (OSError, RuntimeError):
        writer.close()


async def serve(balancer: Balancer, host: str, port: int) -> tuple[asyncio.Server, asyncio.Task[None]]:
    """Listen (port 0: any) and start the file and health watcher; the caller serves, then closes
    the server and cancels the watcher."""
    balancer.ensure_hosts()
    balancer.reload()
    server = await asyncio.start_server(balancer.handle, host, port, reuse_address=True)
    return server, asyncio.get_running_loop().create_task(balancer.watch())


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="tether-apiserver-lb", description="node-local TCP load balancer for the API servers"
    )
    p.add_argument("--listen", default=LISTEN, help="address:port to listen on (default %(default)s)")
    p.add_argument("--backends", action="append", type=Path, required=True, help="a backends file")
    p.add_argument("--check-interval", type=float, default=2.0)
    p.add_argument("--connect-timeout", type=float, default=1.0)
    p.add_argument("--wait", type=float, default=15.0, help="seconds a client waits for a backend")
    p.add_argument("--max-connections", type=int, default=1024)
    p.add_argument("--hosts-name", default="", help="keep '127.0.0.1 NAME' in /etc/hosts")
    return p.parse_args(argv)


async def _main(args: argparse.Namespace) -> None:
    host, port = split_address(args.listen)
    ipaddress.ip_address(host)  # a literal address: this runs before any name resolves
    balancer = Balancer(
        args.backends,
        check_interval=args.check_interval,
        connect_timeout=args.connect_timeout,
        wait=args.wait,
        max_connections=args.max_connections,
        hosts_name=args.hosts_name,
    )
    server, watcher = await serve(balancer, host, port)
    balancer.say(f"tether-apiserver-lb listening on {args.listen} (pid {os.getpid()})")
    try:
        async with server:
            await server.serve_forever()
    finally:
        watcher.cancel()


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        asyncio.run(_main(args))
    except KeyboardInterrupt:
        return 0
    except (OSError, ValueError) as exc:
        print(f"tether-apiserver-lb: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
