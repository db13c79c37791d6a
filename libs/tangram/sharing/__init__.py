"""Sharing one GPU or MIG device among several claims on a node: MPS control daemons, compute mode,
and the record that lets a restarted node pick up where it was."""

from tangram.sharing.book import SharingConflict
from tangram.sharing.control import (
    REAL_CONTROL_COMMAND,
    SIMULATED_CONTROL_COMMAND,
    MpsControl,
    MpsControlError,
)
from tangram.sharing.daemons import MpsDefaults
from tangram.sharing.devices import DeviceDirs, InvalidDeviceUuid, validate_device_uuid
from tangram.sharing.manager import RecoveryReport, ShareGrant, SharingError, SharingManager
from tangram.sharing.records import DeviceRecord, Holding, SharingState
from tangram.sharing.state import CorruptState, StateStore

__all__ = [
    "REAL_CONTROL_COMMAND",
    "SIMULATED_CONTROL_COMMAND",
    "CorruptState",
    "DeviceDirs",
    "DeviceRecord",
    "Holding",
    "InvalidDeviceUuid",
    "MpsControl",
    "MpsControlError",
    "MpsDefaults",
    "RecoveryReport",
    "ShareGrant",
    "SharingConflict",
    "SharingError",
    "SharingManager",
    "SharingState",
    "StateStore",
    "validate_device_uuid",
]
