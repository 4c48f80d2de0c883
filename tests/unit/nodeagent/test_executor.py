"""The plan walker: journal-first resumption, gates, reboots, reruns (real bash, no network)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from pathlib import Path

import pytest

from tether.nodeagent.executor import Executor
from tether.nodeagent.journal import JournalState
from tether.nodeagent.model import Plan, Step
from tether.nodeagent.runner import Runner
from tether.nodeagent.secrets import Redactor
from tether.nodeagent.statedb import StateDB


class Harness:
    def __init__(self, tmp_path: Path, boot: str = "boot-1") -> None:
        self.tmp = tmp_path
        self.boot = boot
        self.reboots = 0
        self.released: asyncio.Future[Mapping[str, str]] | None = None
        self.secrets: list[tuple[str, Mapping[str, str]]] = []
        self.gate_attempts: list[int] = []
        self.db = StateDB(tmp_path / "state.db")
        self.executor = Executor(
            self.db,
            Runner(tmp_path / "scripts", Redactor(), cwd=tmp_path / "work", batch_interval=0.05),
            boot_id=lambda: self.boot,
            reboot=self._reboot,
            gate=self._gate,
            on_secrets=lambda step, values, outputs: self.secrets.append((step, {**values, **outputs})),
            retry_base_seconds=0.01,
        )

    async def _reboot(self) -> None:
        self.reboots += 1

    async def _gate(self, step: Step, attempt: int) -> Mapping[str, str]:
        self.gate_attempts.append(attempt)
        self.released = asyncio.get_running_loop().create_future()
        return await self.released

    def events(self) -> list[tuple[str, str]]:
        return [(e.step, e.kind.label) for e in self.executor.outbox.pending(limit=10_000) if e.step]

    async def run(self, plan: Plan, until: str = "succeeded", timeout: float = 10) -> None:
        self.executor.set_plan(plan)
        task = asyncio.create_task(self.executor.run_forever())
        try:
            for _ in range(int(timeout / 0.02)):
                if self.executor.state == until:
                    return
                await asyncio.sleep(0.02)
            raise AssertionError(f"executor ended {self.executor.state}, wanted {until}")
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def plan(*steps: Step, generation: int = 1) -> Plan:
    return Plan.build(list(steps), generation=generation)


def counter(tmp: Path, name: str) -> Step:
    return Step(name=name, script=f"echo ran >> {tmp}/{name}.count\n")


def count(tmp: Path, name: str) -> int:
    path = tmp / f"{name}.count"
    return len(path.read_text().split()) if path.exists() else 0


async def test_succeeded_digests_are_never_run_again_even_by_a_new_executor(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    p = plan(counter(tmp_path, "a"), counter(tmp_path, "b"))
    await h.run(p)
    h.db.close()
    h2 = Harness(tmp_path)
    await h2.run(p)
    assert count(tmp_path, "a") == 1 and count(tmp_path, "b") == 1


async def test_a_step_left_running_by_a_crash_is_run_again(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    a, b = counter(tmp_path, "a").sealed(), counter(tmp_path, "b").sealed()
    h.executor.journal.record(a.digest, "a", JournalState.SUCCEEDED)
    h.executor.journal.record(b.digest, "b", JournalState.RUNNING, attempt=1)
    await h.run(plan(a, b))
    assert count(tmp_path, "a") == 0 and count(tmp_path, "b") == 1


async def test_retries_then_failure_stops_the_plan(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    flaky = Step(name="flaky", retries=2, script=f"echo x >> {tmp_path}/flaky.count; exit 1\n")
    await h.run(plan(flaky, counter(tmp_path, "after")), until="failed")
    assert count(tmp_path, "flaky") == 3 and count(tmp_path, "after") == 0
    kinds = [k for s, k in h.events() if s == "flaky"]
    assert kinds == ["started", "failed", "started", "failed", "started", "failed"]
    entry = h.executor.journal.get(flaky.sealed().digest)
    assert entry is not None and entry.state is JournalState.FAILED and entry.attempt == 3


async def test_gated_step_waits_for_its_release_and_gets_secret_env(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    gated = Step(
        name="join",
        gate="cluster-join",
        secret_env=("JOIN_TOKEN",),
        script=f'echo "len=${{#JOIN_TOKEN}}" > {tmp_path}/join.out\n',
    )
    runner = asyncio.create_task(h.run(plan(gated)))
    for _ in range(200):
        if h.released is not None:
            break
        await asyncio.sleep(0.01)
    assert h.executor.state == "waiting"
    assert ("join", "waiting") in h.events() and ("join", "started") not in h.events()
    assert h.released is not None
    h.released.set_result({"JOIN_TOKEN": "abcdef.0123456789abcdef"})
    await runner
    assert (tmp_path / "join.out").read_text() == "len=23\n"


async def test_reboot_step_completes_only_after_a_new_boot(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    kernel = Step(name="kernel", reboot=True, script="echo installing kernel\n")
    p = plan(kernel, counter(tmp_path, "after"))
    await h.run(p, until="rebooting")
    assert h.reboots == 1 and count(tmp_path, "after") == 0
    entry = h.executor.journal.get(p.steps[0].digest)
    assert entry is not None and entry.state is JournalState.REBOOTING
    h.db.close()
    # Same boot (the reboot did not happen): ask again, do not rerun the script.
    same = Harness(tmp_path, boot="boot-1")
    await same.run(p, until="rebooting")
    assert same.reboots == 1
    same.db.close()
    after = Harness(tmp_path, boot="boot-2")
    await after.run(p)
    assert count(tmp_path, "after") == 1
    assert ("kernel", "succeeded") in after.events()


async def test_rerun_forgets_the_journal_for_the_named_steps(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    p = plan(counter(tmp_path, "a"), counter(tmp_path, "b"))
    await h.run(p)
    assert h.executor.rerun(["b"]) == 1
    await h.run(p)
    assert count(tmp_path, "a") == 1 and count(tmp_path, "b") == 2


async def test_unchanged_steps_of_a_new_plan_are_reported_skipped_once(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    await h.run(plan(counter(tmp_path, "a"), generation=1))
    await h.run(plan(counter(tmp_path, "a"), Step(name="new", script="true\n"), generation=2))
    await h.run(plan(counter(tmp_path, "a"), Step(name="new", script="true\n"), generation=2))
    assert [k for s, k in h.events() if s == "a"] == ["started", "succeeded", "skipped"]


async def test_secret_outputs_go_to_the_callback_not_the_events(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    init = Step(name="init", script='echo "TOKEN=abcdef.0123456789abcdef" >> "$TETHER_SECRETS_OUT"\n')
    await h.run(plan(init))
    assert h.secrets == [("init", {"TOKEN": "abcdef.0123456789abcdef"})]
    assert "0123456789abcdef" not in h.db.path.read_bytes().decode("latin-1")


async def test_each_attempt_of_a_gated_step_asks_for_a_fresh_release(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    join = Step(
        name="join",
        gate="cluster-join",
        retries=1,
        secret_env=("JOIN_TOKEN",),
        script=f'echo "$JOIN_TOKEN" >> {tmp_path}/tokens; [ "$JOIN_TOKEN" = second-token-value ]\n',
    )
    runner = asyncio.create_task(h.run(plan(join)))
    for value in ("first-token-value", "second-token-value"):
        for _ in range(500):
            if h.released is not None and not h.released.done():
                break
            await asyncio.sleep(0.01)
        assert h.released is not None
        h.released.set_result({"JOIN_TOKEN": value})
    await runner
    assert h.gate_attempts == [1, 2]
    assert (tmp_path / "tokens").read_text() == "first-token-value\nsecond-token-value\n"


async def test_a_reboot_step_that_finds_nothing_to_do_does_not_reboot(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    kernel = Step(
        name="kernel", reboot=True, script='echo already running; : > "$TETHER_WORKDIR/no-reboot"\n'
    )
    await h.run(plan(kernel, counter(tmp_path, "after")))
    assert h.reboots == 0 and count(tmp_path, "after") == 1
    assert ("kernel", "succeeded") in h.events()


async def test_a_reboot_that_fails_is_reported_and_stops_the_plan(tmp_path: Path) -> None:
    h = Harness(tmp_path)

    async def broken_reboot() -> None:
        raise RuntimeError("systemctl reboot exited with 1")

    h.executor._reboot = broken_reboot
    await h.run(
        plan(Step(name="kernel", reboot=True, script="true\n"), counter(tmp_path, "after")), until="failed"
    )
    failed = [e for e in h.executor.outbox.pending() if e.kind.label == "failed"]
    assert failed[0].message == "reboot failed: systemctl reboot exited with 1"
    assert count(tmp_path, "after") == 0


def versioned(tmp: Path, content: str) -> Step:
    """A step named "driver" whose script leaves ``content`` in a marker (what A or B installs)."""
    script = f"echo {content} > {tmp}/driver.installed\necho ran >> {tmp}/driver.count\n"
    return Step(name="driver", script=script)


async def test_going_back_a_to_b_to_a_runs_the_step_again(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    a, b = plan(versioned(tmp_path, "550"), generation=1), plan(versioned(tmp_path, "560"), generation=2)
    await h.run(a)
    await h.run(b)
    back = plan(versioned(tmp_path, "550"), generation=3)
    await h.run(back)
    assert count(tmp_path, "driver") == 3
    assert (tmp_path / "driver.installed").read_text() == "550\n"
    entries = h.executor.journal.entries()
    assert [(e.step, e.digest, e.state) for e in entries] == [
        ("driver", back.steps[0].digest, JournalState.SUCCEEDED)
    ]
    await h.run(back)  # the last run had this digest and succeeded: done, not run again
    assert count(tmp_path, "driver") == 3


async def test_a_journal_holding_older_digests_of_a_step_counts_only_the_last(tmp_path: Path) -> None:
    """A journal written before superseding (both A and B succeeded, B last) still runs A again."""
    h = Harness(tmp_path)
    a, b = versioned(tmp_path, "550").sealed(), versioned(tmp_path, "560").sealed()
    with h.db.transaction() as c:
        for step in (a, b):
            c.execute(
                "INSERT INTO journal (digest, step, state, attempt, exit_code, updated_ms) "
                "VALUES (?, 'driver', 'succeeded', 1, 0, 1)",
                (step.digest,),
            )
    assert h.executor.journal.get(a.digest) is None
    assert [e.digest for e in h.executor.journal.entries()] == [b.digest]
    await h.run(plan(a))
    assert (tmp_path / "driver.installed").read_text() == "550\n"


async def test_the_executor_removes_its_runners_leftover_work_directories_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = tmp_path / "rt"
    rt.mkdir()
    monkeypatch.setenv("RUNTIME_DIRECTORY", str(rt))
    h = Harness(tmp_path)
    (rt / f"{h.executor.runner.workdir_prefix}killed").mkdir()
    await h.run(plan(counter(tmp_path, "a")))
    assert list(rt.iterdir()) == []
