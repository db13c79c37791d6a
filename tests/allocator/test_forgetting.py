"""Deleted claims are forgotten an hour after their release, by the claim source's clock: what the
ledger holds (and its image) grows with the claims that exist, not with every claim ever decided."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from services.allocator.clusterview import ClusterView
from services.allocator.requester import ClaimRequester
from services.allocator.settings import parse_settings
from tangram.allocation.image import decode_image, encode_image, image_of, restored_ledger
from tangram.allocation.ledger import Ledger
from tangram.events import (
    ClaimAllocated,
    ClaimReleased,
    ClaimRequested,
    Event,
    PartitionRequested,
)
from tangram.kubernetes.objects.claimbridge import ClaimRef
from tangram.kubernetes.objects.deviceclasses import load_shipped_device_classes

from .helpers import CLASSES, applied, gpus, inventory, ledger_on, mig, of, request

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(event: Event, minutes: float) -> Event:
    return msgspec.structs.replace(event, time=T0 + timedelta(minutes=minutes))


def deleted(claim: ClaimRequested, minutes: float, *, gone: bool = True) -> ClaimReleased:
    release = ClaimReleased(
        key=claim.uid, namespace=claim.namespace, name=claim.name, uid=claim.uid, deleted=gone
    )
    return msgspec.structs.replace(release, time=T0 + timedelta(minutes=minutes))


def mig_claim_released(book: Ledger, *, gone: bool = True) -> tuple[ClaimRequested, PartitionRequested]:
    """A MIG claim allocated, its instance made, released at minute 1 and its destroy done: every
    map of the ledger holds something of it. Returns the request and the destroy."""
    claim = request(1, mig("7g.141gb"))  # no such instance on the node: it is made
    [create] = of(PartitionRequested, book.apply(at(claim, 0)))
    book.apply(applied(create, "MIG-made-for-claim-1"))
    [destroy] = of(PartitionRequested, book.apply(deleted(claim, 1, gone=gone)))
    book.apply(applied(destroy, "MIG-made-for-claim-1"))
    return claim, destroy


def knows(book: Ledger, uid: str) -> list[str]:
    """The maps of the ledger, and its image, that still hold something of the claim."""
    holding = {
        "decided": uid in book.decided,
        "released": uid in book.released,
        "claims": uid in book.claims,
        "attempts": uid in book.attempts,
        "commands": uid in book.commands.values(),
        "slot_attempts": any(slot[0] == uid for slot, _ in book.slot_attempts.saved()),
        "image": uid.encode() in encode_image(image_of(book)),
    }
    return sorted(name for name, held in holding.items() if held)


def test_a_deleted_claim_is_forgotten_an_hour_after_its_release() -> None:
    book = ledger_on("hgx-h200")
    claim, _ = mig_claim_released(book)
    created = {c for c, uid in book.commands.items() if uid == claim.uid}
    assert created and created <= set(book.created)
    everything = ["attempts", "claims", "commands", "decided", "image", "released", "slot_attempts"]
    assert knows(book, claim.uid) == everything
    of(ClaimAllocated, book.apply(at(request(2, gpus(1)), 60)))  # 59 minutes after the deletion
    assert knows(book, claim.uid) == everything
    of(ClaimAllocated, book.apply(at(request(3, gpus(1)), 61)))
    assert knows(book, claim.uid) == []
    assert not created & set(book.created)
    assert book.deleted.saved() == []


def test_within_the_hour_a_deleted_claims_request_delivered_again_is_not_decided() -> None:
    book = ledger_on("hgx-h200")
    claim, _ = mig_claim_released(book)
    assert book.apply(at(claim, 30)) == []
    assert claim.uid in book.released


def test_only_the_claim_sources_events_move_the_clock() -> None:
    """Node results and the allocator's own decisions, which a rebuild folds and the live
    allocator does not read back, at other moments, never forget a claim."""
    book = ledger_on("hgx-h200")
    claim, destroy = mig_claim_released(book)
    book.apply(at(applied(destroy, "MIG-made-for-claim-1"), 600))
    other = request(2, gpus(1))
    [allocated] = of(ClaimAllocated, book.apply(at(other, 2)))
    book.apply(at(allocated, 600), live=False)
    assert "decided" in knows(book, claim.uid)
    book.apply(at(request(3, gpus(1)), 61))
    assert knows(book, claim.uid) == []


def test_a_claim_only_deallocated_is_kept_and_decided_again_when_asked_again() -> None:
    book = ledger_on("hgx-h200")
    claim, _ = mig_claim_released(book, gone=False)
    book.apply(at(request(2, gpus(1)), 600))
    assert {"decided", "released"} <= set(knows(book, claim.uid))
    assert book.apply(at(claim, 601)) == []  # the same attempt: not decided again
    assert of(ClaimAllocated, book.apply(at(msgspec.structs.replace(claim, attempt=1), 602)))


def test_a_claim_deallocated_then_deleted_is_forgotten_an_hour_after_its_deletion() -> None:
    book = ledger_on("hgx-h200")
    claim, _ = mig_claim_released(book, gone=False)
    assert book.apply(deleted(claim, 10)) == []  # released already: no second destroy
    book.apply(at(request(2, gpus(1)), 69))
    assert "decided" in knows(book, claim.uid)
    book.apply(at(request(3, gpus(1)), 70))
    assert knows(book, claim.uid) == []


def test_a_restored_image_forgets_at_the_event_the_live_ledger_forgets_at() -> None:
    live = ledger_on("hgx-h200")
    claim, _ = mig_claim_released(live)
    book = restored_ledger(
        decode_image(encode_image(image_of(live))), fleet=ledger_on("hgx-h200").fleet, classes=CLASSES
    )
    assert book.deleted.saved() == live.deleted.saved() == [(T0 + timedelta(minutes=1), claim.uid)]
    for minutes, n in ((60, 2), (61, 3)):
        asked = at(request(n, gpus(1)), minutes)
        live.apply(asked)
        book.apply(asked)
        assert knows(book, claim.uid) == knows(live, claim.uid)
    assert knows(book, claim.uid) == []


def test_forgetting_keeps_the_image_the_size_of_the_claims_that_exist() -> None:
    """Claims asked and deleted, one every two minutes: with forgetting, the image holds the last
    hour's claims, so it is as large after a thousand as after a hundred; kept, it grows tenfold."""
    forgetting, keeping = ledger_on("l40s-8"), ledger_on("l40s-8")
    sizes: dict[int, tuple[int, int]] = {}
    for n in range(1000):
        claim = request(n, gpus(1))
        for book in (forgetting, keeping):
            book.apply(at(claim, 2 * n))
            book.apply(deleted(claim, 2 * n + 1, gone=book is forgetting))
        if n + 1 in (100, 1000):
            sizes[n + 1] = (len(encode_image(image_of(forgetting))), len(encode_image(image_of(keeping))))
    assert sizes[1000][0] < 1.05 * sizes[100][0]
    assert sizes[1000][1] > 8 * sizes[100][1]
    assert len(forgetting.decided) == 30  # deleted in the last hour: claims 970-999
    assert len(keeping.decided) == 1000


def test_the_requester_releases_a_deleted_claim_once_and_a_deallocated_one_again_when_deleted() -> None:
    view = ClusterView()
    view.classes = {m["metadata"]["name"]: m for m in load_shipped_device_classes()}
    ledger = Ledger(fleet=ledger_on("l40s-8").fleet, classes=CLASSES)
    ledger.apply(inventory("l40s-8", "n1"), live=False)
    published: list[Event] = []

    async def publish(event: Event) -> None:
        published.append(event)

    requester = ClaimRequester(view, ledger, publish, producer="test", max_in_flight=1)
    refs = [ClaimRef(namespace="team", name=f"c{n}", uid=f"u{n}") for n in range(2)]
    for ref in refs:
        claim = {
            "metadata": {"namespace": "team", "name": ref.name, "uid": ref.uid},
            "spec": gpus(1),
            "status": {},
        }
        view.claims[("team", ref.name)] = claim
        requester.ask(claim)
    first = requester.release(refs[0], deleted=True)
    assert first is not None and first.deleted
    assert requester.release(refs[0], deleted=True) is None  # deleting, then gone: released once
    assert requester.release(refs[0]) is None
    deallocated = requester.release(refs[1])
    assert deallocated is not None and not deallocated.deleted
    assert requester.release(refs[1]) is None
    gone = requester.release(refs[1], deleted=True)
    assert gone is not None and gone.deleted and gone.event_id != deallocated.event_id
    assert not requester.knows("u0")


def test_the_allocator_forgets_after_the_hour_it_is_set_to_and_refuses_less_than_five_minutes(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    base = ["--nats-url", "nats://127.0.0.1:4222"]
    assert parse_settings(base).forget_deleted_after_s == 3600
    assert parse_settings([*base, "--forget-deleted-after", "600"]).forget_deleted_after_s == 600
    monkeypatch.setenv("TANGRAM_FORGET_DELETED_AFTER_S", "7200")
    assert parse_settings(base).forget_deleted_after_s == 7200
    with pytest.raises(SystemExit):
        parse_settings([*base, "--forget-deleted-after", "60"])
    assert "forget_deleted_after_s" in capsys.readouterr().err
