"""Reading callgrind's output (bench/callgrind.py) and splitting it by phase (bench/agent.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import callgrind
from bench.agent import phase_counts

HEADER = """# callgrind format
version: 1
creator: callgrind-3.19.0
pid: 4242
cmd:  python bench/agent_steps.py count
part: 3

desc: I1 cache:
desc: Timerange: Basic block 337833929 - 382339905
desc: Trigger: --dump-before=getppid

positions: line
events: Ir
"""


def out_file(total: int, key: str = "totals") -> str:
    return HEADER + f"{key}: {total}\n\nfl=(1) x.c\nfn=(1) f\n12 {total}\n"


def test_totals_reads_the_instructions() -> None:
    assert callgrind.totals(out_file(205012475)) == 205012475
    assert callgrind.totals(out_file(69327596, "summary")) == 69327596
    with pytest.raises(ValueError):
        callgrind.totals("events: Ir\nfn=main\n3 4\n")


def test_dumps_orders_each_process_by_dump_and_puts_the_exit_last(tmp_path: Path) -> None:
    for name, total in {
        "cg.100.2": 20,
        "cg.100.10": 100,
        "cg.100.1": 10,
        "cg.100.9": 90,
        "cg.100": 999,  # written at exit: after the last numbered dump
        "cg.200": 7,
        "vg.log": 0,  # not an output file
    }.items():
        (tmp_path / name).write_text(out_file(total) if name.startswith("cg.") else "noise\n")
    assert callgrind.dumps(tmp_path) == {100: [10, 20, 90, 100, 999], 200: [7]}


def test_command_counts_children_and_dumps_at_the_marker(tmp_path: Path) -> None:
    cmd = callgrind.command(tmp_path, ["bash", "-c", "true"], children=True, marker=callgrind.FORKS)
    assert cmd[:2] == ["valgrind", "--tool=callgrind"]
    assert f"--callgrind-out-file={tmp_path}/cg.%p" in cmd
    assert "--trace-children=yes" in cmd and "--dump-before=*fork*" in cmd
    assert cmd[-3:] == ["bash", "-c", "true"]
    plain = callgrind.command(tmp_path, ["python"])
    assert "--trace-children=no" in plain and not [a for a in plain if a.startswith("--dump-before")]


def test_phase_counts_pairs_plans_and_finds_the_calibration() -> None:
    phases = ["start", "small:31", "large:151", "small:31", "large:151", "calibration"]
    dumped = [10**9, 40_000_000, 200_000_000, 40_000_400, 200_000_000, 70_000_000, 5]
    per_step, calibration = phase_counts(phases, dumped, 10, 50)
    assert per_step == [4_000_000, (200_000_000 - 40_000_400) / 40]
    assert calibration == 70_000_000


def test_phase_counts_refuses_missing_dumps_or_phases() -> None:
    with pytest.raises(ValueError):
        phase_counts(["start", "small:1", "large:2", "calibration"], [1, 2, 3], 10, 50)
    with pytest.raises(ValueError):
        phase_counts(["start", "small:1", "calibration"], [1, 2, 3, 4], 10, 50)


def test_phase_counts_never_gives_a_negative_cost() -> None:
    with pytest.raises(ValueError, match="did not cost more"):
        phase_counts(["start", "small:31", "large:151", "calibration"], [9, 50, 40, 7, 1], 10, 50)
