"""`tangram bench bus`: Tangram's bus against plain nats-py on the same server, same bytes, same run.

Publishing and consuming run concurrently; latency is publish call to handler entry, per event.
With `--cluster`, both run against a 3-server JetStream cluster with every stream replicated on
all three (R3), as Tangram runs in production: an acknowledged publish is then on a quorum.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

from tangram.bench.pacing import pace
from tangram.bus import Bus, BusConfig, ConsumerSpec
from tangram.events import CLAIMS_STREAM, ClaimRequested, Event, encode
from tangram.local.natsserver import NatsCluster, NatsServer
from tangram.stats import percentile

PLAIN_STREAM = "BENCH_PLAIN"
CHUNK = 1000
PACED_CHUNK = 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=50_000, help="events per run (default 50000)")
    parser.add_argument(
        "--rate", type=int, default=2000, help="events/s of the paced latency run (default 2000)"
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="a 3-server JetStream cluster with streams replicated 3 times (default: one server)",
    )


def _events(count: int, prefix: str) -> list[Event]:
    spec: dict[str, Any] = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}}
    return [
        ClaimRequested(key=f"{prefix}-{n}", namespace="bench", name=f"c{n}", uid=f"{prefix}-{n}", spec=spec)
        for n in range(count)
    ]


def _figures(count: int, publish_s: float, consume_s: float, latencies_ms: list[float]) -> dict[str, float]:
    return {
        "acked_publishes_per_s": round(count / publish_s, 1),
        "consumed_per_s": round(count / consume_s, 1),
        "latency_p50_ms": round(percentile(latencies_ms, 0.5), 3),
        "latency_p99_ms": round(percentile(latencies_ms, 0.99), 3),
    }


async def _tangram(
    bus: Bus, events: list[Event], chunk_size: int, interval: float | None
) -> dict[str, float]:
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
    # Each run starts on an empty stream (the benchmark's own server), so its consumer sees only it.
    await bus.jetstream.purge_stream(CLAIMS_STREAM)
    durable = "bench-paced" if interval else "bench"
    spec = ConsumerSpec(durable=durable, stream=CLAIMS_STREAM, filter_subjects=("tangram.claim.requested.>",))
    consumer = asyncio.create_task(bus.consume(spec, handler, stop=stop, batch=256, ready=ready))
    await ready.wait()
    started = time.perf_counter()
    for index, offset in enumerate(range(0, len(events), chunk_size)):
        await pace(started, index, interval)
        chunk = events[offset : offset + chunk_size]
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


async def _plain(
    bus: Bus, events: list[Event], chunk_size: int, interval: float | None, replicas: int
) -> dict[str, float]:
    """The floor: nats-py publish_async and a bare pull consumer, same payloads and headers."""
    js = bus.jetstream
    stream = f"{PLAIN_STREAM}_{'PACED' if interval else 'SATURATED'}"
    await js.add_stream(
        StreamConfig(name=stream, subjects=[f"bench.{stream.lower()}.>"], num_replicas=replicas)
    )
    payloads = [(f"bench.{stream.lower()}.{e.key}", encode(e), {"Nats-Msg-Id": e.event_id}) for e in events]
    await js.add_consumer(stream, ConsumerConfig(durable_name="plain", ack_policy=AckPolicy.EXPLICIT))
    sub = await js.pull_subscribe_bind("plain", stream=stream)
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
    for index, offset in enumerate(range(0, len(payloads), chunk_size)):
        await pace(started, index, interval)
        chunk = payloads[offset : offset + chunk_size]
        stamp = time.perf_counter()
        futures = []
        for subject, data, headers in chunk:
            sent[headers["Nats-Msg-Id"]] = stamp
            futures.append(await js.publish_async(subject, data, stream=stream, headers=headers))
        await asyncio.gather(*futures)
    publish_s = time.perf_counter() - started
    await consumer
    consume_s = time.perf_counter() - first[0]
    await sub.unsubscribe()
    return _figures(len(payloads), publish_s, consume_s, latencies)


async def _run(count: int, rate: int, *, cluster: bool = False) -> dict[str, Any]:
    replicas = 3 if cluster else 1
    with tempfile.TemporaryDirectory(prefix="tangram-bench-") as store:
        servers: NatsCluster | NatsServer = (
            NatsCluster(Path(store), size=3).start() if cluster else NatsServer(Path(store)).start()
        )
        urls = servers.urls if isinstance(servers, NatsCluster) else (servers.url,)
        try:
            bus = await Bus.connect(
                BusConfig(servers=urls, name="bench", producer="bench", stream_replicas=replicas), wait_s=30
            )
            try:
                await bus.ensure_streams()
                tangram = await _tangram(bus, _events(count, "saturated"), CHUNK, None)
                plain = await _plain(bus, _events(count, "saturated"), CHUNK, None, replicas)
                paced_count = min(count, rate * 5)
                interval = PACED_CHUNK / rate
                tangram_paced = await _tangram(bus, _events(paced_count, "paced"), PACED_CHUNK, interval)
                plain_paced = await _plain(
                    bus, _events(paced_count, "paced"), PACED_CHUNK, interval, replicas
                )
                # what the servers say, not what was asked
                stored_replicas = {
                    name: (await bus.jetstream.stream_info(name)).config.num_replicas
                    for name in (CLAIMS_STREAM, f"{PLAIN_STREAM}_SATURATED")
                }
            finally:
                await bus.close()
        finally:
            servers.stop()
    latency_keys = ("latency_p50_ms", "latency_p99_ms")
    return {
        "benchmark": "bus",
        "servers": 3 if cluster else 1,
        "stream_replicas": stored_replicas,
        "events": count,
        "saturated": {
            "note": "publish as fast as acks allow; latency here is queueing behind the backlog",
            "tangram": tangram,
            "nats_py": plain,
            "ratio": {key: round(tangram[key] / plain[key], 3) for key in tangram},
        },
        "paced": {
            "rate_per_s": rate,
            "events": paced_count,
            "tangram": {key: tangram_paced[key] for key in latency_keys},
            "nats_py": {key: plain_paced[key] for key in latency_keys},
            "ratio": {key: round(tangram_paced[key] / plain_paced[key], 3) for key in latency_keys},
        },
    }


def run(args: argparse.Namespace) -> int:
    if args.events <= 0:
        raise SystemExit("tangram bench bus: --events must be positive")
    if args.rate <= 0:
        raise SystemExit("tangram bench bus: --rate must be positive")
    print(json.dumps(asyncio.run(_run(args.events, args.rate, cluster=args.cluster))))
    return 0
