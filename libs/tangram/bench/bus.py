"""`tangram bench bus`: Tangram's bus against plain nats-py on the same server, same bytes, same run.

Publishing and consuming run concurrently; latency is publish call to handler entry, per event.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

from tangram.bus import Bus, BusConfig, ConsumerSpec
from tangram.events import CLAIMS_STREAM, ClaimRequested, Event, encode
from tangram.natsserver import NatsServer

PLAIN_STREAM = "BENCH_PLAIN"
CHUNK = 1000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=50_000, help="events per run (default 50000)")
    parser.add_argument("--nats-url", default=None, help="use this server instead of an embedded one")


def _events(count: int) -> list[Event]:
    spec: dict[str, Any] = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}}
    return [
        ClaimRequested(key=f"bench-{n}", namespace="bench", name=f"c{n}", uid=f"bench-{n}", spec=spec)
        for n in range(count)
    ]


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _figures(count: int, publish_s: float, consume_s: float, latencies_ms: list[float]) -> dict[str, float]:
    return {
        "acked_publishes_per_s": round(count / publish_s, 1),
        "consumed_per_s": round(count / consume_s, 1),
        "latency_p50_ms": round(statistics.median(latencies_ms), 3),
        "latency_p99_ms": round(_percentile(latencies_ms, 0.99), 3),
    }


async def _tangram(bus: Bus, events: list[Event]) -> dict[str, float]:
    sent: dict[str, float] = {}
    latencies: list[float] = []
    first: list[float] = []
    done = asyncio.Event()
    stop = asyncio.Event()

    async def handler(event: Event) -> None:
        now = time.perf_counter()
        if not first:
            first.append(now)
        latencies.append((now - sent[event.event_id]) * 1000)
        if len(latencies) == len(events):
            done.set()

    ready = asyncio.Event()
    spec = ConsumerSpec(durable="bench", stream=CLAIMS_STREAM, filter_subjects=("tangram.claim.requested.>",))
    consumer = asyncio.create_task(bus.consume(spec, handler, stop=stop, batch=256, ready=ready))
    await ready.wait()
    started = time.perf_counter()
    for offset in range(0, len(events), CHUNK):
        chunk = events[offset : offset + CHUNK]
        stamp = time.perf_counter()
        for event in chunk:
            sent[event.event_id] = stamp
        await bus.publish_batch(chunk)
    publish_s = time.perf_counter() - started
    await done.wait()
    consume_s = time.perf_counter() - first[0]
    stop.set()
    await consumer
    return _figures(len(events), publish_s, consume_s, latencies)


async def _plain(bus: Bus, events: list[Event]) -> dict[str, float]:
    """The floor: nats-py publish_async and a bare pull consumer, same payloads and headers."""
    js = bus.jetstream
    await js.add_stream(StreamConfig(name=PLAIN_STREAM, subjects=["bench.plain.>"]))
    payloads = [(f"bench.plain.{e.key}", encode(e), {"Nats-Msg-Id": e.event_id}) for e in events]
    await js.add_consumer(PLAIN_STREAM, ConsumerConfig(durable_name="plain", ack_policy=AckPolicy.EXPLICIT))
    sub = await js.pull_subscribe_bind("plain", stream=PLAIN_STREAM)
    sent: dict[str, float] = {}
    latencies: list[float] = []
    first: list[float] = []

    async def consume() -> None:
        while len(latencies) < len(payloads):
            try:
                msgs = await sub.fetch(256, timeout=0.5)
            except Exception:  # noqa: S112 - a fetch timeout only means nothing is there yet
                continue
            for msg in msgs:
                now = time.perf_counter()
                if not first:
                    first.append(now)
                latencies.append((now - sent[msg.headers["Nats-Msg-Id"]]) * 1000)  # type: ignore[index]
                await msg.ack()

    consumer = asyncio.create_task(consume())
    started = time.perf_counter()
    for offset in range(0, len(payloads), CHUNK):
        chunk = payloads[offset : offset + CHUNK]
        stamp = time.perf_counter()
        futures = []
        for subject, data, headers in chunk:
            sent[headers["Nats-Msg-Id"]] = stamp
            futures.append(await js.publish_async(subject, data, stream=PLAIN_STREAM, headers=headers))
        await asyncio.gather(*futures)
    publish_s = time.perf_counter() - started
    await consumer
    consume_s = time.perf_counter() - first[0]
    await sub.unsubscribe()
    return _figures(len(payloads), publish_s, consume_s, latencies)


async def _run(count: int, url: str | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tangram-bench-") as store:
        server = None if url else NatsServer(Path(store)).start()
        try:
            bus = await Bus.connect(
                BusConfig(servers=(url or server.url,), name="bench", producer="bench")  # type: ignore[union-attr]
            )
            try:
                await bus.ensure_streams()
                tangram = await _tangram(bus, _events(count))
                plain = await _plain(bus, _events(count))
            finally:
                await bus.close()
        finally:
            if server is not None:
                server.stop()
    ratios = {key: round(tangram[key] / plain[key], 3) for key in tangram}
    return {"benchmark": "bus", "events": count, "tangram": tangram, "nats_py": plain, "ratio": ratios}


def run(args: argparse.Namespace) -> int:
    if args.events <= 0:
        raise SystemExit("tangram bench bus: --events must be positive")
    print(json.dumps(asyncio.run(_run(args.events, args.nats_url))))
    return 0
