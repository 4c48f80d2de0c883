"""Runs one step: bash in its own process group, output streamed in batches.

Knows nothing about gRPC, plans or the journal: it takes a ``Step`` and the
secret values for it, and reports output lines through a callback. A timeout
terminates the whole process group (SIGTERM, then SIGKILL after a grace
period). Steps talk back through two files named in their environment:

- ``$TETHER_PROVENANCE``: ``key=value`` lines of what the step found installed;
- ``$TETHER_SECRETS_OUT``: ``KEY=VALUE`` secret outputs (e.g. join material),
  read once, deleted, never logged;
- ``$TETHER_OUTPUTS``: ``KEY=VALUE`` outputs that are not secret but belong with them
  (e.g. the API endpoint beside the join token);
- ``$TETHER_WORKDIR/no-reboot``: a step flagged ``reboot`` creates it when the reboot turned
  out to be unnecessary (the pinned kernel is already running).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from nodeagent.model import Step
from nodeagent.secrets import Redactor

OutputSink = Callable[[list[str]], Awaitable[None]]

MAX_LINE = 8192
KILL_GRACE_SECONDS = 5.0
TIMEOUT_EXIT_CODE = 124
# Secret shapes masked even before the agent knows the value (kubeadm prints its own token).
SECRET_PATTERNS = re.compile(
    r"\b[a-z0-9]{6}\.[a-z0-9]{16}\b"  # kubeadm bootstrap token
    r"|(?<=--certificate-key )[a-f0-9]{64}\b"  # kubeadm certificate key
    r"|\b[a-z0-9]{6}\.[a-z0-9]{32}\b"  # tether join token
)
_KV_RE = re.compile(r"^([A-Za-z0-9_.\-/]+)=(.*)$")


@dataclass(frozen=True)
class StepResult:
    exit_code: int
    duration_seconds: float
    timed_out: bool = False
    observed: Mapping[str, str] = field(default_factory=dict)
    secrets: Mapping[str, str] = field(default_factory=dict)
    outputs: Mapping[str, str] = field(default_factory=dict)
    error: str = ""
    reboot_needed: bool = True

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.error


def runtime_dir() -> Path:
    """Where per-run files live: tmpfs when possible (secrets outputs never hit a disk)."""
    for candidate in (os.environ.get("RUNTIME_DIRECTORY", ""), "/run/tether", "/dev/shm"):
        if candidate and os.path.isdir(candidate) and os.access(candidate, os.W_OK):
            return Path(candidate)
    return Path(tempfile.gettempdir())


def redact_line(line: str, redactor: Redactor) -> str:
    line = redactor.redact(line)
    return SECRET_PATTERNS.sub("[REDACTED]", line)


def _read_kv(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    if not path.exists():
        return out
    for raw in path.read_text(errors="replace").splitlines():
        m = _KV_RE.match(raw.strip())
        if m:
            out[m.group(1)] = m.group(2)
    return out


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> bool:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def kill_leftovers(script: Path) -> int:
    """Stop process groups still running ``script`` (an attempt that outlived a crashed agent)."""
    killed = 0
    target = str(script)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            pid = int(proc.name)
            if len(argv) > 1 and argv[1].decode(errors="replace") == target and os.getpgid(pid) == pid:
                killed += kill_group(pid)
        except (OSError, ValueError):
            continue
    return killed


class Runner:
    def __init__(
        self,
        scripts_dir: Path,
        redactor: Redactor,
        *,
        base_env: Mapping[str, str] | None = None,
        shell: str = "bash",
        cwd: Path | None = None,
        batch_interval: float = 0.25,
        batch_lines: int = 500,
    ) -> None:
        self.scripts_dir = scripts_dir
        self.redactor = redactor
        self.base_env = dict(base_env if base_env is not None else _default_env())
        self.shell = shell
        # Steps share one working directory, so relative paths mean the same thing in every step.
        self.cwd = cwd
        self.batch_interval = batch_interval
        self.batch_lines = batch_lines
        self.current_pgid = 0

    def script_path(self, step: Step) -> Path:
        return self.scripts_dir / f"{step.digest or step.compute_digest()}.sh"

    def _write_script(self, step: Step) -> Path:
        path = self.script_path(step)
        if not path.exists():
            self.scripts_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(step.script)
            tmp.chmod(0o700)
            tmp.replace(path)
        return path

    async def run(
        self,
        step: Step,
        on_output: OutputSink,
        *,
        secret_env: Mapping[str, str] | None = None,
        extra_env: Mapping[str, str] | None = None,
        on_start: Callable[[int], None] | None = None,
        final_output: OutputSink | None = None,
    ) -> StepResult:
        """Run ``step``; output goes to ``on_output`` in batches while it runs.

        With ``final_output``, the lines still buffered when the step ends go there instead
        (not when the run is cancelled), so a caller can record them together with the result.
        """
        script = self._write_script(step)
        work = _make_workdir()
        provenance, secrets_out, outputs_out = work / "provenance", work / "secrets", work / "outputs"
        env = {**self.base_env, **step.env, **(extra_env or {}), **(secret_env or {})}
        env.update(
            TETHER_STEP=step.name,
            TETHER_PROVENANCE=str(provenance),
            TETHER_SECRETS_OUT=str(secrets_out),
            TETHER_OUTPUTS=str(outputs_out),
            TETHER_WORKDIR=str(work),
        )
        started = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                self.shell,
                str(script),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                cwd=str(self._cwd(work)),
                env=env,
                start_new_session=True,
                limit=1 << 20,
            )
        except OSError as exc:
            shutil.rmtree(work, ignore_errors=True)
            return StepResult(exit_code=127, duration_seconds=0.0, error=f"cannot start {self.shell}: {exc}")
        self.current_pgid = proc.pid
        if on_start is not None:
            on_start(proc.pid)
        pump = _OutputPump(self, on_output)
        reader = asyncio.create_task(pump.read(proc.stdout))
        flusher = asyncio.create_task(pump.flush_periodically())
        timed_out = cancelled = False
        try:
            timeout = step.timeout_seconds or None
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except asyncio.TimeoutError:
                timed_out = True
                await self._terminate(proc)
            # Output may still be in the pipe; background children may hold it open forever.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(reader), 2.0)
        except asyncio.CancelledError:
            cancelled = True
            await self._terminate(proc)
            raise
        finally:
            reader.cancel()
            flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            with contextlib.suppress(asyncio.CancelledError):
                await flusher
            await pump.flush(final_output if final_output is not None and not cancelled else None)
            self.current_pgid = 0
            observed = _read_kv(provenance)
            secrets = _read_kv(secrets_out)
            outputs = _read_kv(outputs_out)
            reboot_needed = not (work / "no-reboot").exists()
            shutil.rmtree(work, ignore_errors=True)
        if secrets:
            self.redactor.add(*secrets.values())
        duration = time.monotonic() - started
        code = TIMEOUT_EXIT_CODE if timed_out else (proc.returncode if proc.returncode is not None else -1)
        error = f"timed out after {step.timeout_seconds}s" if timed_out else ""
        return StepResult(
            exit_code=code,
            duration_seconds=duration,
            timed_out=timed_out,
            observed={k: redact_line(v, self.redactor) for k, v in observed.items()},
            secrets=secrets,
            outputs=outputs,
            error=error,
            reboot_needed=reboot_needed,
        )

    def _cwd(self, fallback: Path) -> Path:
        if self.cwd is None:
            return fallback
        self.cwd.mkdir(parents=True, exist_ok=True, mode=0o700)
        return self.cwd

    async def _terminate(self, proc: asyncio.subprocess.Process) -> None:
        kill_group(proc.pid, signal.SIGTERM)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(proc.wait(), KILL_GRACE_SECONDS)
        kill_group(proc.pid, signal.SIGKILL)  # whatever is left of the group
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(proc.wait(), KILL_GRACE_SECONDS)


class _OutputPump:
    """Collects lines and hands them on in batches (by count or by time)."""

    def __init__(self, runner: Runner, sink: OutputSink) -> None:
        self._runner = runner
        self._sink = sink
        self._buf: list[str] = []
        self._lock = asyncio.Lock()

    async def read(self, stream: asyncio.StreamReader | None) -> None:
        if stream is None:
            return
        while True:
            try:
                raw = await stream.readline()
            except ValueError:  # a line over the limit: take what is there
                raw = await stream.read(1 << 20)
            if not raw:
                return
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            if len(line) > MAX_LINE:
                line = line[:MAX_LINE] + " [line truncated]"
            self._buf.append(redact_line(line, self._runner.redactor))
            if len(self._buf) >= self._runner.batch_lines:
                await self.flush()

    async def flush_periodically(self) -> None:
        while True:
            await asyncio.sleep(self._runner.batch_interval)
            await self.flush()

    async def flush(self, to: OutputSink | None = None) -> None:
        async with self._lock:
            if not self._buf:
                return
            lines, self._buf = self._buf, []
            await (to or self._sink)(lines)


def _make_workdir() -> Path:
    work = Path(tempfile.mkdtemp(prefix="tether-step-", dir=runtime_dir()))  # mkdtemp makes it 0700
    return work


def _default_env() -> dict[str, str]:
    keep = (
        "PATH",
        "HOME",
        "LANG",
        "LC_ALL",
        "TERM",
        "USER",
        "LOGNAME",
        "SHELL",
        "TMPDIR",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
    )
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    env.setdefault("LANG", "C.UTF-8")
    env["DEBIAN_FRONTEND"] = "noninteractive"
    return env
