"""Decisions of the sharing manager, on its records alone. Pure: no processes, files or NVML.

One device is shared one way: all its shares are MPS, or all are time-slicing. A device under MPS
has one control daemon from its first share to its last; a whole GPU under MPS also has its
compute mode to give back.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from tangram.kubernetes.objects.names import validate_claim_uid
from tangram.sharing.devices import validate_device_uuid
from tangram.sharing.records import DeviceRecord, Holding, SharingState

STRATEGIES = ("MPS", "TimeSlicing")


class SharingConflict(ValueError):
    """A share that cannot join its device: the device is already shared the other way."""


def check_holding(holding: Holding) -> Holding:
    """`holding` if its names and limits can be used; ValueError naming the problem otherwise."""
    validate_claim_uid(holding.claim_uid)
    validate_device_uuid(holding.device_uuid)
    share = holding.share
    if share.strategy not in STRATEGIES:
        raise ValueError(f"share {share.id}: unknown sharing strategy {share.strategy!r}")
    percent = share.compute_percent
    if isinstance(percent, bool) or not isinstance(percent, int) or not 1 <= percent <= 100:
        raise ValueError(f"share {share.id}: compute_percent must be an integer from 1 to 100")
    if (
        isinstance(share.memory_bytes, bool)
        or not isinstance(share.memory_bytes, int)
        or share.memory_bytes < 0
    ):
        raise ValueError(f"share {share.id}: memory_bytes must be a non-negative integer")
    return holding


def with_share(state: SharingState, holding: Holding) -> SharingState:
    """`state` with `holding` added (or kept, when the claim holds it already)."""
    check_holding(holding)
    uuid, claim, share = holding.device_uuid, holding.claim_uid, holding.share
    record = state.devices.get(uuid)
    if record is not None and record.shares and record.strategy != share.strategy:
        holders = ", ".join(sorted(record.shares))
        raise SharingConflict(
            f"device {uuid} is shared by {record.strategy} (claims {holders}): "
            f"a {share.strategy} share of claim {claim} cannot join it"
        )
    shares = {**(record.shares if record else {}), claim: share.id}
    restore = record.restore_compute_mode if record else None
    updated = DeviceRecord(strategy=share.strategy, shares=shares, restore_compute_mode=restore)
    return SharingState(boot_id=state.boot_id, devices={**state.devices, uuid: updated})


def first_share(state: SharingState, device_uuid: str) -> bool:
    """True when `device_uuid` has no share yet: the next one starts what sharing needs."""
    record = state.devices.get(device_uuid)
    return record is None or not record.shares


def with_restore_mode(state: SharingState, device_uuid: str, mode: int) -> SharingState:
    """Remember the compute mode to give back, unless one is remembered already (set by Tangram,
    the current mode is not the one to give back)."""
    record = state.devices[device_uuid]
    if record.restore_compute_mode is not None:
        return state
    updated = DeviceRecord(strategy=record.strategy, shares=record.shares, restore_compute_mode=mode)
    return SharingState(boot_id=state.boot_id, devices={**state.devices, device_uuid: updated})


def emptied_by(state: SharingState, claim_uid: str) -> list[str]:
    """The devices on which `claim_uid` holds the last share."""
    return sorted(uuid for uuid, record in state.devices.items() if set(record.shares) == {claim_uid})


def without_claim(state: SharingState, claim_uid: str, *, keep: Iterable[str] = ()) -> SharingState:
    """`state` with every share of `claim_uid` gone, except on the devices in `keep`; a device
    left without shares is dropped."""
    kept = set(keep)
    devices: dict[str, DeviceRecord] = {}
    for uuid, record in state.devices.items():
        if uuid in kept or claim_uid not in record.shares:
            devices[uuid] = record
            continue
        shares = {claim: share for claim, share in record.shares.items() if claim != claim_uid}
        if shares:
            devices[uuid] = DeviceRecord(
                strategy=record.strategy, shares=shares, restore_compute_mode=record.restore_compute_mode
            )
    return SharingState(boot_id=state.boot_id, devices=devices)


def claims_of(state: SharingState) -> set[str]:
    return {claim for record in state.devices.values() for claim in record.shares}


@dataclass(frozen=True, slots=True)
class RecoveryPlan:
    state: SharingState  # what holds once the plan is carried out
    retire: dict[str, DeviceRecord] = field(default_factory=dict)  # stop, give back, clean up
    ensure: list[str] = field(default_factory=list)  # MPS devices whose daemon must run


def plan_recovery(
    recorded: SharingState, prepared: Iterable[Holding], found: Iterable[str], boot_id: str
) -> RecoveryPlan:
    """From what was recorded, what the node has prepared now and the device directories found on
    disk: the state to hold, the devices to retire and the MPS devices to run a daemon for.

    A compute mode recorded in another boot is not given back: the GPU came up in the mode the
    boot gave it, and that is the mode it has now.
    """
    same_boot = recorded.boot_id == boot_id
    desired = SharingState(boot_id=boot_id)
    for holding in prepared:
        desired = with_share(desired, holding)
    devices = dict(desired.devices)
    for uuid, record in desired.devices.items():
        before = recorded.devices.get(uuid)
        if same_boot and before is not None and before.strategy == "MPS" == record.strategy:
            devices[uuid] = DeviceRecord(
                strategy="MPS", shares=record.shares, restore_compute_mode=before.restore_compute_mode
            )
    on_disk = {validate_device_uuid(uuid) for uuid in found}
    retire: dict[str, DeviceRecord] = {}
    for uuid in sorted(set(recorded.devices) | on_disk):
        before = recorded.devices.get(uuid)
        had_mps = uuid in on_disk or (before is not None and before.strategy == "MPS")
        wanted = devices.get(uuid)
        if wanted is not None and (wanted.strategy == "MPS") == had_mps:
            continue  # kept as it is: a daemon is adopted or started again below
        if before is not None and before.strategy == "MPS":
            restore = before.restore_compute_mode if same_boot else None
            retire[uuid] = DeviceRecord(strategy="MPS", shares=before.shares, restore_compute_mode=restore)
        else:
            retire[uuid] = (
                before if before is not None and uuid not in on_disk else DeviceRecord(strategy="MPS")
            )
    ensure = sorted(uuid for uuid, record in devices.items() if record.strategy == "MPS")
    return RecoveryPlan(state=SharingState(boot_id=boot_id, devices=devices), retire=retire, ensure=ensure)
