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

A script is written once per digest (fsync'd with its directory) and read back before every
run: a file that does not hold the step's script (cut short by a power loss) is written again,
and a step whose script cannot be made right fails, never "succeeds" with an empty file. Each
run's work directory (tmpfs) is removed when the run ends, however it ends; one left by a killed
agent is removed when the next one starts (the names carry the agent's own mark, so two agents on
one host never remove each other's).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tether.nodeagent.bounds import cut_text
from tether.nodeagent.limits import MAX_LINE_BYTES, STEP_SECRETS_BYTES
from tether.nodeagent.model import Step
from tether.nodeagent.secrets import LineRedactor, Redactor

OutputSink = Callable[[list[str]], Awaitable[None]]

# How much of an over-long line is read before it is cut: the matching behind the redaction sees
# far past the cut, so a secret that starts before the cut is masked whole.
LINE_WINDOW_BYTES = 8 * MAX_LINE_BYTES
READ_CHUNK_BYTES = 64 * 1024
KILL_GRACE_SECONDS = 5.0
TIMEOUT_EXIT_CODE = 124
BAD_SCRIPT_EXIT_CODE = 126
WORKDIR_PREFIX = "tether-step-"
_KV_RE = re.compile(r"([A-Za-z0-9_.\-/]+)=(.*)")


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


def _read_kv(path: Path, present: frozenset[str] | None = None) -> dict[str, str]:
    """``key=value`` lines of ``path``; ``present``: the names in its directory, if known."""
    out: dict[str, str] = {}
    if (present is not None and path.name not in present) or not path.exists():
        return out
    for raw in path.read_text(errors="replace").splitlines():
        m = _KV_RE.fullmatch(raw.strip())
        if m:
            out[m.group(1)] = m.group(2)
    return out


def _listing(directory: Path) -> frozenset[str]:
    """The names in ``directory`` (none if it is gone): one system call where a ``stat`` per file
    that is usually absent costs an exception each."""
    try:
        return frozenset(os.listdir(directory))
    except OSError:
        return frozenset()


def _kv_bytes(values: Mapping[str, str]) -> int:
    return sum(len(k.encode()) + len(v.encode()) for k, v in values.items())


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


class ScriptMismatch(Exception):
    """The script file does not hold the step's script, even after writing it again."""


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
        self.scripts_dir = scripts_dir.absolute()  # bash runs it from another working directory
        self.redactor = redactor
        self.base_env = dict(base_env if base_env is not None else _default_env())
        self.shell = shell
        # Steps share one working directory, so relative paths mean the same thing in every step.
        self.cwd = cwd.absolute() if cwd is not None else None
        self.batch_interval = batch_interval
        self.batch_lines = batch_lines
        self.current_pgid = 0
        # This agent's mark on its work directories: its own scripts directory, so two agents on
        # one host (two state directories) never take each other's for leftovers.
        mark = hashlib.sha256(str(self.scripts_dir).encode()).hexdigest()[:12]
        self.workdir_prefix = f"{WORKDIR_PREFIX}{mark}-"

    def script_path(self, step: Step) -> Path:
        return self.scripts_dir / f"{step.digest or step.compute_digest()}.sh"

    def _write_script(self, step: Step) -> Path:
        """The step's script on disk, checked byte for byte (written, and fsync'd, when needed)."""
        path = self.script_path(step)
        want = step.script.encode()
        if _read_or_none(path) == want:
            return path
        self.scripts_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o700)
        try:
            os.write(fd, want)
            os.fchmod(fd, 0o700)
            os.fsync(fd)
        finally:
            os.close(fd)
        tmp.replace(path)
        _fsync_dir(self.scripts_dir)
        if _read_or_none(path) != want:
            raise ScriptMismatch(f"{path} does not hold the step's script even after writing it again")
        return path

    def remove_leftover_workdirs(self) -> int:
        """Remove the work directories of this agent's earlier runs (an agent that was killed)."""
        removed = 0
        for leftover in runtime_dir().glob(f"{self.workdir_prefix}*"):
            shutil.rmtree(leftover, ignore_errors=True)
            removed += 1
        return removed

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
        try:
            script = self._write_script(step)
        except (OSError, ScriptMismatch) as exc:
            return StepResult(
                exit_code=BAD_SCRIPT_EXIT_CODE, duration_seconds=0.0, error=f"cannot write the script: {exc}"
            )
        work = Path(tempfile.mkdtemp(prefix=self.workdir_prefix, dir=runtime_dir()))  # mode 0700
        try:
            env = {**self.base_env, **step.env, **(extra_env or {}), **(secret_env or {})}
            env.update(
                TETHER_STEP=step.name,
                TETHER_PROVENANCE=str(work / "provenance"),
                TETHER_SECRETS_OUT=str(work / "secrets"),
                TETHER_OUTPUTS=str(work / "outputs"),
                TETHER_WORKDIR=str(work),
            )
            return await self._run_in(step, script, work, env, on_output, on_start, final_output)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    async def _run_in(
        self,
        step: Step,
        script: Path,
        work: Path,
        env: Mapping[str, str],
        on_output: OutputSink,
        on_start: Callable[[int], None] | None,
        final_output: OutputSink | None,
    ) -> StepResult:
        started = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                self.shell,
                str(script),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                cwd=str(self._cwd(work)),
                env=dict(env),
                start_new_session=True,
                limit=1 << 20,
            )
        except OSError as exc:
            return StepResult(exit_code=127, duration_seconds=0.0, error=f"cannot start {self.shell}: {exc}")
        self.current_pgid = proc.pid
        try:
            if on_start is not None:
                on_start(proc.pid)
            timed_out = await self._supervise(proc, step, _OutputPump(self, on_output), final_output)
        finally:
            self.current_pgid = 0
        return self._result(step, proc, work, timed_out, time.monotonic() - started)

    async def _supervise(
        self,
        proc: asyncio.subprocess.Process,
        step: Step,
        pump: _OutputPump,
        final_output: OutputSink | None,
    ) -> bool:
        """Wait for the step (its timeout) while its output is pumped; True when it timed out."""
        reader = asyncio.create_task(pump.read(proc.stdout))
        flusher = asyncio.create_task(pump.flush_periodically())
        timed_out = cancelled = False
        try:
            try:
                await asyncio.wait_for(proc.wait(), step.timeout_seconds or None)
            except asyncio.TimeoutError:
                timed_out = True
                await self._terminate(proc)
            # Output may still be in the pipe; background children may hold it open forever.
            if reader.done():  # usually: the pipe closed with the step (no timer needed)
                reader.result()  # what it raised, as waiting for it would
            else:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(reader), 2.0)
        except BaseException:
            cancelled = True
            await self._terminate(proc)
            raise
        finally:
            for task in (reader, flusher):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await pump.flush(final_output if final_output is not None and not cancelled else None)
        return timed_out

    def _result(
        self, step: Step, proc: asyncio.subprocess.Process, work: Path, timed_out: bool, duration: float
    ) -> StepResult:
        present = _listing(work)
        observed = _read_kv(work / "provenance", present)
        secrets = _read_kv(work / "secrets", present)
        if secrets:
            self.redactor.add(*secrets.values())
        outputs = _read_kv(work / "outputs", present)
        code = TIMEOUT_EXIT_CODE if timed_out else (proc.returncode if proc.returncode is not None else -1)
        error = f"timed out after {step.timeout_seconds}s" if timed_out else ""
        size = _kv_bytes(secrets) + _kv_bytes(outputs)
        if size > STEP_SECRETS_BYTES:  # it could never reach the controller: fail, do not resend
            secrets, outputs = {}, {}
            code = code or 1
            error = f"the step's secrets and outputs are {size} bytes, over the limit of {STEP_SECRETS_BYTES}"
        return StepResult(
            exit_code=code,
            duration_seconds=duration,
            timed_out=timed_out,
            observed={k: self.redactor.redact(v) for k, v in observed.items()},
            secrets=secrets,
            outputs=outputs,
            error=error,
            reboot_needed=not ("no-reboot" in present and (work / "no-reboot").exists()),
        )

    def _cwd(self, fallback: Path) -> Path:
        if self.cwd is None:
            return fallback
        if not os.path.isdir(self.cwd):  # made once (mkdir on every run costs an exception)
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
    """Splits the output into lines, redacts each, hands them on in batches (by count or by time).

    A line is redacted before it is cut: a line longer than ``MAX_LINE_BYTES`` is read up to
    ``LINE_WINDOW_BYTES``, masked as a whole, then cut in bytes (saying so, once); the rest of
    it is dropped.
    """

    def __init__(self, runner: Runner, sink: OutputSink) -> None:
        self._runner = runner
        self._sink = sink
        self._redact = LineRedactor(runner.redactor)
        self._buf: list[str] = []
        self._lock = asyncio.Lock()

    async def read(self, stream: asyncio.StreamReader | None) -> None:
        if stream is None:
            return
        pending = bytearray()
        skipping = False  # dropping the rest of a line that was cut
        while chunk := await stream.read(READ_CHUNK_BYTES):
            pending += chunk
            while (nl := pending.find(b"\n")) >= 0:
                line = bytes(pending[:nl])
                del pending[: nl + 1]
                if not skipping:
                    await self._line(line)
                skipping = False
            if skipping:
                pending.clear()
            elif len(pending) > LINE_WINDOW_BYTES:
                await self._line(bytes(pending), cut=True)
                pending.clear()
                skipping = True
        if pending and not skipping:
            await self._line(bytes(pending))

    async def _line(self, raw: bytes, cut: bool = False) -> None:
        text = raw.decode("utf-8", errors="replace").rstrip("\r")
        line, _ = self._redact.redact(text)  # masked whole first: a cut never halves a secret
        self._buf.append(cut_text(line, MAX_LINE_BYTES, more=cut))
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


def _read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
