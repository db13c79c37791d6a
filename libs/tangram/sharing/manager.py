"""The node's device sharing: an MPS control daemon per shared device from its first share to its
last, time-slicing shares recorded so a device is never shared both ways, and a whole GPU kept in
EXCLUSIVE_PROCESS while MPS runs on it, then given back the compute mode it had.

Every change is recorded before it is made, so whatever a crash interrupts, `recover` (from the
shares the node has prepared) or the next `release` finishes or undoes it. Calls run one at a time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from tangram.cdi.checkpoint import read_boot_id
from tangram.events.catalogue import DeviceShare, SharingStrategy
from tangram.kubernetes.objects.names import validate_claim_uid
from tangram.nvml.backend import NvmlBackend
from tangram.sharing import book
from tangram.sharing.computemode import DEFAULT, EXCLUSIVE_PROCESS, ComputeModes
from tangram.sharing.control import REAL_CONTROL_COMMAND, MpsControl
from tangram.sharing.daemons import Daemons, MpsDefaults
from tangram.sharing.devices import DeviceDirs, check_root, found_devices, is_whole_gpu
from tangram.sharing.records import DeviceRecord, Holding, SharingState
from tangram.sharing.state import CorruptState, StateStore

log = logging.getLogger(__name__)

STATE_FILE = "sharing-state.json"


class SharingError(RuntimeError):
    """Sharing could not be set up or taken down on some device; the message names each."""


class ShareGrant(msgspec.Struct, frozen=True, kw_only=True):
    """What a container needs for its share (the input of `tangram.cdi.shares.share_edits`)."""

    device_uuid: str
    strategy: SharingStrategy
    pipe_dir: str = ""  # the device's MPS pipe directory; "" for time-slicing


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    adopted: list[str] = field(default_factory=list)  # daemons found running and kept
    started: list[str] = field(default_factory=list)  # daemons started again
    stopped: list[str] = field(default_factory=list)  # daemons of devices with no share left
    failed: dict[str, str] = field(default_factory=dict)  # device -> what went wrong
    state_reset: bool = False  # the state file was unusable and was moved aside


class SharingManager:
    def __init__(
        self,
        nvml: NvmlBackend,
        *,
        root: Path,
        control_command: Sequence[str] = REAL_CONTROL_COMMAND,
        defaults: MpsDefaults | None = None,
        state_file: Path | None = None,
        boot_id: str | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        """`root` holds `<uuid>/pipe` and `<uuid>/log` of each device under MPS (and, unless
        `state_file` says otherwise, the state file); `control_command` is the MPS control program
        with its leading arguments."""
        self.root = check_root(root)
        self._store = StateStore(state_file or root / STATE_FILE)
        self._boot_id = boot_id if boot_id is not None else read_boot_id()
        self._modes = ComputeModes(nvml)
        control = MpsControl(argv=tuple(control_command), timeout_s=timeout_s)
        self._daemons = Daemons(control, defaults or MpsDefaults(), timeout_s, timeout_s)
        self._lock = asyncio.Lock()
        self._state: SharingState | None = None

    @property
    def state(self) -> SharingState:
        """The records as last written (empty before the first call)."""
        return self._state or SharingState(boot_id=self._boot_id)

    async def _loaded(self) -> SharingState:
        if self._state is None:
            recorded = await asyncio.to_thread(self._store.load)
            self._state = recorded or SharingState(boot_id=self._boot_id)
        return self._state

    async def _save(self, state: SharingState) -> None:
        await asyncio.to_thread(self._store.save, state)
        self._state = state

    # ---- acquire ---------------------------------------------------------------------------------

    async def acquire(self, claim_uid: str, device_uuid: str, share: DeviceShare) -> ShareGrant:
        """Give `claim_uid` its share of the device; idempotent. The first MPS share of a device
        starts its daemon (and puts a whole GPU in EXCLUSIVE_PROCESS). SharingConflict when the
        device is shared the other way."""
        holding = book.check_holding(Holding(claim_uid=claim_uid, device_uuid=device_uuid, share=share))
        async with self._lock:
            state = await self._loaded()
            updated = book.with_share(state, holding)
            if share.strategy == "TimeSlicing":
                if updated != state:
                    await self._save(updated)
                return ShareGrant(device_uuid=device_uuid, strategy="TimeSlicing")
            dirs = DeviceDirs(self.root, device_uuid)
            if book.first_share(state, device_uuid):
                await self._bring_up(dirs, updated)
            else:
                if updated != state:
                    await self._save(updated)
                await self._daemons.ensure(dirs)  # one that died since is started again
            return ShareGrant(device_uuid=device_uuid, strategy="MPS", pipe_dir=str(dirs.pipe))

    async def _bring_up(self, dirs: DeviceDirs, updated: SharingState) -> None:
        uuid = dirs.uuid
        if is_whole_gpu(uuid):
            current = await asyncio.to_thread(self._modes.get, uuid)
            updated = book.with_restore_mode(updated, uuid, current)
        await self._save(updated)  # recorded first: release or recover can undo what follows
        try:
            if is_whole_gpu(uuid):
                await asyncio.to_thread(self._modes.set, uuid, EXCLUSIVE_PROCESS)
            await self._daemons.ensure(dirs)
        except Exception:
            try:
                await self._take_down(uuid, updated.devices[uuid])
            except Exception:
                log.exception("could not undo the failed start of sharing on %s; recover will", uuid)
            else:
                await self._save(
                    SharingState(boot_id=updated.boot_id, devices=_without(updated.devices, uuid))
                )
            raise

    async def _take_down(self, uuid: str, record: DeviceRecord) -> bool:
        """Stop the device's daemon and give back its compute mode; True when a daemon ran."""
        if record.strategy != "MPS":
            return False
        stopped = await self._daemons.stop(DeviceDirs(self.root, uuid))
        if record.restore_compute_mode is not None:
            await asyncio.to_thread(self._modes.set, uuid, record.restore_compute_mode)
        return stopped

    # ---- release ---------------------------------------------------------------------------------

    async def release(self, claim_uid: str) -> list[str]:
        """Drop every share of `claim_uid`; idempotent. A device losing its last MPS share loses
        its daemon and gets its compute mode back. The devices left unshared."""
        validate_claim_uid(claim_uid)
        async with self._lock:
            state = await self._loaded()
            if claim_uid not in book.claims_of(state):
                return []
            emptied = book.emptied_by(state, claim_uid)
            failed: dict[str, str] = {}
            for uuid in emptied:
                try:
                    await self._take_down(uuid, state.devices[uuid])
                except Exception as error:
                    failed[uuid] = str(error)
            await self._save(book.without_claim(state, claim_uid, keep=failed))
            if failed:
                problems = "; ".join(f"{uuid}: {reason}" for uuid, reason in sorted(failed.items()))
                raise SharingError(f"releasing claim {claim_uid}: {problems}")
            return emptied

    # ---- recover ---------------------------------------------------------------------------------

    async def recover(self, prepared: Iterable[Holding]) -> RecoveryReport:
        """Make the node's sharing match the shares prepared now: adopt the daemons still running
        for them, start the missing ones, stop those with no share left and give their GPUs back
        their compute mode. Call it once at start, before acquire and release."""
        holdings = [book.check_holding(holding) for holding in prepared]
        async with self._lock:
            report = RecoveryReport()
            try:
                recorded = await asyncio.to_thread(self._store.load) or SharingState()
            except CorruptState as error:
                aside = await asyncio.to_thread(self._store.move_aside)
                log.error("sharing state unusable (%s), moved to %s; starting from the disk", error, aside)
                recorded, report = SharingState(), RecoveryReport(state_reset=True)
            found = await asyncio.to_thread(found_devices, self.root)
            plan = book.plan_recovery(recorded, holdings, found, self._boot_id)
            devices = dict(plan.state.devices)
            for uuid, record in plan.retire.items():
                try:
                    if await self._take_down(uuid, record):
                        report.stopped.append(uuid)
                except Exception as error:
                    report.failed[uuid] = str(error)
                    if uuid not in devices:
                        devices[uuid] = record  # kept, so the next recover tries again
            for uuid in plan.ensure:
                if is_whole_gpu(uuid) and devices[uuid].restore_compute_mode is None:
                    try:
                        devices[uuid] = await self._restore_mode_unrecorded(
                            uuid, devices[uuid], uuid in found
                        )
                    except Exception as error:
                        report.failed[uuid] = str(error)
            await self._save(SharingState(boot_id=self._boot_id, devices=devices))
            for uuid in plan.ensure:
                if uuid in report.failed:
                    continue
                try:
                    if is_whole_gpu(uuid):
                        await asyncio.to_thread(self._modes.set, uuid, EXCLUSIVE_PROCESS)
                    outcome = await self._daemons.ensure(DeviceDirs(self.root, uuid))
                except Exception as error:
                    report.failed[uuid] = str(error)
                    continue
                (report.adopted if outcome == "adopted" else report.started).append(uuid)
            for uuid, reason in report.failed.items():
                log.error("sharing on %s not recovered: %s", uuid, reason)
            return report

    async def _restore_mode_unrecorded(self, uuid: str, record: DeviceRecord, had_dirs: bool) -> DeviceRecord:
        """The mode to give back when none was recorded in this boot: the current one, unless the
        device's MPS directories are there (a record lost, not a first start) and the GPU is in
        EXCLUSIVE_PROCESS, which Tangram set; then DEFAULT, the mode a GPU boots with."""
        current = await asyncio.to_thread(self._modes.get, uuid)
        if had_dirs and current == EXCLUSIVE_PROCESS:
            log.warning("%s: no compute mode recorded for it; DEFAULT will be given back", uuid)
            current = DEFAULT
        return DeviceRecord(strategy=record.strategy, shares=record.shares, restore_compute_mode=current)


def _without(devices: dict[str, DeviceRecord], uuid: str) -> dict[str, DeviceRecord]:
    return {key: record for key, record in devices.items() if key != uuid}
