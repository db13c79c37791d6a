"""The chaos invariant that no slice is held twice: shares of one share host are one holding,
never a share beside an exclusive claim or a share of an overlapping device."""

from __future__ import annotations

from tangram.chaos.invariants import overlapping_allocations
from tangram.events import AllocatedDevice, ClaimAllocated, ClaimReleased, DeviceShare, MigPlacement

DRIVER = "gpu.tangram.dev"


def allocated(
    uid: str, device: str, *, start: int | None = None, size: int = 2, shared: bool = False
) -> ClaimAllocated:
    return ClaimAllocated(
        key=uid,
        namespace="ml",
        name=uid,
        uid=uid,
        node="n1",
        devices=[
            AllocatedDevice(
                request="r",
                driver=DRIVER,
                pool="n1",
                device=device,
                gpu_index=0,
                gpu_uuid="GPU-0",
                placement=None if start is None else MigPlacement(start=start, size=size),
                share=DeviceShare(id=f"id-{uid}") if shared else None,
            )
        ],
    )


def test_shares_of_one_host_are_no_overlap() -> None:
    log = [allocated("a", "gpu-0-shared", shared=True), allocated("b", "gpu-0-shared", shared=True)]
    assert overlapping_allocations(log) == []


def test_a_share_beside_an_exclusive_claim_is_an_overlap() -> None:
    log = [allocated("a", "gpu-0-shared", shared=True), allocated("b", "gpu-0")]
    assert overlapping_allocations(log) == ["b and a both hold GPU ('n1', 0) slices {0, 1, 2, 3, 4, 5, 6, 7}"]


def test_shares_of_overlapping_hosts_are_an_overlap_until_one_is_released() -> None:
    whole = allocated("a", "gpu-0-shared", shared=True)
    mig = allocated("b", "gpu-0-mig-2g-35gb-2-shared", start=2, shared=True)
    assert overlapping_allocations([whole, mig]) == ["b and a both hold GPU ('n1', 0) slices {2, 3}"]
    released = ClaimReleased(key="a", namespace="ml", name="a", uid="a")
    assert overlapping_allocations([whole, released, mig]) == []


def test_a_decision_after_the_claims_deletion_holds_nothing() -> None:
    """The claims stream can hold a claim's deletion before a decision the allocator made before it
    read that deletion: the decision holds no slice."""
    gone = ClaimReleased(key="a", namespace="ml", name="a", uid="a", deleted=True)
    assert overlapping_allocations([gone, allocated("a", "gpu-0"), allocated("b", "gpu-0")]) == []
    deallocated = ClaimReleased(key="a", namespace="ml", name="a", uid="a")
    assert overlapping_allocations([deallocated, allocated("a", "gpu-0"), allocated("b", "gpu-0")]) == [
        "b and a both hold GPU ('n1', 0) slices {0, 1, 2, 3, 4, 5, 6, 7}"
    ]
