"""The sharing manager's records: which claims hold shares of which device, and what to give
back. Plain data, shared by the decisions (`book`) and the state file (`state`)."""

from __future__ import annotations

import msgspec

from tangram.events.catalogue import DeviceShare, SharingStrategy


class Holding(msgspec.Struct, frozen=True, kw_only=True):
    """One claim's share of one device: what the kubelet plugin prepared."""

    claim_uid: str
    device_uuid: str
    share: DeviceShare


class DeviceRecord(msgspec.Struct, frozen=True, kw_only=True):
    strategy: SharingStrategy
    shares: dict[str, str] = {}  # claim uid -> share id
    # A whole GPU under MPS: its compute mode before Tangram set EXCLUSIVE_PROCESS; None otherwise.
    restore_compute_mode: int | None = None


class SharingState(msgspec.Struct, frozen=True, kw_only=True):
    boot_id: str = ""
    devices: dict[str, DeviceRecord] = {}  # device UUID -> record
