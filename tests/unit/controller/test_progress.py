"""ETAs and stragglers (tether.controller.progress): the rules, pure; the tracker fed with events;
the sweep's notices and gauge; a rollout's ETA."""

from __future__ import annotations

from collections import OrderedDict
from types import SimpleNamespace
from typing import Any

import pytest

from tether.controller import admin_rollouts, metrics, progress
from tether.controller.progress import (
    Progress,
    median,
    node_eta,
    remaining_seconds,
    rollout_eta,
    straggling,
)
from tether.controller.rollout.state import NodeProgress, NodeStage, Rollout, RolloutStatus
from tether.controller.spec.model import RolloutPolicy
from tether.controller.store.records import NodeRecord, StepRecord
from tether.nodeagent.model import Event, EventKind

NOW = 1_700_000_000_000
ENV = "gpu"


def step(name: str, state: str = "pending", since_ms: int = 0, **kw: Any) -> StepRecord:
    return StepRecord(
        node="n", ordinal=0, name=name, digest=f"d-{name}", state=state, updated_ms=since_ms, **kw
    )


def ev(kind: EventKind, name: str, at_ms: int, seconds: float = 0.0, **kw: Any) -> Event:
    return Event(kind=kind, step=name, digest=f"d-{name}", time_ms=at_ms, duration_seconds=seconds, **kw)


def ran(p: Progress, node: str, name: str, seconds: float, env: str = ENV) -> None:
    """``node`` ran step ``name`` for ``seconds`` (started and succeeded, as its events say)."""
    start = NOW - 100_000
    p.observe(
        node,
        env,
        [
            ev(EventKind.STARTED, name, start),
            ev(EventKind.SUCCEEDED, name, start + round(seconds * 1000), seconds),
        ],
    )


# -- the rules --------------------------------------------------------------------------------


def test_median() -> None:
    assert median([]) is None  # no history: no estimate
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 2.0, 3.0]) == 2.5


def test_straggling_needs_three_times_the_median_and_ten_seconds_more() -> None:
    assert not straggling(1000.0, None)  # no other node finished it: never
    # A 1 s step: 3x is passed at 3 s, but the 10 s margin holds it back until 11 s.
    assert not straggling(10.9, 1.0)
    assert straggling(11.0, 1.0)
    # A 10 s step: 20 s is 10 s more, but not 3x; exactly 3x is not more than 3x.
    assert not straggling(25.0, 10.0)
    assert not straggling(30.0, 10.0)
    assert straggling(30.1, 10.0)
    # A step that usually takes no time at all: the margin decides.
    assert not straggling(9.9, 0.0)
    assert straggling(10.0, 0.0)


def test_remaining_is_never_negative_and_an_overrun_keeps_a_floor() -> None:
    assert remaining_seconds(60.0, 15.0) == 45.0
    assert remaining_seconds(60.0, 0.0) == 60.0
    assert remaining_seconds(60.0, -5.0) == 60.0  # a clock behind: not more than the median
    assert remaining_seconds(60.0, 59.0) == pytest.approx(6.0)  # 10% of the median at least
    assert remaining_seconds(60.0, 600.0) == pytest.approx(6.0)  # far past it: still not done
    assert remaining_seconds(0.0, 5.0) == 0.0
    for elapsed in (0.0, 1.0, 100.0, 1e9):
        assert remaining_seconds(1.0, elapsed) >= 0.0


def test_node_eta_sums_the_medians_of_what_is_left() -> None:
    medians = {"a": 10.0, "b": 60.0, "c": 30.0}

    def of(s: StepRecord) -> float | None:
        return medians.get(s.name)

    steps = [
        step("a", "succeeded"),
        step("b", "running", since_ms=NOW - 15_000),  # 15 s into a 60 s step: 45 s left
        step("c", "pending"),
    ]
    assert node_eta(NOW, steps, of) == NOW + 75_000
    overrun = [step("b", "running", since_ms=NOW - 600_000), step("c")]
    assert node_eta(NOW, overrun, of) == NOW + 6_000 + 30_000  # never before now, never negative
    done = [
        step("a", "skipped"),
        step("x", "failed", continue_on_error=True),  # done, though it has no history
        step("c", "retrying"),  # runs again: all of it
    ]
    assert node_eta(NOW, done, of) == NOW + 30_000


def test_no_history_no_eta() -> None:
    def of(s: StepRecord) -> float | None:
        return {"a": 10.0}.get(s.name)

    assert node_eta(NOW, [step("a"), step("unknown")], of) == 0  # one step never finished anywhere
    assert node_eta(NOW, [step("a", "succeeded")], of) == 0  # nothing left to estimate
    assert node_eta(NOW, [], of) == 0


# -- the tracker ------------------------------------------------------------------------------


def test_finished_runs_make_the_history_per_environment_and_digest() -> None:
    p = Progress()
    for i, seconds in enumerate((1.0, 2.0, 3.0)):
        ran(p, f"n{i}", "driver", seconds)
    assert p.median(ENV, "driver", "d-driver") == 2.0
    assert p.median(ENV, "driver", "d-other") is None  # another script: another history
    assert p.median("other-env", "driver", "d-driver") is None
    assert p.median(ENV, "driver", "d-driver", excluding="n2") == 1.5  # the others only
    ran(p, "n2", "driver", 9.0)  # its latest run replaces its earlier one
    assert p.median(ENV, "driver", "d-driver") == 2.0 and p.others(ENV, "driver", "d-driver", "n2") == 2
    # A task beside the plan and the controller's own notices are not steps.
    p.observe(
        "n0",
        ENV,
        [ev(EventKind.STARTED, "task:refresh", NOW), ev(EventKind.SUCCEEDED, "task:refresh", NOW, 99.0)],
    )
    assert p.median(ENV, "task:refresh", "d-task:refresh") is None


def test_a_step_that_rebooted_counts_its_wall_time() -> None:
    p = Progress()
    p.observe("n0", ENV, [ev(EventKind.STARTED, "kernel", NOW - 90_000)])
    p.observe("n0", ENV, [ev(EventKind.INFO, "kernel", NOW - 80_000, 10.0)])  # rebooting
    p.observe("n0", ENV, [ev(EventKind.SUCCEEDED, "kernel", NOW, 0.0, message="node rebooted")])
    assert p.median(ENV, "kernel", "d-kernel") == 90.0


def test_history_is_bounded() -> None:
    p = Progress(max_runs=3, max_steps=2)
    for i in range(5):
        ran(p, f"n{i}", "a", float(i))
    assert p.others(ENV, "a", "d-a", "") == 3 and p.median(ENV, "a", "d-a") == 3.0  # n2..n4
    ran(p, "n0", "b", 1.0)
    ran(p, "n0", "c", 1.0)  # a third step: the one finished longest ago goes
    assert p.median(ENV, "a", "d-a") is None
    assert p.median(ENV, "b", "d-b") == 1.0 and p.median(ENV, "c", "d-c") == 1.0


def test_forget_leaves_no_trace() -> None:
    p = Progress()
    ran(p, "gone", "a", 5.0)
    ran(p, "kept", "b", 1.0)
    p.observe("gone", ENV, [ev(EventKind.STARTED, "b", NOW - 60_000)])
    p.forget("gone")
    assert p.median(ENV, "a", "d-a") is None
    assert p.median(ENV, "b", "d-b") == 1.0
    assert p.sweep(NOW, lambda n: True) == []


class NoScan(OrderedDict[Any, Any]):
    """A step history that fails a look at every step (forget must go by the node's own steps)."""

    def items(self) -> Any:
        raise AssertionError("scanned every step's history")


def test_forget_goes_by_the_steps_the_node_ran_and_the_index_follows_the_bounds() -> None:
    p = Progress(max_runs=2, max_steps=3)
    for i in range(3):
        ran(p, f"n{i}", "a", 1.0)  # n0's run of "a" falls out (two runs per step)
    ran(p, "n0", "b", 2.0)
    ran(p, "n1", "c", 3.0)
    ran(p, "n2", "d", 4.0)  # a fourth step: "a", the one finished longest ago, goes
    index = {n: set(k) for n, k in p._keys.items()}
    assert index == {"n0": {(ENV, "b", "d-b")}, "n1": {(ENV, "c", "d-c")}, "n2": {(ENV, "d", "d-d")}}
    p._runs = NoScan(p._runs)
    p.forget("n1")
    assert p.median(ENV, "c", "d-c") is None and p.median(ENV, "b", "d-b") == 2.0
    assert "n1" not in p._keys
    p.forget("never-seen")


def test_estimate_of_a_straggler_compares_with_other_nodes_only() -> None:
    p = Progress()
    steps = [step("slow", "running", since_ms=NOW - 41_000), step("after")]
    assert p.estimate("n5", ENV, steps, NOW) == progress.Estimate(0, False)  # no history at all
    ran(p, "n5", "slow", 40.0)  # its own earlier run is no yardstick for itself
    assert not p.estimate("n5", ENV, steps, NOW).straggler
    for i in range(5):
        ran(p, f"n{i}", "slow", 1.0)
        ran(p, f"n{i}", "after", 2.0)
    got = p.estimate("n5", ENV, steps, NOW)
    assert got.straggler
    # median of "slow" over all six nodes is 1.0 s: 10% of it left, then "after" (2 s)
    assert got.eta_ms == NOW + 100 + 2_000
    assert not p.estimate("n5", ENV, [step("slow", "running", since_ms=NOW - 10_000)], NOW).straggler


# -- the sweep --------------------------------------------------------------------------------


class FakeHub:
    def __init__(self, connected: set[str]) -> None:
        self.online = connected
        self.sent: list[tuple[str, Any]] = []

    def connected(self, node: str) -> bool:
        return node in self.online

    def send(self, node: str, msg: Any) -> bool:
        if node not in self.online:
            return False
        self.sent.append((node, msg))
        return True


def gauge(environment: str) -> float | None:
    return metrics.REGISTRY.get_sample_value("tether_stragglers", {"environment": environment})


def test_the_sweep_flags_a_straggler_once_per_run_with_a_notice_and_the_gauge() -> None:
    env = "sweep-env"
    p = Progress()
    for i in range(5):
        ran(p, f"n{i}", "slow", 1.0, env=env)
    start = NOW - 41_000
    p.observe("n5", env, [ev(EventKind.STARTED, "slow", start)])
    p.observe("n4", env, [ev(EventKind.STARTED, "slow", NOW - 2_000)])  # running, not for long
    hub = FakeHub({"n4", "n5"})
    flags = p.tick(hub, NOW)  # type: ignore[arg-type]
    assert [f.node for f in flags] == ["n5"]
    [(node, msg)] = hub.sent
    assert node == "n5" and msg.WhichOneof("kind") == "notice"
    assert (msg.notice.step, msg.notice.digest) == ("slow", "d-slow")
    assert msg.notice.message == "straggler: step slow has run 41s, 41x the median of 1.0s on 5 other nodes"
    assert gauge(env) == 1
    assert p.tick(hub, NOW + 2_000) == [] and len(hub.sent) == 1  # once per run of the step
    assert gauge(env) == 1
    p.observe("n5", env, [ev(EventKind.SUCCEEDED, "slow", NOW + 3_000, 44.0)])
    p.tick(hub, NOW + 4_000)  # type: ignore[arg-type]
    assert gauge(env) == 0  # n4 still runs a step there: the series stays, at 0
    p.observe("n5", env, [ev(EventKind.STARTED, "slow", NOW + 5_000)])  # a rerun: may be flagged again
    assert "n5" in [f.node for f in p.sweep(NOW + 60_000, hub.connected)]


def test_a_notice_that_cannot_go_out_is_tried_again() -> None:
    p = Progress()
    for i in range(2):
        ran(p, f"n{i}", "slow", 1.0)
    p.observe("n9", ENV, [ev(EventKind.STARTED, "slow", NOW - 30_000)])
    hub = FakeHub(set())
    assert p.tick(hub, NOW) == []  # type: ignore[arg-type]  # offline: not judged
    hub.online.add("n9")
    hub.send = lambda node, msg: False  # type: ignore[method-assign]  # went away meanwhile
    assert len(p.tick(hub, NOW)) == 1  # type: ignore[arg-type]
    hub = FakeHub({"n9"})
    assert len(p.tick(hub, NOW)) == 1 and len(hub.sent) == 1  # type: ignore[arg-type]


def test_a_revoked_node_gets_no_straggler_notice() -> None:
    env = "revoked-env"
    p = Progress()
    for i in range(3):
        ran(p, f"n{i}", "slow", 1.0, env=env)
    for node in ("gone", "live"):
        p.observe(node, env, [ev(EventKind.STARTED, "slow", NOW - 41_000)])
    records = {
        "gone": NodeRecord("gone", env, "worker", "", "", "", 0, revoked=True),
        "live": NodeRecord("live", env, "worker", "", "", "", 0),
    }
    reads: list[str] = []

    def node_of(name: str) -> NodeRecord | None:
        reads.append(name)
        return records.get(name)

    p.node_of = node_of
    hub = FakeHub({"gone", "live"})  # a revoked node's stream may still be open
    assert [f.node for f in p.tick(hub, NOW)] == ["live"]  # type: ignore[arg-type]
    assert [node for node, _ in hub.sent] == ["live"]
    assert gauge(env) == 1  # the revoked one is not watched any more
    p.tick(hub, NOW + 2_000)  # type: ignore[arg-type]
    assert sorted(reads) == ["gone", "live"]  # read once each: before a notice, not every sweep


def test_a_step_that_ends_or_waits_is_not_running() -> None:
    p = Progress()
    ran(p, "n0", "slow", 1.0)
    for end in (EventKind.FAILED, EventKind.SKIPPED, EventKind.WAITING):
        p.observe("n1", ENV, [ev(EventKind.STARTED, "slow", NOW - 60_000), ev(end, "slow", NOW - 1)])
        assert p.sweep(NOW, lambda n: True) == [], end


def test_seen_seeds_what_runs_now_after_a_restart() -> None:
    p = Progress()
    ran(p, "n0", "slow", 1.0)
    p.seen("n1", ENV, [step("a", "succeeded"), step("slow", "running", since_ms=NOW - 30_000), step("b")])
    assert [f.node for f in p.sweep(NOW, lambda n: True)] == ["n1"]
    p.seen("n1", ENV, [step("slow", "succeeded")])
    assert p.sweep(NOW, lambda n: True) == []


# -- rollouts ---------------------------------------------------------------------------------


def test_rollout_eta_fills_batch_slots_as_they_free() -> None:
    t = NOW
    # Two slots: one running node done at +10 s, four pending taking 10 s each.
    assert rollout_eta(t, running=[t + 10_000], pending_workers=4, work_ms=10_000, slots=2) == t + 30_000
    assert rollout_eta(t, running=[t + 10_000], slots=2) == t + 10_000
    assert rollout_eta(t, running=[t + 10_000, 0], slots=2) == 0  # a running node without ETA
    assert rollout_eta(t, running=[], pending_workers=1, work_ms=None) == 0  # nothing to measure by
    assert rollout_eta(t, running=[]) == 0  # nothing left
    # minHealthySeconds counts for every node moved.
    assert (
        rollout_eta(t, running=[], pending_workers=2, work_ms=5_000, slots=1, healthy_ms=1_000) == t + 12_000
    )
    # Control planes one at a time, first; workers after them.
    got = rollout_eta(
        t, running=[], plane_running=t + 5_000, pending_planes=1, pending_workers=2, work_ms=10_000, slots=2
    )
    assert got == t + 25_000


def test_rollout_status_has_the_etas_of_its_running_nodes_and_its_own() -> None:
    p = Progress()
    for i in range(3):
        ran(p, f"u{i}", "driver", 20.0)
    running = [step("driver", "running", since_ms=NOW - 5_000)]
    nodes = {"r1": NodeProgress(NodeStage.RUNNING, 1, since_ms=NOW - 5_000)}
    nodes.update({f"p{i}": NodeProgress(NodeStage.PENDING, 1) for i in range(3)})
    r = Rollout(ENV, 2, 1, RolloutPolicy(max_parallel="1"), started_ms=NOW - 10_000, nodes=nodes)
    record = NodeRecord("r1", ENV, "worker", "", "", "", 0, plan_generation=2, plan_digest="x")
    store = SimpleNamespace(get_node=lambda n: record if n == "r1" else None, node_steps=lambda n: running)
    app: Any = SimpleNamespace(store=store, hub=FakeHub({"r1"}), progress=p)
    estimates, eta = admin_rollouts.estimate(app, r, NOW)
    assert estimates["r1"].eta_ms == NOW + 15_000 and not estimates["r1"].straggler
    assert eta == NOW + 15_000 + 3 * 20_000  # then the three pending nodes, one at a time
    msg = admin_rollouts.rollout_to_pb(r, estimates, eta)
    assert msg.eta_ms == eta and {n.name: n.eta_ms for n in msg.nodes}["r1"] == NOW + 15_000
    paused = Rollout(ENV, 2, 1, r.policy, status=RolloutStatus.PAUSED, nodes=nodes)
    assert admin_rollouts.estimate(app, paused, NOW) == ({}, 0)
    canary = Rollout(ENV, 2, 1, RolloutPolicy(canary=1), started_ms=NOW - 10_000, nodes=nodes)
    assert admin_rollouts.estimate(app, canary, NOW)[1] == 0  # an operator resumes after the canary


def test_a_quarantined_running_node_holds_no_slot_and_leaves_the_rollout_an_eta() -> None:
    p = Progress()
    for i in range(3):
        ran(p, f"u{i}", "driver", 20.0)
    running = [step("driver", "running", since_ms=NOW - 5_000)]
    nodes = {n: NodeProgress(NodeStage.RUNNING, 1, since_ms=NOW - 5_000) for n in ("r1", "q1")}
    nodes["p0"] = NodeProgress(NodeStage.PENDING, 1)
    r = Rollout(ENV, 2, 1, RolloutPolicy(max_parallel="2"), started_ms=NOW - 10_000, nodes=nodes)
    records = {
        "r1": NodeRecord("r1", ENV, "worker", "", "", "", 0, plan_generation=2, plan_digest="x"),
        # Its hardware does not match the new generation's spec.hardware: the rollout counts it failed.
        "q1": NodeRecord(
            "q1",
            ENV,
            "worker",
            "",
            "",
            "",
            0,
            plan_generation=2,
            plan_digest="x",
            hardware={"quarantine": {"step": "hardware-verify", "problems": ["expected 8 GPUs"]}},
        ),
    }
    store = SimpleNamespace(get_node=records.get, node_steps=lambda n: running)
    app: Any = SimpleNamespace(store=store, hub=FakeHub({"r1", "q1"}), progress=p)
    estimates, eta = admin_rollouts.estimate(app, r, NOW)
    assert set(estimates) == {"r1"}
    assert eta == NOW + 20_000  # p0 starts now, in the slot q1 does not hold (r1 is done at +15 s)
