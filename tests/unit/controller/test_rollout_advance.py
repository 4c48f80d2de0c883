"""The rollout's decisions (tether.controller.rollout.advance), one rule at a time, without I/O."""

from __future__ import annotations

from dataclasses import replace

from tether.controller.rollout.advance import Observed, advance
from tether.controller.rollout.state import NodeProgress, NodeStage, Rollout, RolloutStatus
from tether.controller.spec.model import RolloutPolicy
from tether.controller.spec.parse_rollout import check_quantity, resolve_count

OLD, NEW = 1, 2


def fleet(policy: RolloutPolicy, workers: int = 0, planes: int = 0) -> Rollout:
    nodes = {f"w{i}": NodeProgress(NodeStage.PENDING, OLD) for i in range(workers)}
    nodes.update({f"cp{i}": NodeProgress(NodeStage.PENDING, OLD, control_plane=True) for i in range(planes)})
    return Rollout("gpu", NEW, OLD, policy, nodes=nodes)


def seen(r: Rollout, **states: str) -> dict[str, Observed]:
    """Every node as the rollout would see it: admitted nodes at NEW in the given state."""
    out = {}
    for name, p in r.nodes.items():
        if p.stage is NodeStage.PENDING:
            out[name] = Observed(OLD, "pending")
        else:
            state = states.get(name, "provisioning")
            out[name] = Observed(NEW, state, failed_step="driver" if state == "failed" else "")
    return out


def test_quantities() -> None:
    assert check_quantity("2") == "" and check_quantity("25%") == ""
    assert check_quantity("101%") and check_quantity("two") and check_quantity("-1")
    assert resolve_count("25%", 8, default=0, at_least_one=True) == 2
    assert resolve_count("10%", 5, default=0, at_least_one=True) == 1  # never zero at once
    assert resolve_count("10%", 5, default=0, at_least_one=False) == 0  # maxFailures: none allowed
    assert resolve_count("", 7, default=7, at_least_one=True) == 7


def test_max_parallel_admits_batches_and_refills_as_nodes_finish() -> None:
    r = fleet(RolloutPolicy(max_parallel="2"), workers=5)
    r, admitted = advance(r, seen(r), 0)
    assert admitted == ["w0", "w1"]
    r, admitted = advance(r, seen(r), 10)
    assert admitted == []  # both still running
    r, admitted = advance(r, seen(r, w0="provisioned"), 20)
    assert admitted == ["w2"] and r.nodes["w0"].stage is NodeStage.UPDATED
    assert r.count(NodeStage.RUNNING) == 2


def test_default_policy_moves_everyone_at_once_and_completes() -> None:
    r = fleet(RolloutPolicy(), workers=3)
    r, admitted = advance(r, seen(r), 0)
    assert admitted == ["w0", "w1", "w2"]
    r, _ = advance(r, seen(r, w0="provisioned", w1="provisioned", w2="provisioned"), 5)
    assert r.status is RolloutStatus.COMPLETE


def test_failures_beyond_max_failures_halt_and_nothing_more_is_admitted() -> None:
    r = fleet(RolloutPolicy(max_parallel="1", max_failures="1"), workers=4)
    r, _ = advance(r, seen(r), 0)
    r, admitted = advance(r, seen(r, w0="failed"), 1)
    assert r.status is RolloutStatus.PROGRESSING and admitted == ["w1"]  # one failure is allowed
    r, admitted = advance(r, seen(r, w0="failed", w1="failed"), 2)
    assert r.status is RolloutStatus.HALTED and admitted == []
    assert "w0 (driver)" in r.reason and "w1 (driver)" in r.reason
    r, admitted = advance(r, seen(r, w0="failed", w1="failed"), 3)
    assert admitted == [] and r.count(NodeStage.PENDING) == 2


def test_min_healthy_seconds_holds_a_node_and_resets_when_it_flaps() -> None:
    r = fleet(RolloutPolicy(max_parallel="1", min_healthy_seconds=30), workers=2)
    r, _ = advance(r, seen(r), 0)
    r, admitted = advance(r, seen(r, w0="provisioned"), 1_000)
    assert r.nodes["w0"].stage is NodeStage.RUNNING and admitted == []
    r, _ = advance(r, seen(r, w0="offline"), 20_000)  # not healthy: the clock starts again
    r, _ = advance(r, seen(r, w0="provisioned"), 25_000)
    r, admitted = advance(r, seen(r, w0="provisioned"), 50_000)
    assert r.nodes["w0"].stage is NodeStage.RUNNING and admitted == []
    r, admitted = advance(r, seen(r, w0="provisioned"), 55_000)
    assert r.nodes["w0"].stage is NodeStage.UPDATED and admitted == ["w1"]


def test_canary_pauses_after_its_nodes_are_updated() -> None:
    r = fleet(RolloutPolicy(canary=1), workers=3)
    r, admitted = advance(r, seen(r), 0)
    assert admitted == ["w0"]
    r, admitted = advance(r, seen(r, w0="provisioned"), 1)
    assert r.status is RolloutStatus.PAUSED and admitted == [] and "canary" in r.reason
    r = r.with_status(RolloutStatus.PROGRESSING, "", 2)  # resume
    r, admitted = advance(r, seen(r, w0="provisioned"), 3)
    assert admitted == ["w1", "w2"]


def test_control_planes_go_first_one_at_a_time_while_all_are_healthy() -> None:
    r = fleet(RolloutPolicy(), workers=2, planes=3)
    r, admitted = advance(r, seen(r), 0)
    assert admitted == ["cp0"]  # not the workers, not a second control plane
    r, admitted = advance(r, seen(r, cp0="provisioned"), 1, control_planes_healthy=False)
    assert admitted == []  # cp0 done, but the cluster does not report every control plane healthy
    r, admitted = advance(r, seen(r, cp0="provisioned"), 2)
    assert admitted == ["cp1"]
    r, _ = advance(r, seen(r, cp0="provisioned", cp1="provisioned"), 3)
    r, admitted = advance(r, seen(r, cp0="provisioned", cp1="provisioned", cp2="provisioned"), 4)
    assert admitted == ["w0", "w1"]


def test_unchanged_nodes_do_not_count_as_a_batch_and_gone_nodes_leave() -> None:
    r = fleet(RolloutPolicy(max_parallel="1", canary=1), workers=2)
    nodes = dict(r.nodes)
    nodes["same"] = NodeProgress(NodeStage.UPDATED, OLD, unchanged=True)
    r = replace(r, nodes=nodes)
    observed = seen(r)
    observed["same"] = Observed(NEW, "provisioned")
    observed["w1"] = Observed(0, "gone")
    r, admitted = advance(r, observed, 0)
    assert admitted == ["w0"] and "w1" not in r.nodes


def test_an_agent_that_rolled_back_fails_the_node() -> None:
    r = replace(fleet(RolloutPolicy(), workers=1), agent_version="0.2.0")
    r, _ = advance(r, seen(r), 0)
    r, _ = advance(r, {"w0": Observed(NEW, "provisioned", agent_ok=False, rolled_back=True)}, 1)
    assert r.nodes["w0"].stage is NodeStage.FAILED and "rolled back" in r.nodes["w0"].message


def test_the_record_round_trips_and_says_which_generation_a_node_runs() -> None:
    r = fleet(RolloutPolicy(max_parallel="25%", canary=2, drain=True), workers=2)
    r, _ = advance(replace(r, policy=replace(r.policy, max_parallel="1")), seen(r), 0)
    again = Rollout.loads(r.dumps())
    assert again == r
    assert again.generation_for("w0") == NEW and again.generation_for("w1") == OLD
    assert again.generation_for("stranger") == NEW
