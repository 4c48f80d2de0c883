"""The bootstrap run's last line (k0sctl's "Finished in"): duration, outcomes, the slowest machine."""

from __future__ import annotations

from tether.bootstrap.events import Outcome
from tether.bootstrap.finished import duration, finished_line
from tether.bootstrap.install import Result


def _result(node: str, outcome: Outcome, seconds: float) -> Result:
    return Result(f"root@{node}:22", node, outcome, "", seconds)


def test_durations_are_short_and_comparable() -> None:
    assert duration(0.04) == "0.0s"
    assert duration(12.34) == "12.3s"
    assert duration(65.4) == "1m05s"
    assert duration(3599.6) == "1h00m"  # rounded up to the hour, never "60m00s"
    assert duration(7385) == "2h03m"


def test_all_installed() -> None:
    results = [_result("gpu-1", Outcome.INSTALLED, 8.14), _result("gpu-2", Outcome.ALREADY_INSTALLED, 1.2)]
    assert finished_line(results, 9.04) == (
        "Finished in 9.0s: 1 installed, 1 already-installed (2 machines; slowest gpu-1 8.1s)"
    )


def test_failures_are_said_and_counted_in_outcome_order() -> None:
    results = [
        _result("c", Outcome.FAILED, 2.0),
        _result("a", Outcome.INSTALLED, 70.0),
        _result("b", Outcome.REFUSED, 1.0),
        _result("d", Outcome.FAILED, 3.0),
    ]
    assert finished_line(results, 71.0) == (
        "Finished with failures in 1m11s: 1 installed, 1 refused, 2 failed (4 machines; slowest a 1m10s)"
    )


def test_a_machine_without_a_node_name_is_named_by_its_target() -> None:
    line = finished_line([Result("ssm:i-0abc", "", Outcome.FAILED, "", 0.5)], 0.6)
    assert line == "Finished with failures in 0.6s: 1 failed (1 machine; slowest ssm:i-0abc 0.5s)"


def test_no_machines() -> None:
    assert finished_line([], 0.1) == "Finished in 0.1s: no machines"
