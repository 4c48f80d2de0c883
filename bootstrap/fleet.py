"""Many machines at once: every adoption runs concurrently, at most ``concurrency`` at a time.

One machine's failure never stops the others; the results come back in the order given.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from tether.bootstrap.delivery import Delivery
from tether.bootstrap.events import EventSink
from tether.bootstrap.install import BundleSource, Opener, Request, Result, adopt
from tether.bootstrap.registry import Registry
from tether.nodeagent.secrets import Redactor

DEFAULT_CONCURRENCY = 8


@dataclass(frozen=True)
class Machine:
    """One machine to adopt: how to reach it and what to install there."""

    target: str  # user@host:port, ssm:i-...
    opener: Opener
    request: Request


async def adopt_all(
    machines: Sequence[Machine],
    *,
    registry: Registry,
    bundles: BundleSource,
    delivery: Delivery,
    sink: EventSink,
    redactor: Redactor,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> list[Result]:
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(machine: Machine) -> Result:
        async with gate:
            return await adopt(
                machine.opener,
                machine.target,
                machine.request,
                registry=registry,
                bundles=bundles,
                delivery=delivery,
                sink=sink,
                redactor=redactor,
            )

    return list(await asyncio.gather(*(one(m) for m in machines)))
