"""Reconnect backoff: exponential ceiling, full jitter, capped, reset after a stable stream."""

from __future__ import annotations

import random

import pytest

from tether.nodeagent.session import Backoff


def test_the_ceiling_doubles_up_to_the_cap_and_delays_are_jittered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ceilings: list[float] = []
    monkeypatch.setattr(random, "uniform", lambda lo, hi: ceilings.append(hi) or hi / 2)
    b = Backoff(base=0.5, cap=8.0)
    delays = [b.next_delay() for _ in range(7)]
    assert ceilings == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert delays == [c / 2 for c in ceilings]
    b.reset()
    b.next_delay()
    assert ceilings[-1] == 0.5


def test_real_jitter_spreads_a_fleet_out() -> None:
    delays = [Backoff(base=1.0, cap=30.0) for _ in range(200)]
    for b in delays:
        for _ in range(5):
            b.next_delay()
    sixth = [b.next_delay() for b in delays]  # ceiling 30 s (capped from 32)
    assert all(0 <= d <= 30 for d in sixth)
    assert len({round(d, 3) for d in sixth}) > 150  # not a thundering herd
    assert min(sixth) < 10 < 20 < max(sixth)
