"""The pure parts: policy, the ledger folded from events, reconciliation findings."""

from __future__ import annotations

import msgspec
import pytest

from tangram.events import (
    AllocatedDevice,
    ClaimAllocated,
    ClaimPrepared,
    ClaimReleased,
    ClaimUnprepared,
    MigPlacement,
    PartitionApplied,
    PartitionFailed,
)
from tangram.partitioning import (
    InstanceKey,
    ObservedInstance,
    PartitionLedger,
    WarmPoolError,
    keep_warm,
    mig_toggle_needs_reset,
    parse_warm_pool,
    reconcile,
    should_disable_mig,
    to_clean,
)

NODE = "node-a"
GPU = "GPU-0000"


def test_warm_pool_setting() -> None:
    assert parse_warm_pool("1g.18gb=2, 3g.71gb=1") == {"1g.18gb": 2, "3g.71gb": 1}
    assert parse_warm_pool("") == {}
    with pytest.raises(WarmPoolError, match=r"'1g\.18gb' is not PROFILE=COUNT"):
        parse_warm_pool("1g.18gb")
    with pytest.raises(WarmPoolError, match=r"count 'two' is not an integer"):
        parse_warm_pool("1g.18gb=two")
    with pytest.raises(WarmPoolError, match=r"names profile '1g\.18gb' twice"):
        parse_warm_pool("1g.18gb=1,1g.18gb=2")
    with pytest.raises(WarmPoolError, match="must not be negative"):
        parse_warm_pool("1g.18gb=-1")
    assert keep_warm("1g.18gb", pool={"1g.18gb": 2}, warm_now=1) is True
    assert keep_warm("1g.18gb", pool={"1g.18gb": 2}, warm_now=2) is False
    assert keep_warm("7g.141gb", pool={"1g.18gb": 2}, warm_now=0) is False


def test_mig_mode_policy() -> None:
    assert mig_toggle_needs_reset(8) is True and mig_toggle_needs_reset(9) is False
    assert should_disable_mig(remaining_instances=0, whole_gpu_claimed=True, needs_reset=False) is True
    assert should_disable_mig(remaining_instances=1, whole_gpu_claimed=True, needs_reset=False) is False
    assert should_disable_mig(remaining_instances=0, whole_gpu_claimed=False, needs_reset=False) is False
    assert should_disable_mig(remaining_instances=0, whole_gpu_claimed=True, needs_reset=True) is False
    assert (
        should_disable_mig(
            remaining_instances=0, whole_gpu_claimed=True, needs_reset=False, caller_asks=False
        )
        is False
    )


def _applied(
    command_id: str, start: int, *, action: str = "create", claim: str = "c1", gi: int = 7
) -> PartitionApplied:
    return PartitionApplied(
        key=NODE,
        command_id=command_id,
        node=NODE,
        action=action,  # type: ignore[arg-type]
        gpu_uuid=GPU,
        gpu_index=0,
        profile="1g.18gb",
        placement=MigPlacement(start=start, size=1),
        claim_uid=claim,
        mig_uuid=f"MIG-{start}",
        gpu_instance_id=gi,
        compute_instance_id=0 if gi >= 0 else -1,
        kept_warm=action == "destroy" and gi >= 0,
    )


def _allocated(uid: str, start: int | None) -> ClaimAllocated:
    device = AllocatedDevice(
        request="r",
        driver="gpu.tangram.dev",
        pool=NODE,
        device="d",
        gpu_index=0,
        gpu_uuid=GPU,
        profile="1g.18gb" if start is not None else None,
        placement=MigPlacement(start=start, size=1) if start is not None else None,
    )
    return ClaimAllocated(key=uid, namespace="ns", name=uid, uid=uid, node=NODE, devices=[device])


def _observed(start: int, *, cis: tuple[int, ...] = (0,), in_use: bool = False) -> ObservedInstance:
    return ObservedInstance(
        gpu_index=0,
        gpu_uuid=GPU,
        profile_id=19,
        profile="1g.18gb",
        placement=MigPlacement(start=start, size=1),
        gpu_instance_id=7 + start,
        compute_instance_ids=cis,
        mig_uuid=f"MIG-{start}" if cis else "",
        in_use=in_use,
    )


def test_ledger_folds_outcomes_claims_and_warm_instances() -> None:
    ledger = PartitionLedger(NODE)
    failed = PartitionFailed(
        key=NODE,
        command_id="x",
        node=NODE,
        action="create",
        gpu_uuid=GPU,
        profile="p",
        placement=MigPlacement(start=0, size=1),
        reason="r",
    )
    other_node = msgspec.structs.replace(_applied("z", 5), node="node-b")
    for event in (_allocated("c1", 0), _applied("a", 0), failed, other_node):
        ledger.observe(event)
    assert ledger.outcome("a") is not None and ledger.outcome("x") is failed and ledger.outcome("z") is None
    key0 = InstanceKey(GPU, 0, 1)
    assert ledger.owner(key0) == "c1"
    ledger.observe(ClaimReleased(key="c1", namespace="ns", name="c1", uid="c1"))
    assert ledger.owner(key0) is None and not ledger.is_live("c1")
    ledger.observe(_applied("keep", 0, action="destroy"))  # ids kept: warm
    assert ledger.is_warm(key0) and ledger.warm_counts()["1g.18gb"] == 1
    ledger.observe(_allocated("c2", 0))  # the allocator hands the warm instance out again
    assert not ledger.is_warm(key0) and ledger.owner(key0) == "c2"
    ledger.observe(_allocated("whole", None))
    assert ledger.whole_gpu_claimed(GPU)


def test_reconcile_sorts_instances() -> None:
    ledger = PartitionLedger(NODE)
    for event in (
        _allocated("live", 0),
        _applied("a", 0, claim="live"),
        _applied("b", 1, claim="gone"),
        _applied("c", 3, claim="live2"),
        _allocated("live2", 3),
    ):
        ledger.observe(event)
    ledger.observe(_applied("d", 4, claim="gone2"))
    ledger.observe(_applied("e", 4, action="destroy"))  # kept warm
    observed = [
        _observed(0),
        _observed(1),
        _observed(2, cis=()),
        _observed(4),
        _observed(5),
        _observed(6, in_use=True),
    ]
    findings = reconcile(observed, ledger)
    assert [(f.kind, f.key.start) for f in findings] == [
        ("adopted", 0),
        ("orphan", 1),
        ("empty", 2),
        ("warm", 4),
        ("foreign", 5),
        ("foreign", 6),
        ("missing", 3),
    ]
    assert findings[1].claim_uid == "gone"
    assert [f.key.start for f in to_clean(findings, "empty")] == [2]
    assert [f.key.start for f in to_clean(findings, "all")] == [1, 2]
    assert to_clean(findings, "none") == []


def _prepare_event(uid: str, *, done: bool = False) -> ClaimPrepared | ClaimUnprepared:
    if done:
        return ClaimUnprepared(key=NODE, node=NODE, namespace="ns", name=uid, uid=uid)
    return ClaimPrepared(key=NODE, node=NODE, namespace="ns", name=uid, uid=uid, devices=[])


def test_a_claim_kube_scheduler_allocated_owns_its_instance_from_prepare_to_unprepare() -> None:
    ledger = PartitionLedger(NODE)
    key = InstanceKey(GPU, 2, 1)
    ledger.observe(_applied("k-create", 2, claim="kube"))  # the node's own create for the claim
    assert ledger.owner(key) is None  # made, not yet prepared: nobody's
    ledger.observe(_prepare_event("kube"))
    assert ledger.owner(key) == "kube" and ledger.prepared_outside("kube")
    assert [f.kind for f in reconcile([_observed(2)], ledger)] == ["adopted"]  # a restart keeps it
    ledger.observe(_prepare_event("kube", done=True))
    assert ledger.owner(key) is None and not ledger.prepared_outside("kube")


def test_the_prepare_of_a_claim_the_allocator_decided_does_not_keep_it_alive() -> None:
    ledger = PartitionLedger(NODE)
    ledger.observe(_prepare_event("bus"))  # followed from another stream: may come first
    ledger.observe(_allocated("bus", 3))
    ledger.observe(_applied("b-create", 3, claim="bus"))
    assert ledger.owner(InstanceKey(GPU, 3, 1)) == "bus" and not ledger.prepared_outside("bus")
    ledger.observe(ClaimReleased(key="bus", namespace="ns", name="bus", uid="bus"))
    ledger.observe(_prepare_event("bus"))  # a late duplicate
    assert ledger.owner(InstanceKey(GPU, 3, 1)) is None
