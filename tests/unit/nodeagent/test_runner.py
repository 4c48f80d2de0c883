"""The step runner: real bash, process groups, timeouts, batched output, step outputs."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from tether.nodeagent.model import Step
from tether.nodeagent.runner import TIMEOUT_EXIT_CODE, Runner
from tether.nodeagent.secrets import Redactor


def make_runner(tmp_path: Path, **kw: object) -> Runner:
    return Runner(tmp_path / "scripts", Redactor(), batch_interval=0.05, **kw)  # type: ignore[arg-type]


class Sink:
    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    async def __call__(self, lines: list[str]) -> None:
        self.batches.append(lines)

    @property
    def lines(self) -> list[str]:
        return [line for b in self.batches for line in b]


async def test_runs_bash_and_streams_output_in_order(tmp_path: Path) -> None:
    sink = Sink()
    step = Step(
        name="s", script="for i in $(seq 1 5); do echo line $i; done; echo err >&2; exit 3\n"
    ).sealed()
    result = await make_runner(tmp_path).run(step, sink)
    assert result.exit_code == 3 and not result.ok
    assert sink.lines == ["line 1", "line 2", "line 3", "line 4", "line 5", "err"]


async def test_output_is_batched_not_one_event_per_line(tmp_path: Path) -> None:
    sink = Sink()
    step = Step(name="s", script="seq 1 2000\n").sealed()
    await make_runner(tmp_path).run(step, sink)
    assert len(sink.lines) == 2000
    assert len(sink.batches) < 50


async def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    marker = tmp_path / "child.pid"
    step = Step(
        name="slow", timeout_seconds=1, script=f"sleep 300 & echo $! > {marker}\nsleep 300\n"
    ).sealed()
    started = time.monotonic()
    result = await make_runner(tmp_path).run(step, Sink())
    assert result.timed_out and result.exit_code == TIMEOUT_EXIT_CODE
    assert "timed out after 1s" in result.error
    assert time.monotonic() - started < 15
    child = int(marker.read_text())
    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        await asyncio.sleep(0.1)
    else:
        pytest.fail("the background child of a timed-out step survived")


async def test_step_env_and_secret_env_reach_the_process_not_the_script(tmp_path: Path) -> None:
    sink = Sink()
    step = Step(
        name="s",
        env={"PLAIN": "visible"},
        secret_env=("TOKEN",),
        script='echo "plain=$PLAIN"; echo "token-length=${#TOKEN}"\n',
    ).sealed()
    runner = make_runner(tmp_path)
    result = await runner.run(step, sink, secret_env={"TOKEN": "s3cret-canary-value"})
    assert result.ok, sink.lines
    assert sink.lines == ["plain=visible", "token-length=19"]
    assert "s3cret" not in runner.script_path(step).read_text()


async def test_provenance_and_secret_outputs_are_collected_and_secrets_redacted(tmp_path: Path) -> None:
    sink = Sink()
    script = (
        'echo "containerd.version=1.6.20" >> "$TETHER_PROVENANCE"\n'
        'echo "JOIN_TOKEN=supersecretvalue42" >> "$TETHER_SECRETS_OUT"\n'
        "sleep 0.3\n"
        "echo after: supersecretvalue42\n"
    )
    runner = make_runner(tmp_path)
    result = await runner.run(Step(name="s", script=script).sealed(), sink)
    assert result.ok
    assert result.observed == {"containerd.version": "1.6.20"}
    assert result.secrets == {"JOIN_TOKEN": "supersecretvalue42"}
    # Learned at the end of the step, so the redactor masks it from then on.
    assert runner.redactor.redact("x supersecretvalue42") == "x [REDACTED]"


async def test_secrets_too_large_to_reach_the_controller_fail_the_step(tmp_path: Path) -> None:
    """They could never be sent (the controller's receive limit): the step fails with one line
    instead of the agent resending a message the controller refuses, forever."""
    from tether.nodeagent.limits import STEP_SECRETS_BYTES

    size = STEP_SECRETS_BYTES + 10
    script = f'head -c {size} /dev/zero | tr "\\0" a | sed "s/^/KUBECONFIG=/" >> "$TETHER_SECRETS_OUT"\n'
    result = await make_runner(tmp_path).run(Step(name="s", script=script).sealed(), Sink())
    assert not result.ok and result.secrets == {} and result.outputs == {}
    assert result.error == (
        f"the step's secrets and outputs are {size + 10} bytes, over the limit of {STEP_SECRETS_BYTES}"
    )


async def test_known_secret_values_never_leave_in_output(tmp_path: Path) -> None:
    sink = Sink()
    runner = make_runner(tmp_path)
    runner.redactor.add("canary-9f8e7d6c5b")
    await runner.run(Step(name="s", script="echo leaking canary-9f8e7d6c5b now\n").sealed(), sink)
    assert sink.lines == ["leaking [REDACTED] now"]


async def test_missing_shell_is_a_clean_failure(tmp_path: Path) -> None:
    runner = make_runner(tmp_path, shell="/nonexistent/bash")
    result = await runner.run(Step(name="s", script="true\n").sealed(), Sink())
    assert not result.ok and result.exit_code == 127 and "cannot start" in result.error


async def test_outputs_travel_with_secrets_but_are_not_masked(tmp_path: Path) -> None:
    runner = make_runner(tmp_path)
    script = (
        'echo "ENDPOINT=10.0.0.2:6443" >> "$TETHER_OUTPUTS"\n'
        'echo "TOKEN=abcdef.0123456789abcdef" >> "$TETHER_SECRETS_OUT"\n'
    )
    result = await runner.run(Step(name="s", script=script).sealed(), Sink())
    assert result.outputs == {"ENDPOINT": "10.0.0.2:6443"}
    assert runner.redactor.redact("10.0.0.2:6443 abcdef.0123456789abcdef") == "10.0.0.2:6443 [REDACTED]"


# -- issue 10, item 16: the script on disk is the step's script ---------------------------------


async def test_a_script_cut_short_on_disk_is_written_again_not_run_empty(tmp_path: Path) -> None:
    runner = make_runner(tmp_path)
    step = Step(name="s", script=f"echo ran >> {tmp_path}/ran\necho done\n").sealed()
    assert (await runner.run(step, Sink())).ok
    runner.script_path(step).write_bytes(b"")  # what a power cut can leave behind
    sink = Sink()
    result = await runner.run(step, sink)
    assert result.ok and sink.lines == ["done"]
    assert (tmp_path / "ran").read_text() == "ran\nran\n"
    assert runner.script_path(step).read_text() == step.script


async def test_a_script_that_cannot_be_made_right_fails_the_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tether.nodeagent import runner as runner_module

    monkeypatch.setattr(runner_module, "_read_or_none", lambda path: b"")  # the disk gives back nothing
    result = await make_runner(tmp_path).run(Step(name="s", script="true\n").sealed(), Sink())
    assert not result.ok and result.exit_code == runner_module.BAD_SCRIPT_EXIT_CODE
    assert "does not hold the step's script" in result.error


# -- issue 10, item 17: work directories never outlive their run --------------------------------


def workdirs(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


async def test_the_work_directory_is_removed_when_the_run_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = tmp_path / "rt"
    rt.mkdir()
    monkeypatch.setenv("RUNTIME_DIRECTORY", str(rt))

    async def broken_sink(lines: list[str]) -> None:
        raise OSError(28, "No space left on device")

    step = Step(name="s", script="echo one\necho two\n").sealed()
    with pytest.raises(OSError):
        await make_runner(tmp_path).run(step, broken_sink, final_output=broken_sink)
    assert workdirs(rt) == []


async def test_leftover_work_directories_of_this_agent_only_are_removed_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = tmp_path / "rt"
    rt.mkdir()
    monkeypatch.setenv("RUNTIME_DIRECTORY", str(rt))
    mine = Runner(tmp_path / "a" / "scripts", Redactor())
    theirs = Runner(tmp_path / "b" / "scripts", Redactor())
    assert mine.workdir_prefix != theirs.workdir_prefix
    (rt / f"{mine.workdir_prefix}killed").mkdir()
    (rt / f"{theirs.workdir_prefix}live").mkdir()
    (rt / "unrelated").mkdir()
    assert mine.remove_leftover_workdirs() == 1
    assert workdirs(rt) == sorted([f"{theirs.workdir_prefix}live", "unrelated"])


async def test_relative_directories_still_run_the_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    runner = Runner(Path("state/scripts"), Redactor(), cwd=Path("state/workspace"), batch_interval=0.05)
    sink = Sink()
    result = await runner.run(Step(name="s", script="echo ok\n").sealed(), sink)
    assert result.ok and sink.lines == ["ok"], (result, sink.lines)
