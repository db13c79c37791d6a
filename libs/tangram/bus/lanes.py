"""How a durable consumer runs handlers side by side: one lane per key, in delivery order, and a
watch on handlers that take long."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg

from tangram.events import Event


class Delivery:
    """What a JetStream delivery's reply subject says of it, without nats-py's metadata objects
    (much cheaper, and a replay reads every message of the log):
    `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<time>.<pending>` (9 tokens), or the
    form with domain and account hash (12 tokens)."""

    __slots__ = ("consumer", "consumer_seq", "pending", "stream_seq")

    def __init__(self, consumer: str, stream_seq: int, consumer_seq: int, pending: int) -> None:
        self.consumer = consumer
        self.stream_seq = stream_seq
        self.consumer_seq = consumer_seq
        self.pending = pending

    @classmethod
    def of(cls, msg: Msg) -> Delivery:
        tokens = (msg.reply or "").split(".")
        if len(tokens) == 9:
            base = 2
        elif len(tokens) >= 11:
            base = 4
        else:
            meta = msg.metadata
            return cls(meta.consumer, meta.sequence.stream, meta.sequence.consumer, meta.num_pending)
        return cls(tokens[base + 1], int(tokens[base + 3]), int(tokens[base + 4]), int(tokens[base + 6]))


class SlowWatch:
    """Tells the server a slow handler is still working (in_progress), so it is not redelivered."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._working: dict[int, tuple[Msg, float]] = {}

    def begin(self, msg: Msg, started: float) -> None:
        self._working[id(msg)] = (msg, started)

    def end(self, msg: Msg) -> None:
        self._working.pop(id(msg), None)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            now = time.perf_counter()
            for msg, started in list(self._working.values()):
                if now - started >= self.interval_s:
                    with contextlib.suppress(nats.errors.Error):
                        await msg.in_progress()


def lane_key(order_by: Callable[[Event], str], event: Event) -> str:
    try:
        return order_by(event)
    except Exception:
        # An event the key function cannot read goes to a lane of its own; its handler judges it.
        return ""


class Lanes:
    """Work in order per key and concurrently across keys: at most `limit` pieces run at once.

    A piece waiting for an earlier one of its key holds no running slot, so one busy key never
    stalls the others; how many may wait is bounded so that fetching pauses under a backlog.
    """

    QUEUED_PER_SLOT = 16

    def __init__(self, limit: int) -> None:
        self._running_slots = asyncio.Semaphore(max(limit, 1))
        self._queued_slots = asyncio.Semaphore(max(limit, 1) * self.QUEUED_PER_SLOT)
        self._tails: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._failure: BaseException | None = None

    async def submit(self, key: str, work: Coroutine[Any, Any, None]) -> None:
        await self._queued_slots.acquire()
        task = asyncio.create_task(self._after(self._tails.get(key), work))
        self._tails[key] = task
        self._tasks.add(task)
        task.add_done_callback(lambda done: self._finished(key, done))

    async def _after(self, previous: asyncio.Task[None] | None, work: Coroutine[Any, Any, None]) -> None:
        if previous is not None:
            await asyncio.wait({previous})
        async with self._running_slots:
            await work

    def _finished(self, key: str, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._queued_slots.release()
        if self._tails.get(key) is task:
            del self._tails[key]
        if not task.cancelled() and task.exception() is not None and self._failure is None:
            self._failure = task.exception()

    def raise_failure(self) -> None:
        """A failure of the bus itself (a dead letter that could not be published) is fatal."""
        if self._failure is not None:
            raise self._failure

    def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()

    async def drain(self) -> None:
        if self._tasks:
            await asyncio.wait(set(self._tasks))
        self.raise_failure()
