"""Rewrite the golden files from the current templates: ``.venv/bin/python -m tests.unit.render.regen``.

Review the diff: every change in a golden file is a change in what nodes will run.
"""

from __future__ import annotations

from tests.unit.render import scenarios


def main() -> None:
    scenarios.GOLDEN.mkdir(exist_ok=True)
    for old in scenarios.GOLDEN.iterdir():
        old.unlink()
    libraries: dict[str, str] = {}
    for name, os_key in scenarios.cases():
        text, libs = scenarios.golden_text(scenarios.plan_for(name, os_key))
        scenarios.golden_path(name, os_key).write_text(text)
        libraries.update(libs)
    for lib_name, lib in libraries.items():
        (scenarios.GOLDEN / lib_name).write_text(lib)
    print(f"wrote {len(scenarios.cases())} golden plans and {len(libraries)} libraries to {scenarios.GOLDEN}")


if __name__ == "__main__":
    main()
