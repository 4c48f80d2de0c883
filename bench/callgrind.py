"""Instruction counts with ``valgrind --tool=callgrind``: repeatable whatever else the machine does.

Callgrind counts the instructions a process executes in user space (``Ir``), not seconds, so a
count does not move with the machine's load. It does not see the kernel (system calls, page
faults) and runs the program about 50 times slower.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

_TOTALS = re.compile(r"^(?:totals|summary):\s*(\d+)", re.MULTILINE)
_DUMP = re.compile(r"^cg\.(\d+)(?:\.(\d+))?$")


def available() -> bool:
    return shutil.which("valgrind") is not None


def totals(text: str) -> int:
    """The instructions (the first event, ``Ir``) of one callgrind output file."""
    m = _TOTALS.search(text)
    if m is None:
        raise ValueError("no totals: or summary: line (not a callgrind output file?)")
    return int(m.group(1))


def dumps(directory: Path) -> dict[int, list[int]]:
    """Every process's counts, in the order they were dumped: ``{pid: [Ir of dump 1, 2, ...]}``.

    Files are named ``cg.PID`` (``--callgrind-out-file=DIR/cg.%p``); with ``--dump-before``, a
    process writes ``cg.PID.1``, ``cg.PID.2``, ... (the counts since the previous dump) and,
    when it exits, ``cg.PID`` (the counts since the last dump), which comes last here."""
    parts: dict[int, list[tuple[int, int]]] = {}
    for path in directory.iterdir():
        m = _DUMP.match(path.name)
        if m is None:
            continue
        pid, n = int(m.group(1)), int(m.group(2)) if m.group(2) else 1 << 62
        parts.setdefault(pid, []).append((n, totals(path.read_text(errors="replace"))))
    return {pid: [ir for _, ir in sorted(counts)] for pid, counts in parts.items()}


def command(out_dir: Path, argv: Sequence[str], *, children: bool = False, marker: str = "") -> list[str]:
    """``argv`` under callgrind, writing into ``out_dir``. ``children``: count the programs it
    executes too (each its own file); ``marker``: dump the counts each time this function is
    entered (a phase boundary)."""
    cmd = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out_dir}/cg.%p",
        f"--trace-children={'yes' if children else 'no'}",
    ]
    if marker:
        cmd.append(f"--dump-before={marker}")
    return [*cmd, *argv]


# A forked child starts with its parent's counts so far: dumping (and so zeroing) them in the
# parent just before every fork keeps each instruction in exactly one file.
FORKS = "*fork*"


def run_total(out_dir: Path, argv: Sequence[str], **kwargs: object) -> int:
    """Instructions of ``argv`` and of every process it forks or executes, summed (each counted
    once: see ``FORKS``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        command(out_dir, argv, children=True, marker=FORKS),
        check=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        **kwargs,  # type: ignore[call-overload]
    )
    return sum(sum(counts) for counts in dumps(out_dir).values())
