"""A private PostgreSQL cluster for one test session: initdb into a temp dir, pg_ctl on a free
loopback port with its socket in that dir, removed at the end (never the machine's own cluster).

As root, initdb and pg_ctl run as the ``postgres`` user (initdb refuses root); as anyone else,
as that user. ``ScratchCluster.restart`` / ``stop`` / ``start`` are the database faults.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "max_connections": "200",
    "fsync": "on",  # acknowledged means on disk, as in production
    "shared_buffers": "128MB",
    "log_min_messages": "warning",
}


def find_bin() -> Path | None:
    """The newest PostgreSQL's bin directory (Debian: /usr/lib/postgresql/<major>/bin), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_major)
    return Path(found[-1]).parent if found else None


def _major(path: str) -> int:
    part = Path(path).parent.parent.name
    return int(part) if part.isdigit() else 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ScratchCluster:
    """One cluster in ``root`` (data/, sock/, log) listening on 127.0.0.1:``port``."""

    def __init__(self, bin_dir: Path, root: Path) -> None:
        self.bin = bin_dir
        self.root = root
        self.data = root / "data"
        self.sock = root / "sock"
        self.log = root / "log"
        self.port = _free_port()
        self._user = "postgres" if os.geteuid() == 0 else None

    @property
    def url(self) -> str:
        """The ``postgres`` database (for administration: CREATE DATABASE)."""
        return self.url_for("postgres")

    def url_for(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        kw: dict[str, object] = {}
        if self._user is not None:
            entry = pwd.getpwnam(self._user)
            kw = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8", "TZ": "UTC"}
        return subprocess.run(  # type: ignore[call-overload, no-any-return]
            [str(self.bin / args[0]), *args[1:]],
            cwd=self.root,
            env=env,
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
            **kw,
        )

    def init(self) -> None:
        self.root.chmod(0o755)  # traversable by the postgres user
        for d in (self.data, self.sock):
            d.mkdir()
        self.log.touch()
        if self._user is not None:
            entry = pwd.getpwnam(self._user)
            for p in (self.data, self.sock, self.log):
                os.chown(p, entry.pw_uid, entry.pw_gid)
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")

    def start(self) -> None:
        """Start it (again) on its port; waits until it accepts connections."""
        options = " ".join(
            [f"-p {self.port}", f"-k {self.sock}", *(f"-c {k}={v}" for k, v in SETTINGS.items())]
        )
        result = self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-w",
            "-t",
            "60",
            "-o",
            options,
            "start",
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed: {result.stdout}{result.stderr}\n{self.log_tail()}")

    def stop(self, mode: str = "fast") -> None:
        """Stop it: ``mode`` "immediate" is a crash stop (like kill -9 of the server)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def restart(self, mode: str = "immediate") -> None:
        """The "database restarted" fault: stop (a crash stop by default) and start on the same port."""
        self.stop(mode)
        self.start()

    def running(self) -> bool:
        return self._run("pg_ctl", "-D", str(self.data), "status", check=False).returncode == 0

    def create_database(self, name: str = "") -> str:
        """A fresh empty database; its URL."""
        import psycopg

        name = name or f"t_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(self.url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url_for(name)

    def drop_database(self, url: str) -> None:
        import psycopg

        name = url.rsplit("/", 1)[1]
        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(self.url, autocommit=True, connect_timeout=10) as conn,
        ):
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def remove(self) -> None:
        """Crash-stop it (by its data dir) and remove every file; safe to call twice."""
        if self.data.exists():
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def start_cluster() -> ScratchCluster:
    """A running scratch cluster (removed at exit even if the caller forgets); RuntimeError if
    PostgreSQL is not installed or will not start."""
    bin_dir = find_bin()
    if bin_dir is None:
        raise RuntimeError("PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb)")
    cluster = ScratchCluster(bin_dir, Path(tempfile.mkdtemp(prefix="tether-pg.")))
    atexit.register(cluster.remove)
    try:
        cluster.init()
        for attempt in range(3):  # the free port may be taken between the probe and the start
            try:
                cluster.start()
                break
            except RuntimeError:
                if attempt == 2:
                    raise
                cluster.port = _free_port()
    except BaseException:
        cluster.remove()
        raise
    return cluster
