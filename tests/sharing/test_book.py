"""The sharing manager's decisions, on records alone."""

from __future__ import annotations

import pytest

from tangram.events.catalogue import DeviceShare
from tangram.kubernetes.objects.names import InvalidName
from tangram.sharing import book
from tangram.sharing.devices import InvalidDeviceUuid
from tangram.sharing.records import DeviceRecord, Holding, SharingState

GPU = "GPU-6f1c2a4e-51b9-4d2e-9a57-7e0c3b8d1f26"
GPU2 = "GPU-0d4f5c1a-7b2e-4c3d-8e9f-a1b2c3d4e5f6"
MIG = "MIG-0b7c0b8e-2f5a-5c5e-8f63-2c3c3a1d9e11"
A, B, C = "claim-a", "claim-b", "claim-c"
MPS = DeviceShare(id="s-mps", strategy="MPS", compute_percent=50, memory_bytes=1024**3)
TS = DeviceShare(id="s-ts", strategy="TimeSlicing")


def _hold(claim: str, device: str, share: DeviceShare) -> Holding:
    return Holding(claim_uid=claim, device_uuid=device, share=share)


def _state(*holdings: Holding, boot: str = "boot-1") -> SharingState:
    state = SharingState(boot_id=boot)
    for holding in holdings:
        state = book.with_share(state, holding)
    return state


def test_shares_of_one_strategy_join_a_device_and_adding_twice_changes_nothing() -> None:
    state = _state(_hold(A, GPU, MPS), _hold(B, GPU, MPS))
    assert state.devices[GPU] == DeviceRecord(strategy="MPS", shares={A: "s-mps", B: "s-mps"})
    assert book.with_share(state, _hold(A, GPU, MPS)) == state
    assert book.first_share(state, GPU2) and not book.first_share(state, GPU)


@pytest.mark.parametrize(
    ("held", "joining", "message"),
    [
        (
            TS,
            MPS,
            f"device {GPU} is shared by TimeSlicing \\(claims claim-a\\): a MPS share of claim claim-b",
        ),
        (
            MPS,
            TS,
            f"device {GPU} is shared by MPS \\(claims claim-a\\): a TimeSlicing share of claim claim-b",
        ),
    ],
)
def test_a_device_is_never_shared_both_ways(held: DeviceShare, joining: DeviceShare, message: str) -> None:
    state = _state(_hold(A, GPU, held))
    with pytest.raises(book.SharingConflict, match=message):
        book.with_share(state, _hold(B, GPU, joining))
    with pytest.raises(book.SharingConflict):
        book.with_share(state, _hold(A, GPU, joining))  # not even by the same claim
    assert book.with_share(state, _hold(B, GPU2, joining)).devices[GPU2].strategy == joining.strategy


def test_restore_mode_is_remembered_once_and_kept_while_shares_come_and_go() -> None:
    state = book.with_restore_mode(_state(_hold(A, GPU, MPS)), GPU, 2)
    assert book.with_restore_mode(state, GPU, 3).devices[GPU].restore_compute_mode == 2
    state = book.with_share(state, _hold(B, GPU, MPS))
    state = book.without_claim(state, A)
    assert state.devices[GPU] == DeviceRecord(strategy="MPS", shares={B: "s-mps"}, restore_compute_mode=2)


def test_release_finds_the_devices_a_claim_empties() -> None:
    state = _state(_hold(A, GPU, MPS), _hold(B, GPU, MPS), _hold(A, GPU2, TS), _hold(A, MIG, MPS))
    assert book.emptied_by(state, A) == [GPU2, MIG]
    assert book.emptied_by(state, C) == []
    after = book.without_claim(state, A)
    assert set(after.devices) == {GPU} and after.devices[GPU].shares == {B: "s-mps"}
    kept = book.without_claim(state, A, keep=[MIG])
    assert set(kept.devices) == {GPU, MIG} and kept.devices[MIG].shares == {A: "s-mps"}
    assert book.claims_of(after) == {B}


@pytest.mark.parametrize(
    ("holding", "error", "match"),
    [
        (_hold("../etc", GPU, MPS), InvalidName, "claim uid"),
        (_hold(A, "GPU-../../etc", MPS), InvalidDeviceUuid, "device UUID"),
        (_hold(A, "MIG-GPU-6f1c2a4e-51b9-4d2e-9a57-7e0c3b8d1f26/1/0", MPS), InvalidDeviceUuid, "device UUID"),
        (_hold(A, "GPU-" + GPU[4:].upper(), MPS), InvalidDeviceUuid, "device UUID"),
        (_hold(A, "6f1c2a4e-51b9-4d2e-9a57-7e0c3b8d1f26", MPS), InvalidDeviceUuid, "device UUID"),
        (_hold(A, GPU, DeviceShare(id="s", compute_percent=0)), ValueError, "compute_percent"),
        (_hold(A, GPU, DeviceShare(id="s", compute_percent=101)), ValueError, "compute_percent"),
        (_hold(A, GPU, DeviceShare(id="s", memory_bytes=-1)), ValueError, "memory_bytes"),
        (_hold(A, GPU, DeviceShare(id="s", strategy="Bogus")), ValueError, "unknown sharing strategy"),  # type: ignore[arg-type]
    ],
)
def test_refused_holdings(holding: Holding, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        book.with_share(SharingState(), holding)


def test_recovery_keeps_prepared_devices_and_their_recorded_modes() -> None:
    recorded = book.with_restore_mode(_state(_hold(A, GPU, MPS), _hold(B, GPU2, TS)), GPU, 2)
    plan = book.plan_recovery(recorded, [_hold(A, GPU, MPS), _hold(B, GPU2, TS)], [GPU], "boot-1")
    assert plan.state == recorded
    assert (plan.retire, plan.ensure) == ({}, [GPU])


def test_recovery_retires_devices_without_prepared_shares() -> None:
    recorded = book.with_restore_mode(
        _state(_hold(A, GPU, MPS), _hold(B, GPU, MPS), _hold(C, GPU2, TS)), GPU, 2
    )
    plan = book.plan_recovery(recorded, [], [GPU, MIG], "boot-1")
    assert plan.state == SharingState(boot_id="boot-1")
    assert plan.retire == {
        GPU: DeviceRecord(strategy="MPS", shares={A: "s-mps", B: "s-mps"}, restore_compute_mode=2),
        GPU2: DeviceRecord(strategy="TimeSlicing", shares={C: "s-ts"}),
        MIG: DeviceRecord(strategy="MPS"),  # directories of an unrecorded daemon
    }
    assert plan.ensure == []


def test_recovery_after_a_reboot_gives_back_no_recorded_mode() -> None:
    recorded = book.with_restore_mode(_state(_hold(A, GPU, MPS), _hold(B, GPU2, MPS)), GPU, 2)
    recorded = book.with_restore_mode(recorded, GPU2, 2)
    plan = book.plan_recovery(recorded, [_hold(A, GPU, MPS)], [], "boot-2")
    assert plan.state.boot_id == "boot-2"
    assert plan.state.devices[GPU].restore_compute_mode is None  # read again from the GPU
    assert plan.retire[GPU2].restore_compute_mode is None
    assert plan.ensure == [GPU]


def test_recovery_switches_a_device_whose_prepared_shares_use_the_other_strategy() -> None:
    recorded = _state(_hold(A, GPU, MPS), _hold(B, GPU2, TS))
    plan = book.plan_recovery(recorded, [_hold(C, GPU, TS), _hold(C, GPU2, MPS)], [GPU], "boot-1")
    assert plan.retire == {GPU: recorded.devices[GPU], GPU2: recorded.devices[GPU2]}
    assert plan.state.devices[GPU].strategy == "TimeSlicing"
    assert plan.ensure == [GPU2]


def test_recovery_refuses_prepared_shares_that_conflict() -> None:
    with pytest.raises(book.SharingConflict):
        book.plan_recovery(SharingState(), [_hold(A, GPU, MPS), _hold(B, GPU, TS)], [], "boot-1")
