"""tether benchmarks: ``python bench/run.py [--quick]`` (see docs/performance.md)."""
