"""Reader for ``spec.rollout``: tether's rollout policy, accepted beside holodeck's fields."""

from __future__ import annotations

import math
import re

from tether.controller.spec.model import RolloutPolicy
from tether.controller.spec.reader import Section

_QUANTITY = re.compile(r"^(\d{1,6})(%?)$")
MAX_CANARY = 10_000
MAX_HEALTHY_SECONDS = 86_400


def check_quantity(text: str) -> str:
    """ "" when ``text`` is a count ("2") or a percentage ("25%", at most 100%), else why not."""
    m = _QUANTITY.fullmatch(text.strip())
    if m is None:
        return 'must be a whole number or a percentage such as "25%"'
    if m.group(2) and int(m.group(1)) > 100:
        return "a percentage is at most 100%"
    return ""


def resolve_count(quantity: str, total: int, *, default: int, at_least_one: bool) -> int:
    """``quantity`` for a fleet of ``total`` nodes: a count as it is, a percentage rounded down
    (but at least 1 when ``at_least_one``, so "10%" of 5 nodes still moves one at a time)."""
    text = quantity.strip()
    if not text:
        return default
    if text.endswith("%"):
        n = math.floor(total * int(text[:-1]) / 100)
        return max(n, 1) if at_least_one else n
    return int(text)


def rollout(spec: Section) -> RolloutPolicy:
    sec = spec.section("rollout")
    if sec is None:
        return RolloutPolicy()
    max_parallel = sec.string("maxParallel", check=check_quantity).strip()
    if max_parallel and resolve_count(max_parallel, 100, default=1, at_least_one=False) == 0:
        sec.problems.add(sec.path_of("maxParallel"), "must be at least 1 (or leave it out: all at once)")
        max_parallel = ""
    policy = RolloutPolicy(
        max_parallel=max_parallel,
        max_failures=sec.string("maxFailures", "0", check=check_quantity).strip(),
        canary=sec.integer("canary", 0, low=0, high=MAX_CANARY),
        min_healthy_seconds=sec.integer("minHealthySeconds", 0, low=0, high=MAX_HEALTHY_SECONDS),
        drain=sec.boolean("drain"),
    )
    sec.finish()
    return policy
