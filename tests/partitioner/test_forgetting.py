"""A node's partitioner keeps what grows with its instances and live claims, not with every claim
and command it ever saw: a deleted claim is forgotten an hour past its deletion (by the releases'
times), a command's outcome an hour past it (by this node's results' times), and a create older
than a claim forgotten since is never run."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec

from tangram.events import MigPlacement, PartitionApplied, PartitionFailed
from tangram.partitioning import PartitionLedger
from tangram.partitioning.model import InstanceKey
from tests.partitioner.helpers import NODE, Collected, command, gpu_uuid, partitioner, sim
from tests.support.lifetimes import GPU, HOUR, allocated, at, failed_create, lifetime, released, result


def test_a_deleted_claim_is_forgotten_an_hour_past_its_deletion_by_the_releases_times() -> None:
    ledger = PartitionLedger(NODE)
    lifetime(ledger.observe, "gone", 0)
    assert ledger.has_ended("gone") and not ledger.may_have_forgotten(at(0))
    ledger.observe(released("other", at(60)))  # 59.5 minutes after: not yet
    assert ledger.has_ended("gone")
    ledger.observe(released("later", at(60.5)))
    assert not ledger.has_ended("gone")
    assert "gone" not in ledger.deleted
    # Its commands were sent before its deletion: one of them delivered now is not run.
    assert ledger.may_have_forgotten(at(0))
    # One sent well after the claims forgotten is not suspect (a margin for the senders' clocks).
    assert not ledger.may_have_forgotten(at(30))


def test_a_claim_only_deallocated_is_kept_and_node_results_never_move_the_claims_clock() -> None:
    ledger = PartitionLedger(NODE)
    lifetime(ledger.observe, "kept", 0, deleted=False)
    lifetime(ledger.observe, "gone", 1)
    ledger.observe(result("x", "create", at(500)))  # this node's results are another clock
    assert ledger.has_ended("gone")
    ledger.observe(released("later", at(200)))
    assert ledger.has_ended("kept") and not ledger.has_ended("gone")


def test_an_outcome_is_forgotten_an_hour_past_it_by_this_nodes_results_times() -> None:
    ledger = PartitionLedger(NODE)
    ledger.observe(result("a", "create", at(0)))
    failed = failed_create("b", "b-create", at(30), start=1)
    ledger.observe(failed)
    ledger.observe(result("a", "create", at(0)))  # folded again (published here, then followed)
    ledger.observe(result("elsewhere", "create", at(600), node="node-b"))  # another node's
    assert ledger.outcome("a-create") is not None and ledger.outcome("b-create") is failed
    ledger.observe(result("c", "create", at(60)))
    assert ledger.outcome("a-create") is None and ledger.outcome("b-create") is failed
    ledger.observe(result("d", "create", at(90)))
    assert ledger.outcome("b-create") is None
    assert ledger.outcome("c-create") is not None and ledger.outcome("d-create") is not None


def test_a_thousand_claims_leave_the_ledger_as_large_as_a_hundred_did() -> None:
    forgetting, keeping = PartitionLedger(NODE), PartitionLedger(NODE, forget_after=timedelta(days=365))
    sizes = {}
    for n in range(1000):
        for ledger in (forgetting, keeping):
            lifetime(ledger.observe, f"claim-{n}", n)  # a claim a minute
        if n in (99, 999):
            sizes[n] = (forgetting.sizes(), keeping.sizes())
    (small, kept_small), (large, kept_large) = sizes[99], sizes[999]
    assert {k: v for k, v in large.items() if k != "decided"} == {
        k: v for k, v in small.items() if k != "decided"
    }
    assert small["outcomes"] <= 2 * 61 and small["ended"] <= 61
    assert kept_large["outcomes"] == 2000 and kept_large["ended"] == kept_large["decided"] == 1000
    assert kept_small["ended"] == 100


async def test_a_create_sent_before_a_claim_forgotten_since_is_not_run() -> None:
    nvml = sim("hgx-h200")
    collected = Collected()
    p = partitioner(nvml, collected, claim_release_wait_s=0.05)
    now = datetime.now(UTC)
    slice_1g = {"profile": "1g.18gb", "profile_id": 19, "start": 0, "size": 1}
    create = msgspec.structs.replace(
        command("gone-create", nvml, gpu=2, claim_uid="gone", **slice_1g),  # type: ignore[arg-type]
        time=now - 2 * HOUR,
    )
    gpu = gpu_uuid(nvml, 2)
    p.observe(allocated("gone", 0, now - 2 * HOUR, gpu=gpu))
    p.observe(released("gone", now - 2 * HOUR + timedelta(minutes=1)))
    p.observe(released("later", now))
    assert not p.ledger.has_ended("gone")  # forgotten: its create, delivered again now, must not run
    await p.handle(create)
    [failed] = [e for e in collected.events if isinstance(e, PartitionFailed | PartitionApplied)]
    assert isinstance(failed, PartitionFailed) and "may have ended and been forgotten" in failed.reason
    assert nvml.nvmlDeviceGetMigMode(nvml.nvmlDeviceGetHandleByIndex(2))[0] == 0  # nothing was made
    # A create for a claim never seen, sent now, runs (a claim the node prepared itself).
    fresh = command("fresh-create", nvml, gpu=3, claim_uid="fresh", **slice_1g)  # type: ignore[arg-type]
    await p.handle(fresh)
    assert isinstance(collected.events[-1], PartitionApplied)


def test_a_decision_read_after_its_claims_deletion_never_makes_the_claim_live() -> None:
    """The claim source can publish a deletion while the claim's request waits for the allocator,
    which decides it before it reads the deletion: the claims stream holds the deletion first. That
    decision is stale (the allocator frees the claim as it reads the deletion), so the instance
    made for it belongs to no live claim, and the allocator's destroy of it is not refused."""
    ledger = PartitionLedger(NODE)
    ledger.observe(released("late", at(0)))
    ledger.observe(allocated("late", 0, at(0.1)))
    ledger.observe(result("late", "create", at(0.2)))
    assert ledger.has_ended("late") and not ledger.is_live("late")
    assert ledger.allocation("late") is None
    assert ledger.owner(InstanceKey.of(GPU, MigPlacement(start=0, size=1))) is None
    # only deallocated, then decided again for a new pod: live again
    ledger.observe(released("again", at(1), deleted=False))
    ledger.observe(allocated("again", 1, at(1.1)))
    assert ledger.is_live("again") and ledger.allocation("again") is not None
