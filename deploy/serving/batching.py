"""Server-side batching for `deploy.serve`: the checked instances of requests that arrive
together go to the model in one call, and each request gets its own predictions back.

A request joins a queue of pending requests. While the model is busy the queue fills; when it
is free, the batcher takes whole requests up to `max_batch` instances (a larger request goes
alone) and runs one model call in a worker thread (TensorFlow releases the GIL, so the event
loop keeps reading requests meanwhile). With `max_wait_ms` > 0 the first request of a batch
also waits that long for the queue to fill (less once it holds `max_batch` instances). On
2 cores the default 0 measured best (`bench/serve.py`): under load the queue fills while the
model is busy anyway, and 1 ms of waiting made a lone request 1 ms slower (p50 1.4 -> 2.5 ms)
with no gain in bursts or throughput.

A request that would push the queue past `max_queue` instances is refused at once with
`Overloaded` (the server answers 503), so a burst costs bounded memory and bounded waits
instead of reset connections.

Instances are checked before they are queued, so one bad request never fails its
batch-mates; if a batched call fails anyway, each request of the batch is predicted alone.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
from collections.abc import Callable, Sequence


class Overloaded(RuntimeError):
    """The queue is full: this request is refused now (503); the server keeps serving."""


@dataclasses.dataclass(frozen=True)
class BatchOptions:
    """How requests are gathered into model calls.

    Attributes:
        max_batch: instances per model call (a single larger request still goes whole).
        max_wait_ms: how long the first request of a batch waits for others to join; 0 takes
            whatever is queued when the model is free.
        max_queue: instances waiting for the model; a request that would exceed it gets a
            503 (a request is always admitted into an empty queue, whatever its size).
    """

    max_batch: int = 256
    max_wait_ms: float = 0.0
    max_queue: int = 4096

    def __post_init__(self):
        if not isinstance(self.max_batch, int) or self.max_batch < 1:
            raise ValueError(f"max_batch ({self.max_batch!r}) must be a positive integer.")
        if not 0 <= self.max_wait_ms <= 1000:
            raise ValueError(
                f"max_wait_ms ({self.max_wait_ms!r}) must be between 0 and 1000 milliseconds."
            )
        if not isinstance(self.max_queue, int) or self.max_queue < self.max_batch:
            raise ValueError(
                f"max_queue ({self.max_queue!r}) must be an integer of at least max_batch "
                f"({self.max_batch}): a full batch must fit in the queue."
            )


@dataclasses.dataclass
class BatchStats:
    """Counters since the server started (read them from any thread; they only grow)."""

    requests: int = 0  # requests predicted (in a batch or alone)
    instances: int = 0  # instances predicted
    model_calls: int = 0  # calls to the model
    refused: int = 0  # requests answered 503 because the queue was full
    largest_batch: int = 0  # most instances in one model call
    queued: int = 0  # instances waiting for the model now


@dataclasses.dataclass
class _Pending:
    instances: Sequence[dict]
    future: asyncio.Future


class Batcher:
    """Gathers concurrent requests into model calls; one per server, in its event loop.

    Example::

        batcher = Batcher(predictor.predict_checked, BatchOptions(max_batch=64))
        predictions = await batcher.predict(predictor.check(instances))
        await batcher.close()
    """

    def __init__(
        self, predict: Callable[[Sequence[dict]], list[dict]], options: BatchOptions
    ) -> None:
        self._predict = predict
        self.options = options
        self.stats = BatchStats()
        self._queue: collections.deque[_Pending] = collections.deque()
        self._arrived = asyncio.Event()
        self._full: asyncio.Future | None = None  # set when the queue holds a full batch
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="predict")
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def predict(self, instances: Sequence[dict]) -> list[dict]:
        """Predictions for checked instances, from a model call shared with other requests.

        Raises:
            Overloaded: the queue holds too many instances to take these now.
        """
        stats, count = self.stats, len(instances)
        if stats.queued and stats.queued + count > self.options.max_queue:
            stats.refused += 1
            raise Overloaded(
                f"the server is busy: {stats.queued} instances are waiting for the model "
                f"(limit {self.options.max_queue}, --max_queue); retry shortly."
            )
        future = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(instances, future))
        stats.queued += count
        self._arrived.set()
        if self._full is not None and stats.queued >= self.options.max_batch:
            _resolve(self._full)
        return await future

    async def close(self) -> None:
        """Stops batching; requests still queued are refused."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        while self._queue:
            _fail(self._queue.popleft().future, Overloaded("the server is shutting down."))
        self._pool.shutdown(wait=False)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._arrived.wait()
            if self.options.max_wait_ms and self.stats.queued < self.options.max_batch:
                await self._wait_for_more(loop)
            batch = self._take()
            if batch:
                await self._call(loop, batch)

    async def _wait_for_more(self, loop: asyncio.AbstractEventLoop) -> None:
        self._full = loop.create_future()
        timer = loop.call_later(self.options.max_wait_ms / 1000, _resolve, self._full)
        try:
            await self._full
        finally:
            timer.cancel()
            self._full = None

    def _take(self) -> list[_Pending]:
        """Whole requests from the front of the queue, up to max_batch instances (at least
        one request); requests whose client has gone are dropped."""
        batch: list[_Pending] = []
        size = 0
        while self._queue:
            pending = self._queue[0]
            if batch and size + len(pending.instances) > self.options.max_batch:
                break
            self._queue.popleft()
            self.stats.queued -= len(pending.instances)
            if not pending.future.done():
                batch.append(pending)
                size += len(pending.instances)
        if not self._queue:
            self._arrived.clear()
        return batch

    async def _call(self, loop: asyncio.AbstractEventLoop, batch: list[_Pending]) -> None:
        instances = [x for pending in batch for x in pending.instances]
        try:
            outputs = await loop.run_in_executor(self._pool, self._predict, instances)
        except Exception as e:
            if len(batch) == 1:
                _fail(batch[0].future, e)
                return
            for pending in batch:  # isolate the failure: each request alone
                await self._call(loop, [pending])
            return
        finally:
            self.stats.model_calls += 1
        stats = self.stats
        stats.requests += len(batch)
        stats.instances += len(instances)
        stats.largest_batch = max(stats.largest_batch, len(instances))
        start = 0
        for pending in batch:
            end = start + len(pending.instances)
            if not pending.future.done():
                pending.future.set_result(outputs[start:end])
            start = end


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


def _fail(future: asyncio.Future, error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
