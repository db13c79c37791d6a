"""The kubelet plugin's view of its node's claims forgets a deleted claim an hour past its
deletion, by the releases' times: its slots' attempts and its commands' results went on growing
with every claim the node ever held."""

from __future__ import annotations

import msgspec

from tangram.kubelet.allocations import InMemoryAllocationSource
from tests.support.lifetimes import GPU, NODE, allocated, at, lifetime, released


def test_a_deleted_claims_attempts_and_results_go_an_hour_past_its_deletion() -> None:
    view = InMemoryAllocationSource(NODE)
    lifetime(view.observe, "gone", 0, retried=True)
    lifetime(view.observe, "kept", 1, deleted=False, retried=True)
    assert view.attempt("gone", GPU, 0) == 2  # the failed create and the destroy
    view.observe(released("other", at(60)))
    assert view.attempt("gone", GPU, 0) == 2
    view.observe(released("later", at(60.5)))
    assert view.attempt("gone", GPU, 0) == 0
    assert view.attempt("kept", GPU, 0) == 2  # only deallocated: it may be prepared again
    assert view.sizes()["partition_failures"] == 1  # kept's


def test_a_thousand_claims_leave_the_view_as_large_as_a_hundred_did() -> None:
    view = InMemoryAllocationSource(NODE)
    sizes = {}
    for n in range(1000):
        lifetime(view.observe, f"claim-{n}", n, retried=True)  # a claim a minute
        if n in (99, 999):
            sizes[n] = view.sizes()
    assert sizes[999] == sizes[99]
    assert sizes[99]["slot_attempts"] <= 61 and sizes[99]["partition_failures"] <= 61


def test_a_release_sent_again_forgets_once_and_a_decision_after_the_deletion_keeps_nothing() -> None:
    view = InMemoryAllocationSource(NODE)
    lifetime(view.observe, "twice", 0, retried=True)
    view.observe(released("twice", at(5)))  # the deletion released again, later
    view.observe(released("x", at(60.5)))
    assert view.attempt("twice", GPU, 0) == 0
    lifetime(view.observe, "back", 100, retried=True)
    again = msgspec.structs.replace(allocated("back", 0, at(101)), event_id="back-again")
    view.observe(again)  # made before the allocator read the deletion: it holds nothing
    assert view.attempt("back", GPU, 0) == 2
    view.observe(released("y", at(200)))
    assert view.attempt("back", GPU, 0) == 0


def test_a_decision_read_after_its_claims_deletion_holds_no_device() -> None:
    """Decided before the allocator read the claim's deletion, which the claims stream holds first:
    the claim holds nothing, and no other claim is kept from its device."""
    view = InMemoryAllocationSource(NODE)
    view.observe(released("late", at(0)))
    view.observe(allocated("late", 0, at(0.1)))
    assert not view.held_by_others("d", "next")
    assert view.sizes()["allocations"] == 0
    view.observe(allocated("live", 1, at(0.2)))  # a claim not deleted holds its device
    assert view.held_by_others("d", "next")
