"""The bus against a real nats-server: de-duplication, redelivery, dead letters, replay, restarts."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
import pytest

from tangram.bus import Bus, BusConfig, ConsumerSpec, Poison, redact_url
from tangram.bus.config import inbox_prefix
from tangram.events import (
    CLAIMS_STREAM,
    DEADLETTER_STREAM,
    ClaimFailed,
    ClaimReleased,
    ClaimRequested,
    DeadLetter,
    Event,
    encode,
)
from tangram.local.natsserver import NatsServer
from tests.support.polling import until


def claim(n: int) -> ClaimRequested:
    uid = f"uid-{n:04d}"
    return ClaimRequested(key=uid, namespace="team-a", name=f"claim-{n}", uid=uid, spec={"devices": {}})


CLAIMS_CONSUMER = ConsumerSpec(
    durable="test-claims",
    stream=CLAIMS_STREAM,
    filter_subjects=("tangram.claim.requested.>",),
    max_deliver=3,
    backoff_s=(0.05,),
    ack_wait_s=5.0,
)


async def collect(bus: Bus, stream: str, **kwargs: object) -> list[tuple[int, Event]]:
    return [item async for item in bus.replay(stream, **kwargs)]  # type: ignore[arg-type]


async def run_consumer(
    bus: Bus, spec: ConsumerSpec, handler: Callable[[Event], Awaitable[None]], until: Callable[[], bool]
) -> None:
    """Consume until `until()` holds; the condition is checked on every handled message."""
    stop = asyncio.Event()
    done = asyncio.Event()

    async def wrapped(event: Event) -> None:
        try:
            await handler(event)
        finally:
            if until():
                done.set()

    task = asyncio.create_task(bus.consume(spec, wrapped, stop=stop))
    try:
        await asyncio.wait_for(done.wait(), 30)
    finally:
        stop.set()
        await task


async def test_duplicate_publish_is_stored_once(bus: Bus) -> None:
    event = claim(1)
    first = await bus.publish(event)
    second = await bus.publish(event)
    assert not first.duplicate
    assert second.duplicate
    assert second.seq == first.seq
    stored = await collect(bus, CLAIMS_STREAM)
    assert [seq for seq, _ in stored] == [1]


async def test_failing_handler_is_redelivered_then_succeeds(bus: Bus) -> None:
    await bus.publish(claim(1))
    attempts: list[str] = []

    async def flaky(event: Event) -> None:
        attempts.append(event.event_id)
        if len(attempts) < 3:
            raise RuntimeError("transient")

    await run_consumer(bus, CLAIMS_CONSUMER, flaky, until=lambda: len(attempts) >= 3)
    assert len(attempts) == 3 and len(set(attempts)) == 1
    assert await collect(bus, DEADLETTER_STREAM) == []


async def test_poison_and_garbage_go_to_dead_letter_and_consumer_continues(bus: Bus) -> None:
    await bus.publish(claim(1))
    await bus.jetstream.publish("tangram.claim.requested.garbage", b"{not json", stream=CLAIMS_STREAM)
    await bus.publish(claim(2))
    await bus.publish(claim(3))
    handled: list[str] = []

    async def handler(event: Event) -> None:
        assert isinstance(event, ClaimRequested)
        if event.uid == "uid-0002":
            raise Poison("claim 2 can never be decided")
        handled.append(event.uid)

    await run_consumer(bus, CLAIMS_CONSUMER, handler, until=lambda: "uid-0003" in handled)
    assert handled == ["uid-0001", "uid-0003"]
    letters = [event for _, event in await collect(bus, DEADLETTER_STREAM)]
    assert all(isinstance(letter, DeadLetter) for letter in letters)
    by_seq = {letter.original_sequence: letter for letter in letters if isinstance(letter, DeadLetter)}
    assert sorted(by_seq) == [2, 3]
    assert by_seq[2].data == b"{not json"
    assert by_seq[2].reason.startswith("undecodable event:")
    assert by_seq[3].reason == "poison: claim 2 can never be decided"
    assert by_seq[3].consumer == "test-claims"
    assert msgspec.json.decode(by_seq[3].data)["uid"] == "uid-0002"


async def test_exhausted_redeliveries_go_to_dead_letter(bus: Bus) -> None:
    await bus.publish(claim(1))
    await bus.publish(claim(2))
    seen: list[str] = []

    async def always_fails_on_1(event: Event) -> None:
        assert isinstance(event, ClaimRequested)
        seen.append(event.uid)
        if event.uid == "uid-0001":
            raise ValueError("broken")

    await run_consumer(bus, CLAIMS_CONSUMER, always_fails_on_1, until=lambda: seen.count("uid-0001") >= 3)
    letters = [event for _, event in await collect(bus, DEADLETTER_STREAM)]
    assert len(letters) == 1
    letter = letters[0]
    assert isinstance(letter, DeadLetter)
    assert letter.deliveries == 3
    assert letter.reason == "failed 3 times, last: ValueError: broken"
    assert "uid-0002" in seen


async def test_replay_from_sequence_is_ordered_and_repeatable(bus: Bus) -> None:
    events = [claim(n) for n in range(20)]
    await bus.publish_batch(events)
    first = await collect(bus, CLAIMS_STREAM, start_seq=7)
    second = await collect(bus, CLAIMS_STREAM, start_seq=7)
    assert [seq for seq, _ in first] == list(range(7, 21))
    assert [e.event_id for _, e in first] == [e.event_id for e in events[6:]]
    assert first == second


async def test_replay_filters_subjects_and_starts_from_time(bus: Bus) -> None:
    await bus.publish(claim(1))
    failed = ClaimFailed(key="uid-0001", namespace="team-a", name="claim-1", uid="uid-0001", reason="no GPUs")
    await bus.publish(failed)
    only_failed = await collect(bus, CLAIMS_STREAM, subjects=["tangram.claim.failed.>"])
    assert [e for _, e in only_failed] == [failed]
    from_time = await collect(bus, CLAIMS_STREAM, start_time=failed.time)
    assert [e.event_id for _, e in from_time] == [failed.event_id]


async def test_replay_into_folds_without_cyclic_collections_and_restores_the_collector(bus: Bus) -> None:
    await bus.publish_batch([claim(n) for n in range(5)])
    collecting: list[bool] = []

    def fold(event: object) -> None:
        collecting.append(gc.isenabled())
        if len(collecting) == 3:
            raise ValueError("a bug in the fold")  # reported and skipped, as at start-up

    assert gc.isenabled()
    assert await bus.replay_into([(CLAIMS_STREAM, ())], fold) == 5
    assert collecting == [False] * 5
    assert gc.isenabled()
    # a caller that runs without the collector keeps it off
    gc.disable()
    try:
        await bus.replay_into([(CLAIMS_STREAM, ())], fold)
        assert not gc.isenabled()
    finally:
        gc.enable()


async def test_replay_of_empty_stream_yields_nothing(bus: Bus) -> None:
    assert await collect(bus, CLAIMS_STREAM) == []
    await bus.publish(claim(1))
    assert await collect(bus, CLAIMS_STREAM, start_seq=2) == []


async def test_server_restart_loses_no_acknowledged_event_and_client_resumes(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "store").start()
    bus = await Bus.connect(
        BusConfig(servers=(server.url,), name="t", producer="t", publish_retry_s=30), wait_s=5
    )
    try:
        await bus.ensure_streams()
        acked = [claim(n) for n in range(10)]
        await bus.publish_batch(acked)
        server.kill()
        restart = NatsServer(tmp_path / "store", port=server.port)

        async def restart_later() -> None:
            await asyncio.sleep(0.3)
            await asyncio.to_thread(restart.start)

        restarting = asyncio.create_task(restart_later())
        late = claim(99)
        ack = await bus.publish(late)  # retried through the outage by the client itself
        await restarting
        assert ack.seq == 11
        stored = [e.event_id for _, e in await collect(bus, CLAIMS_STREAM)]
        assert stored == [e.event_id for e in acked] + [late.event_id]
    finally:
        await bus.close()
        server.stop()
        restart.stop()


@pytest.mark.parametrize("streams", [2])
async def test_ensure_streams_is_idempotent(bus: Bus, streams: int) -> None:
    for _ in range(streams):
        await bus.ensure_streams()
    info = await bus.jetstream.stream_info("TANGRAM_INVENTORY")
    assert info.config.max_msgs_per_subject == 1
    assert info.config.subjects == ["tangram.inventory.>"]


async def test_follow_delivers_history_then_live_events(bus: Bus) -> None:
    history = [claim(n) for n in range(5)]
    await bus.publish_batch(history)
    await bus.jetstream.publish("tangram.claim.requested.junk", b"[]", stream=CLAIMS_STREAM)
    seen: list[str] = []
    live = claim(77)
    got_live = asyncio.Event()
    stop = asyncio.Event()
    caught_up = asyncio.Event()

    def handler(event: Event) -> None:
        seen.append(event.event_id)
        if event.event_id == live.event_id:
            got_live.set()

    task = asyncio.create_task(
        bus.follow(CLAIMS_STREAM, "tangram.claim.requested.>", handler, stop=stop, caught_up=caught_up)
    )
    await asyncio.wait_for(caught_up.wait(), 10)
    assert seen == [e.event_id for e in history]
    await bus.publish(live)
    await asyncio.wait_for(got_live.wait(), 10)
    stop.set()
    await task
    assert seen == [e.event_id for e in history] + [live.event_id]


async def test_follow_of_a_subject_with_no_history_is_caught_up_at_once(bus: Bus) -> None:
    await bus.publish(claim(1))  # the stream has history, none of it on the followed subject
    stop = asyncio.Event()
    caught_up = asyncio.Event()
    task = asyncio.create_task(
        bus.follow(CLAIMS_STREAM, "tangram.claim.failed.>", lambda e: None, stop=stop, caught_up=caught_up)
    )
    await asyncio.wait_for(caught_up.wait(), 10)
    stop.set()
    await task
    assert caught_up.is_set()


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("nats://allocator:s3cret@10.0.0.5:4222", "nats://***@10.0.0.5:4222"),
        ("tls://nats.example.com", "tls://nats.example.com"),
        ("nats://token@127.0.0.1:4222", "nats://***@127.0.0.1:4222"),
    ],
)
def test_urls_are_logged_without_credentials(url: str, shown: str) -> None:
    assert redact_url(url) == shown


async def test_ensure_streams_leaves_a_matching_stream_alone_and_fixes_a_drifted_one(bus: Bus) -> None:
    before = await bus.jetstream.stream_info("TANGRAM_CLAIMS")
    await bus.ensure_streams()
    unchanged = await bus.jetstream.stream_info("TANGRAM_CLAIMS")
    assert unchanged.created == before.created and unchanged.config.duplicate_window == 120.0
    drifted = unchanged.config
    drifted.duplicate_window = 30.0
    await bus.jetstream.update_stream(drifted)
    await bus.ensure_streams()
    fixed = await bus.jetstream.stream_info("TANGRAM_CLAIMS")
    assert fixed.config.duplicate_window == 120.0


async def test_follow_of_several_subjects_keeps_the_stream_order_between_them(bus: Bus) -> None:
    published: list[Event] = []
    for n in range(10):
        uid = f"uid-{n:04d}"
        published.append(claim(n))
        published.append(ClaimFailed(key=uid, namespace="team-a", name=f"claim-{n}", uid=uid, reason="none"))
    for event in published:
        await bus.publish(event)
    seen: list[str] = []
    stop = asyncio.Event()
    caught_up = asyncio.Event()
    task = asyncio.create_task(
        bus.follow(
            CLAIMS_STREAM,
            ["tangram.claim.failed.>", "tangram.claim.requested.>"],
            lambda e: seen.append(e.event_id),
            stop=stop,
            caught_up=caught_up,
        )
    )
    await asyncio.wait_for(caught_up.wait(), 10)
    stop.set()
    await task
    assert seen == [e.event_id for e in published]


async def test_keyed_consumer_keeps_order_per_key_and_runs_keys_concurrently(bus: Bus) -> None:
    # Claims 0-2 share key "a", 3-4 key "b" (the key is the claim's namespace).
    for n in range(5):
        uid = f"uid-{n:04d}"
        namespace = "a" if n < 3 else "b"
        await bus.publish(ClaimRequested(key=uid, namespace=namespace, name=f"c{n}", uid=uid, spec={}))
    b_started = asyncio.Event()
    started: list[str] = []
    finished: list[str] = []

    async def handler(event: Event) -> None:
        assert isinstance(event, ClaimRequested)
        started.append(event.name)
        if event.name == "c3":
            b_started.set()
        if event.name == "c0":
            # Key "a" waits here until key "b" has started: only possible if keys run concurrently.
            await asyncio.wait_for(b_started.wait(), 10)
        finished.append(event.name)

    stop = asyncio.Event()
    task = asyncio.create_task(
        bus.consume(
            CLAIMS_CONSUMER,
            handler,
            stop=stop,
            order_by=lambda e: e.namespace,  # type: ignore[attr-defined]
            concurrency=2,
        )
    )
    try:
        await until("all five handled", lambda: len(finished) == 5, 20, every=0.02)
    finally:
        stop.set()
        await task
    assert [n for n in finished if n in ("c0", "c1", "c2")] == ["c0", "c1", "c2"]
    assert [n for n in finished if n in ("c3", "c4")] == ["c3", "c4"]
    assert started.index("c3") < finished.index("c0")


def _forged_release() -> tuple[str, bytes]:
    """A release for claim uid-0001, published where claims are requested: never a release."""
    uid = "uid-0001"
    release = ClaimReleased(key=uid, namespace="team-a", name="claim-1", uid=uid)
    return f"tangram.claim.requested.{uid}", encode(release)


async def _letters(bus: Bus) -> list[DeadLetter]:
    return [e for _, e in await collect(bus, DEADLETTER_STREAM) if isinstance(e, DeadLetter)]


async def test_consumer_dead_letters_an_event_its_subject_may_not_carry(bus: Bus) -> None:
    subject, data = _forged_release()
    await bus.jetstream.publish(subject, data)
    genuine = claim(2)
    await bus.publish(genuine)
    handled: list[str] = []

    async def handler(event: Event) -> None:
        handled.append(event.event_id)

    await run_consumer(bus, CLAIMS_CONSUMER, handler, until=lambda: bool(handled))
    assert handled == [genuine.event_id]
    [letter] = await _letters(bus)
    assert (letter.consumer, letter.original_subject, letter.data) == ("test-claims", subject, data)
    assert letter.reason == (
        f"refused by subject: claim.released on '{subject}': this subject carries claim.requested only"
    )


async def test_follow_dead_letters_and_skips_what_its_subject_may_not_carry(bus: Bus) -> None:
    subject, data = _forged_release()
    await bus.jetstream.publish(subject, data)
    genuine = claim(2)
    await bus.publish(genuine)
    seen: list[str] = []
    stop = asyncio.Event()
    caught_up = asyncio.Event()
    task = asyncio.create_task(
        bus.follow(
            CLAIMS_STREAM,
            "tangram.claim.requested.>",
            lambda e: seen.append(e.event_id),
            stop=stop,
            caught_up=caught_up,
        )
    )
    await asyncio.wait_for(caught_up.wait(), 10)
    stop.set()
    await task
    assert seen == [genuine.event_id]
    [letter] = await _letters(bus)
    assert (letter.consumer, letter.original_subject) == ("test-follow", subject)
    assert letter.reason.startswith("refused by subject: claim.released on")


async def test_replay_skips_what_its_subject_may_not_carry(bus: Bus) -> None:
    subject, data = _forged_release()
    await bus.jetstream.publish(subject, data)
    genuine = claim(2)
    await bus.publish(genuine)
    assert [e.event_id for _, e in await collect(bus, CLAIMS_STREAM)] == [genuine.event_id]


async def test_follow_goes_on_after_the_server_restarts(nats_server: NatsServer, bus: Bus) -> None:
    first, second = claim(1), claim(2)
    await bus.publish(first)
    seen: list[str] = []
    arrived = asyncio.Event()

    def handler(event: Event) -> None:
        seen.append(event.event_id)
        if event.event_id == second.event_id:
            arrived.set()

    stop = asyncio.Event()
    caught_up = asyncio.Event()
    task = asyncio.create_task(
        bus.follow(CLAIMS_STREAM, "tangram.claim.requested.>", handler, stop=stop, caught_up=caught_up)
    )
    try:
        await asyncio.wait_for(caught_up.wait(), 10)
        # The follower's consumer lives in the server's memory: a restart loses it.
        nats_server.stop()
        nats_server.start()
        await bus.publish(second)
        await asyncio.wait_for(arrived.wait(), 30)
    finally:
        stop.set()
        await task
    assert seen == [first.event_id, second.event_id]  # nothing lost, nothing twice


@pytest.mark.parametrize(
    ("servers", "name", "prefix"),
    [
        (("nats://node-gpu-1:s3cret@nats:4222",), "discovery", "_INBOX_node-gpu-1"),
        (("nats://nats:4222",), "cdi@gpu-1.lab", "_INBOX_cdi-gpu-1-lab"),  # no user: the connection name
    ],
)
def test_replies_arrive_on_the_users_own_inbox(servers: tuple[str, ...], name: str, prefix: str) -> None:
    assert inbox_prefix(BusConfig(servers=servers, name=name, producer=name)) == prefix
