"""The last line of a bootstrap run, like k0sctl's "Finished in": how long the run took, how many
machines ended how, and the slowest one."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from tether.bootstrap.events import Outcome
from tether.bootstrap.install import Result


def duration(seconds: float) -> str:
    """``0.4s``, ``12.3s``, ``1m05s``, ``2h03m``: short, and exact enough to compare runs."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def finished_line(results: Sequence[Result], seconds: float) -> str:
    """``Finished in 12.3s: 2 installed, 1 refused (3 machines; slowest gpu-2 8.1s)``."""
    counts = Counter(r.outcome for r in results)
    tally = ", ".join(f"{counts[o]} {o.value}" for o in Outcome if counts[o]) or "no machines"
    with_failures = "" if all(r.outcome.ok for r in results) else " with failures"
    line = f"Finished{with_failures} in {duration(seconds)}: {tally}"
    if results:
        slowest = max(results, key=lambda r: r.seconds)
        machines = f"{len(results)} machine{'s' if len(results) != 1 else ''}"
        line += f" ({machines}; slowest {slowest.node or slowest.target} {duration(slowest.seconds)})"
    return line
