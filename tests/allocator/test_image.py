"""A ledger restored from its image and the log after it is the ledger the whole log folds to."""

from __future__ import annotations

import random
import re
from collections.abc import Callable

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tangram.allocation import FleetState
from tangram.allocation.image import (
    IMAGE_SCHEMA,
    ImageError,
    LedgerImage,
    decode_image,
    encode_image,
    image_of,
    restored_ledger,
)
from tangram.allocation.ledger import Ledger
from tangram.events import (
    INVENTORY_STREAM,
    ClaimAllocated,
    ClaimFailed,
    ClaimReleased,
    Event,
    PartitionFailed,
    PartitionRequested,
)

from .helpers import CLASSES, applied, gpus, inventory, mig, of, request
from .histories import (
    INVENTORIES,
    SPEC_WEIGHTS,
    SPECS,
    Driver,
    Run,
    commands_and_decisions,
    fold_in_order,
    fresh_fleet,
    fresh_ledger,
    replayed,
    restored_from,
    uid_of,
    untimed,
)


def restored(data: bytes, run: Run, image_mark: int, restart_mark: int) -> Ledger:
    """The ledger of the image, with the log from the image's place to the restart folded onto it."""
    book = restored_from(decode_image(data))
    # the inventory stream is folded whole at every rebuild: its position is the stream's now
    book.folded(INVENTORY_STREAM, len(INVENTORIES))
    claims_at, nodes_at = run.marks[image_mark]
    claims_end, nodes_end = run.marks[restart_mark]
    fold_in_order(
        book,
        run.claims[claims_at:claims_end],
        run.nodes[nodes_at:nodes_end],
        starts=(claims_at + 1, nodes_at + 1),
    )
    return book


def go_on(first: Ledger, second: Ledger, run: Run, restart_mark: int) -> int:
    """Feed both ledgers what the allocator read after the restart; how many inputs that was."""
    for n, (stream, seq, event) in enumerate(run.inputs[restart_mark:], restart_mark):
        first.folded(stream, seq)
        second.folded(stream, seq)
        assert untimed(first.apply(event)) == untimed(second.apply(event)), f"input {n}: {event!r}"
    return len(run.inputs) - restart_mark


def imaged(seed: int, steps: int, image_at: float) -> tuple[Run, bytes, int]:
    """A live allocator's history of `steps` steps, and the image of it taken on the way."""
    driver = Driver(seed)
    image_step = int(image_at * steps)
    data = b""
    image_mark = 0
    for step in range(steps + 1):
        if step == image_step:
            data = encode_image(image_of(driver.live))
            image_mark = len(driver.run.inputs)
        if step < steps:
            driver.step()
    return driver.run, data, image_mark


@pytest.mark.timeout(600)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(10, 160), image_at=st.floats(0, 1))
def test_a_ledger_restored_from_its_image_decides_on_exactly_as_the_ledger_it_was_taken_of(
    seed: int, steps: int, image_at: float
) -> None:
    """Everything the live ledger's later outputs depend on is in its image: the restored ledger,
    fed what the live one read after the image, makes the very same outputs."""
    run, data, image_mark = imaged(seed, steps, image_at)
    book = restored(data, run, image_mark, image_mark)
    for n, (stream, seq, event) in enumerate(run.inputs[image_mark:], image_mark):
        book.folded(stream, seq)
        assert untimed(book.apply(event)) == untimed(run.outputs[n]), f"input {n}: {event!r}"


@pytest.mark.timeout(600)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    steps=st.integers(10, 160),
    image_at=st.floats(0, 1),
    restart_at=st.floats(0, 1),
)
def test_a_ledger_restored_from_its_image_and_the_tail_decides_on_as_the_ledger_of_the_whole_log(
    seed: int, steps: int, image_at: float, restart_at: float
) -> None:
    """A restart that restores the image the live allocator took and folds the log after it, in
    the rebuild's order, decides on as one that folds the whole log: the two are one rebuild, the
    image only shortens it. The commands compare by what makes them one command (their id); a
    destroy sent again for an instance made by no create names no instance after a rebuild."""
    run, data, image_mark = imaged(seed, steps, image_at)
    restart_mark = image_mark + int(restart_at * (len(run.inputs) - image_mark))
    book = restored(data, run, image_mark, restart_mark)
    claims_end, nodes_end = run.marks[restart_mark]
    rebuilt = replayed(run.claims[:claims_end], run.nodes[:nodes_end])
    assert book.snapshot() == rebuilt.snapshot()
    for n, (stream, seq, event) in enumerate(run.inputs[restart_mark:], restart_mark):
        book.folded(stream, seq)
        rebuilt.folded(stream, seq)
        assert commands_and_decisions(book.apply(event)) == commands_and_decisions(rebuilt.apply(event)), (
            f"input {n}: {event!r}"
        )
    assert book.snapshot() == rebuilt.snapshot()


@pytest.mark.timeout(600)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(10, 160), restart_at=st.floats(0, 1))
def test_an_image_of_a_rebuilt_ledger_restores_one_that_decides_on_exactly_as_it(
    seed: int, steps: int, restart_at: float
) -> None:
    """A rebuild holds what a live fold never does (requests read back before their decision,
    destroys expected before the results that answer them, results of commands it never sent):
    its image keeps that too."""
    run, _, _ = imaged(seed, steps, 0)
    restart_mark = int(restart_at * len(run.inputs))
    claims_end, nodes_end = run.marks[restart_mark]
    rebuilt = replayed(run.claims[:claims_end], run.nodes[:nodes_end])
    again = restored_from(decode_image(encode_image(image_of(rebuilt))))
    assert again.snapshot() == rebuilt.snapshot()
    go_on(again, rebuilt, run, restart_mark)
    assert again.snapshot() == rebuilt.snapshot()
    assert timeless(image_of(again)) == timeless(image_of(rebuilt))


def timeless(image: LedgerImage) -> LedgerImage:
    """The image with the publication time of the commands it keeps, the one field not decided."""
    pending = {
        uid: dict(zip(c, untimed(list(c.values())), strict=True))
        for uid, c in image.unanswered_destroys.items()
    }
    return msgspec.structs.replace(image, unanswered_destroys=pending)


def requests_and_releases(seed: int, claims: int) -> list[Event]:
    """Claims asked and released: each leaves after a random number of later arrivals."""
    rng = random.Random(seed)
    events: list[Event] = []
    due: dict[int, list[int]] = {}
    for n in range(claims):
        for gone in due.pop(n, []):
            uid = uid_of(gone)
            events.append(ClaimReleased(key=uid, namespace="team", name=f"claim-{gone}", uid=uid))
        events.append(request(n, rng.choices(SPECS, weights=SPEC_WEIGHTS)[0]))
        due.setdefault(n + rng.randint(3, 25), []).append(n)
    return events


def test_an_image_without_its_demand_mix_would_decide_differently() -> None:
    # The image is only worth something if what it holds changes decisions: the same image with
    # the mix left out (as a fresh allocator's) places the claims after it elsewhere.
    events = requests_and_releases(7, 160)
    middle = len(events) // 2
    live = fresh_ledger()
    for event in events[:middle]:
        live.apply(event)
    image = image_of(live)
    assert image.fleet.demand.kinds
    whole = restored_from(decode_image(encode_image(image)))
    empty = msgspec.structs.replace(image.fleet.demand, kinds=[], growth=1.0, ticks=0)
    forgetful = restored_from(
        msgspec.structs.replace(image, fleet=msgspec.structs.replace(image.fleet, demand=empty))
    )
    assert forgetful.snapshot() == whole.snapshot() == live.snapshot()
    differ = 0
    for event in events[middle:]:
        expected = untimed(live.apply(event))
        assert untimed(whole.apply(event)) == expected
        differ += untimed(forgetful.apply(event)) != expected
    assert differ > 0


def test_an_image_without_what_was_decided_and_released_would_decide_a_redelivered_request_again() -> None:
    live = fresh_ledger()
    asked = request(1, gpus(2))
    assert of(ClaimAllocated, live.apply(asked))
    live.apply(ClaimReleased(key=asked.uid, namespace="team", name=asked.name, uid=asked.uid))
    image = image_of(live)
    book = restored_from(decode_image(encode_image(image)))
    assert book.apply(asked) == []  # redelivered: decided once, and released since
    amnesiac = restored_from(msgspec.structs.replace(image, decided={}, released=[]))
    assert of(ClaimAllocated, amnesiac.apply(asked))


def test_a_failed_claim_asked_again_with_the_same_attempt_is_not_decided_again_after_a_restore() -> None:
    live = fresh_ledger()
    asked = request(1, gpus(9))  # no node has nine GPUs
    assert of(ClaimFailed, live.apply(msgspec.structs.replace(asked, attempt=2)))
    image = image_of(live)
    book = restored_from(decode_image(encode_image(image)))
    assert book.apply(msgspec.structs.replace(asked, attempt=1)) == []
    amnesiac = restored_from(msgspec.structs.replace(image, attempts={}))
    assert of(ClaimFailed, amnesiac.apply(msgspec.structs.replace(asked, attempt=1)))


def _image_bytes() -> bytes:
    live = fresh_ledger()
    for event in requests_and_releases(3, 20):
        live.apply(event)
    return encode_image(image_of(live))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda data: data[: len(data) // 2], "not a ledger image"),
        (lambda data: b"", "not a ledger image"),
        (lambda data: b"\x80\x04pickle", "not a ledger image"),
        (lambda data: b"[1, 2]", "not a ledger image"),
        (lambda data: data.replace(IMAGE_SCHEMA.encode(), b"0" * 64), "of schema '000000000000'"),
        (lambda data: data.replace(b'"decided":', b'"verdicts":', 1), "an invalid ledger image"),
        (lambda data: data[:-1] + b',"extra":1}', "an invalid ledger image"),
        (lambda data: data.replace(b'"ticks":', b'"ticks":"many","was":', 1), "an invalid ledger image"),
    ],
    ids=[
        "truncated",
        "empty",
        "pickle",
        "not-an-object",
        "other-schema",
        "field-renamed",
        "unknown-field",
        "wrong-type",
    ],
)
def test_bytes_that_are_not_an_image_of_this_shape_are_refused_with_the_reason(
    damage: Callable[[bytes], bytes], reason: str
) -> None:
    data = _image_bytes()
    assert decode_image(data) == decode_image(data)
    with pytest.raises(ImageError, match=re.escape(reason)) as caught:
        decode_image(damage(data))
    assert isinstance(caught.value, ValueError)


def test_an_image_is_restored_onto_a_fleet_of_inventories_alone() -> None:
    image = decode_image(_image_bytes())
    fleet = fresh_fleet()
    restored_ledger(image, fleet=fleet, classes=CLASSES)
    with pytest.raises(ImageError, match="holds claims"):
        restored_ledger(image, fleet=fleet, classes=CLASSES)


def test_a_demand_kind_that_derives_as_another_is_refused() -> None:
    image = decode_image(_image_bytes())
    kind = msgspec.structs.replace(image.fleet.demand.kinds[0], order="('claim', 'another')")
    demand = msgspec.structs.replace(image.fleet.demand, kinds=[kind, *image.fleet.demand.kinds[1:]])
    damaged = msgspec.structs.replace(image, fleet=msgspec.structs.replace(image.fleet, demand=demand))
    with pytest.raises(ImageError, match="derives as"):
        restored_ledger(damaged, fleet=fresh_fleet(), classes=CLASSES)


def test_a_claim_placed_again_on_its_slot_after_a_failed_create_sends_the_live_create_restored() -> None:
    """The image keeps the attempts the nodes closed on each slot: the create of a claim decided
    again after its create failed is numbered by them, as the node numbers it. Without them the
    restored ledger would send the failed create's id again, which JetStream drops as a duplicate
    (and which is already answered)."""
    dgx = inventory("dgx-h100", "n1")  # no MIG instance yet: every placement needs a create

    def fleet() -> FleetState:
        fleet = FleetState()
        fleet.apply_inventory(dgx.hardware)
        return fleet

    live = Ledger(fleet=FleetState(), classes=CLASSES)
    live.apply(dgx, live=False)
    asked = request(1, mig("7g.80gb"))
    [first] = of(PartitionRequested, live.apply(asked))
    failure = PartitionFailed(
        key=first.key, command_id=first.command_id, node=first.node, action=first.action,
        gpu_uuid=first.gpu_uuid, profile=first.profile, placement=first.placement,
        claim_uid=first.claim_uid, reason="refused",
    )  # fmt: skip
    assert of(ClaimFailed, live.apply(failure))
    image = image_of(live)
    assert image.slot_attempts
    book = restored_ledger(decode_image(encode_image(image)), fleet=fleet(), classes=CLASSES)
    amnesiac = restored_ledger(
        msgspec.structs.replace(image, slot_attempts=[]), fleet=fleet(), classes=CLASSES
    )
    again = msgspec.structs.replace(asked, attempt=1)
    expected = untimed(live.apply(again))
    [second] = of(PartitionRequested, expected)
    assert (second.gpu_uuid, second.placement) == (first.gpu_uuid, first.placement)  # the same slot
    assert second.command_id != first.command_id
    assert untimed(book.apply(again)) == expected
    [forgotten] = of(PartitionRequested, amnesiac.apply(again))
    assert forgotten.command_id == first.command_id
    # Its hold names the second create live, as a replayed hold does: imaged now and released, the
    # restored ledger destroys the instance that create made, by the command the live one sends.
    live.apply(applied(second, "MIG-second"))
    later = restored_ledger(decode_image(encode_image(image_of(live))), fleet=fleet(), classes=CLASSES)
    held = later.fleet.allocation(asked.uid)
    assert held is not None and [d.partition_command for d in held.devices] == [second.command_id]
    release = ClaimReleased(key=asked.uid, namespace="team", name=asked.name, uid=asked.uid)
    [destroy] = of(PartitionRequested, untimed(live.apply(release)))
    assert destroy.mig_uuid == "MIG-second"
    assert untimed(later.apply(release)) == [destroy]
