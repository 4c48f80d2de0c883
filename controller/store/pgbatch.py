"""Group commit for the PostgreSQL store's hot writes (enrollments, events): what is queued while
one transaction runs goes into the next, so a burst costs a few round trips and one commit."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")
Flush = Callable[[list[Item]], Awaitable[list[Result | BaseException]]]


class Batcher(Generic[Item, Result]):
    """One flush at a time; ``flush(items)`` returns a result or an exception per item, or raises
    (every item of the batch gets that error)."""

    def __init__(
        self,
        flush: Flush[Item, Result],
        max_batch: int = 256,
        alone: Callable[[Exception], bool] | None = None,
    ) -> None:
        self._flush = flush
        self._alone = alone  # an error after which each item of the batch is tried alone
        self._max = max_batch
        self._queue: list[tuple[Item, asyncio.Future[Result]]] = []
        self._task: asyncio.Task[None] | None = None

    async def submit(self, item: Item) -> Result:
        fut: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._queue.append((item, fut))
        if self._task is None:
            self._task = asyncio.create_task(self._run())
        return await fut

    async def drain(self) -> None:
        """Wait for what is queued (at close)."""
        if self._task is not None:
            with contextlib.suppress(BaseException):
                await asyncio.shield(self._task)

    async def _run(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue[: self._max], self._queue[self._max :]
                results = await self._results([item for item, _ in batch])
                for (_, fut), result in zip(batch, results, strict=True):
                    if fut.done():
                        continue
                    if isinstance(result, BaseException):
                        fut.set_exception(result)
                    else:
                        fut.set_result(result)
        finally:
            self._task = None

    async def _results(self, items: list[Item]) -> list[Any]:
        try:
            return list(await self._flush(items))
        except Exception as exc:  # the transaction failed: nobody's write landed
            if len(items) == 1 or self._alone is None or not self._alone(exc):
                return [exc] * len(items)
        out: list[Any] = []  # one bad item must not fail its neighbours
        for item in items:
            out.extend(await self._results([item]))
        return out
