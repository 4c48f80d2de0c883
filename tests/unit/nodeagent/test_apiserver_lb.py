"""The node-local API server load balancer (``tether.nodeagent.apiserver_lb``) on loopback: real
sockets on 127.0.0.1, port 0 everywhere."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from tether.nodeagent import apiserver_lb as lb

pytestmark = pytest.mark.timeout(60)


class Backend:
    """A TCP server answering each line with ``NAME:line``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.server: asyncio.Server | None = None
        self.port = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self, port: int = 0) -> Backend:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", port)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        with contextlib.suppress(OSError):
            while line := await reader.readline():
                writer.write(f"{self.name}:".encode() + line)
                await writer.drain()
        writer.close()

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for w in self.writers:
            w.close()
        await self.server.wait_closed()


def dead_address() -> str:
    """A loopback port nothing listens on (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"127.0.0.1:{port}"


class Lab:
    def __init__(self, tmp: Path) -> None:
        self.files = [tmp / "apiserver-backends", tmp / "apiserver-backends.local"]
        self.lines: list[str] = []
        self.balancer: lb.Balancer | None = None
        self.server: asyncio.Server | None = None
        self.watcher: asyncio.Task[None] | None = None
        self.port = 0

    def write(self, *addresses: str, which: int = 0) -> None:
        path = self.files[which]
        tmp = path.with_suffix(".tmp")
        tmp.write_text("# test\n" + "".join(f"{a}\n" for a in addresses))
        tmp.replace(path)

    async def start(self, **kw: float) -> lb.Balancer:
        self.balancer = lb.Balancer(
            self.files,
            check_interval=kw.pop("check_interval", 0.2),
            connect_timeout=0.5,
            wait=kw.pop("wait", 3.0),
            say=self.lines.append,
            **kw,  # type: ignore[arg-type]
        )
        self.server, self.watcher = await lb.serve(self.balancer, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self.balancer

    async def ask(self, text: str = "hello") -> str:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write(text.encode() + b"\n")
            await writer.drain()
            return (await asyncio.wait_for(reader.readline(), 10)).decode().strip()
        finally:
            writer.close()

    async def close(self) -> None:
        if self.watcher is not None:
            self.watcher.cancel()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@pytest.fixture
async def lab(tmp_path: Path) -> AsyncIterator[Lab]:
    made = Lab(tmp_path)
    yield made
    await made.close()


async def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


# -- pure parts --------------------------------------------------------------------------------


def test_backend_files_are_host_port_lines() -> None:
    text = (
        "# comment\n10.0.0.1:6443\n\n 10.0.0.2:6443  # trailing\nnonsense\n"
        "10.0.0.1:6443\n[fd00::1]:6443\nh:99999\n"
    )
    assert lb.parse_backends(text) == ["10.0.0.1:6443", "10.0.0.2:6443", "[fd00::1]:6443"]
    assert lb.split_address("[fd00::1]:6443") == ("fd00::1", 6443)
    with pytest.raises(ValueError):
        lb.split_address("10.0.0.1")


def test_the_hosts_entry_is_added_once_and_ours_is_replaced() -> None:
    base = "127.0.0.1 localhost\n::1 localhost\n"
    added = lb.hosts_with(base, "apiserver.tether.internal")
    assert added == base + f"127.0.0.1 apiserver.tether.internal {lb.HOSTS_MARK}\n"
    assert lb.hosts_with(added, "apiserver.tether.internal") is None
    # Someone else's mapping to 127.0.0.1 is enough; ours pointing elsewhere is replaced.
    assert (
        lb.hosts_with("127.0.0.1 localhost apiserver.tether.internal\n", "apiserver.tether.internal") is None
    )
    moved = lb.hosts_with(
        f"10.1.1.1 apiserver.tether.internal {lb.HOSTS_MARK}\n", "apiserver.tether.internal"
    )
    assert moved == f"127.0.0.1 apiserver.tether.internal {lb.HOSTS_MARK}\n"


def test_the_hosts_file_is_kept_when_something_rewrites_it(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n")
    bal = lb.Balancer([], hosts_name="apiserver.tether.internal", hosts_file=hosts, say=lambda _: None)
    bal.ensure_hosts()
    assert "127.0.0.1 apiserver.tether.internal" in hosts.read_text()
    hosts.write_text("127.0.0.1 localhost\n# rewritten at boot\n")  # cloud-init's template, say
    bal.ensure_hosts()
    assert hosts.read_text().count("apiserver.tether.internal") == 1


# -- on loopback -------------------------------------------------------------------------------


async def test_connections_are_forwarded_round_robin(lab: Lab) -> None:
    a, b = await Backend("a").start(), await Backend("b").start()
    lab.write(a.address)
    lab.write(b.address, which=1)  # a control plane's own file is part of the set
    await lab.start()
    answers = {await lab.ask("ping") for _ in range(6)}
    assert answers == {"a:ping", "b:ping"}
    await a.stop()
    await b.stop()


async def test_a_dead_backend_is_skipped(lab: Lab) -> None:
    live = await Backend("live").start()
    dead = dead_address()
    lab.write(dead, live.address)
    bal = await lab.start()
    for _ in range(5):
        assert await lab.ask() == "live:hello"
    assert bal.backends[dead].up is False
    assert any(line.startswith(f"backend {dead} down") for line in lab.lines)
    await live.stop()


async def test_a_changed_backends_file_is_picked_up(lab: Lab) -> None:
    old, new = await Backend("old").start(), await Backend("new").start()
    lab.write(old.address)
    bal = await lab.start()
    assert await lab.ask() == "old:hello"
    lab.write(new.address)
    assert await lab.ask() == "new:hello"  # read again before each connection
    assert list(bal.backends) == [new.address]
    assert f"backends: {new.address}" in lab.lines
    # ... and by the watcher, with no connection to prompt it.
    lab.write(old.address, new.address)
    await eventually(lambda: list(bal.backends) == [old.address, new.address])
    await old.stop()
    await new.stop()


async def test_a_client_waits_for_a_backend_to_appear(lab: Lab) -> None:
    """A node may be released to join before the controller's list reaches it."""
    lab.write()
    await lab.start(wait=5.0)
    later = await Backend("late").start()
    asking = asyncio.ensure_future(lab.ask())
    await asyncio.sleep(0.5)
    assert not asking.done()
    lab.write(later.address)
    assert await asking == "late:hello"
    assert "no backend answers; holding new connections" in lab.lines
    await later.stop()


async def test_with_no_backend_at_all_the_client_is_closed_after_the_wait(lab: Lab) -> None:
    lab.write(dead_address())
    await lab.start(wait=0.5)
    reader, writer = await asyncio.open_connection("127.0.0.1", lab.port)
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()


async def test_a_backend_that_comes_back_is_used_again(lab: Lab) -> None:
    first = await Backend("first").start()
    port = first.port
    lab.write(first.address)
    bal = await lab.start()
    assert await lab.ask() == "first:hello"
    await first.stop()
    await eventually(lambda: bal.backends[first.address].up is False)
    again = await Backend("again").start(port)
    await eventually(lambda: bal.backends[first.address].up is True)
    assert await lab.ask() == "again:hello"
    await again.stop()


async def test_connections_through_a_backend_marked_down_are_closed(lab: Lab) -> None:
    """A powered-off machine sends no reset: the health check ending its sessions is what makes
    clients reconnect (through another backend)."""
    one, two = await Backend("one").start(), await Backend("two").start()
    lab.write(one.address, two.address)
    bal = await lab.start(check_interval=60)  # no checks during the test: mark() stands in
    reader, writer = await asyncio.open_connection("127.0.0.1", lab.port)
    writer.write(b"x\n")
    await writer.drain()
    name = (await asyncio.wait_for(reader.readline(), 5)).decode().split(":")[0]
    used = one if name == "one" else two
    other = two if used is one else one
    bal.mark(bal.backends[used.address], False, "test")
    assert await asyncio.wait_for(reader.read(), 5) == b""  # the client sees its connection end
    writer.close()
    for _ in range(3):
        assert await lab.ask() == f"{other.name}:hello"
    await one.stop()
    await two.stop()


async def test_connections_over_the_limit_are_closed(lab: Lab) -> None:
    slow = await Backend("slow").start()
    lab.write(slow.address)
    await lab.start(max_connections=1)
    reader, writer = await asyncio.open_connection("127.0.0.1", lab.port)
    writer.write(b"one\n")
    await writer.drain()
    assert await reader.readline() == b"slow:one\n"
    r2, w2 = await asyncio.open_connection("127.0.0.1", lab.port)
    assert await asyncio.wait_for(r2.read(), 5) == b""
    writer.close()
    w2.close()
    await slow.stop()


def test_it_runs_standalone_with_the_standard_library_only(tmp_path: Path) -> None:
    """The step runs the file itself with the node's python3: no import of tether."""
    source = Path(lb.__file__).read_text()
    assert "import tether" not in source and "from tether" not in source
    out = subprocess.run(
        [sys.executable, "-I", lb.__file__, "--help"], capture_output=True, text=True, check=False, timeout=30
    )
    assert out.returncode == 0 and "--backends" in out.stdout
