"""Turn ``bench/run.py`` output (JSON lines on stdin) into the markdown table of docs/performance.md.

python bench/run.py --quick | tee figures.jsonl | python bench/table.py
"""

from __future__ import annotations

import json
import sys
from typing import Any


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 10 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def main() -> int:
    print("| figure | value | unit | bare baseline | ratio | target | met |")
    print("|---|---|---|---|---|---|---|")
    for line in sys.stdin:
        line = line.strip()
        if not line.startswith("{"):
            continue
        f = json.loads(line)
        cells = [f["name"], fmt(f["value"]), f["unit"], fmt(f["baseline"]), fmt(f["ratio"]), f["target"]]
        print("| " + " | ".join([*cells, fmt(f["met"])]) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
