"""NodePrepareResources / NodeUnprepareResources without the transport: idempotent, per-claim locked,
checkpointed, and recoverable after a crash at any step."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from tangram.cdi.checkpoint import CheckpointedClaim, CheckpointStore, CorruptCheckpoint
from tangram.cdi.devices import ClaimRef, ResolvedAllocation
from tangram.cdi.names import InvalidName, validate_claim_uid
from tangram.cdi.spec import cdi_device_id
from tangram.cdi.validation import InvalidCdiSpec
from tangram.cdi.writer import CdiSpecWriter
from tangram.events import ClaimPrepared, ClaimUnprepared, PreparedDevice, subject_token
from tangram.imex import ImexDomains, ImexError
from tangram.kubelet.allocations import AllocationSource, AllocationUnavailable
from tangram.sharing import (
    Holding,
    InvalidDeviceUuid,
    MpsControlError,
    SharingConflict,
    SharingError,
    SharingManager,
)

log = logging.getLogger(__name__)

ClaimEvent = ClaimPrepared | ClaimUnprepared
EventSink = Callable[[ClaimEvent], Awaitable[None]]


class StatusReporter(Protocol):
    """Tells the claim's readers what was prepared (in Kubernetes, the claim's status.devices).
    A report, not a step of preparing: it must not raise, and must return within a few seconds."""

    async def prepared(self, allocation: ResolvedAllocation) -> object: ...

    async def unprepared(self, claim: ClaimRef) -> object: ...


@dataclass(frozen=True)
class PrepareOutcome:
    """One claim's answer: devices, or an error kubelet reports and retries."""

    devices: list[PreparedDevice] = field(default_factory=list)
    error: str = ""


@dataclass
class _ClaimLock:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


@dataclass(frozen=True)
class RecoveryReport:
    """What start-up found and did; also logged."""

    checkpoint: str  # "missing", "loaded", "corrupt", "rebooted"
    kept: int = 0
    rewritten: int = 0
    removed: int = 0


class ClaimPreparer:
    def __init__(
        self,
        *,
        node: str,
        source: AllocationSource,
        writer: CdiSpecWriter,
        checkpoint: CheckpointStore,
        resolve_timeout_s: float,
        on_event: EventSink | None = None,
        producer: str = "cdi",
        sharing: SharingManager | None = None,
        imex: ImexDomains | None = None,
        status: StatusReporter | None = None,
    ) -> None:
        self.node = node
        self._status = status
        self._sharing = sharing
        self._imex = imex
        self._source = source
        self._writer = writer
        self._checkpoint = checkpoint
        self._resolve_timeout_s = resolve_timeout_s
        self._on_event = on_event
        self._producer = producer
        self._claims: dict[str, CheckpointedClaim] = {}
        self._locks: dict[str, _ClaimLock] = {}
        self._node_key = subject_token(node)

    @property
    def prepared_claims(self) -> dict[str, ResolvedAllocation]:
        return {uid: c.allocation for uid, c in self._claims.items() if c.state == "prepared"}

    @property
    def reports_status(self) -> bool:
        return self._status is not None

    # --- start-up -------------------------------------------------------------------------------

    async def recover(self) -> RecoveryReport:
        """Make the checkpoint and the CDI directory agree before serving kubelet, then the shared
        devices' daemons agree with the prepared shares."""
        report = await asyncio.to_thread(self._recover_blocking)
        if self._sharing is not None:
            await self._sharing.recover(self._holdings())
        if self._imex is not None:
            await self._imex.recover(
                {
                    uid: c.allocation.imex
                    for uid, c in self._claims.items()
                    if c.state == "prepared" and c.allocation.imex is not None
                }
            )
        log.info(
            "checkpoint %s: kept %d prepared claims, rewrote %d specs, removed %d specs",
            report.checkpoint,
            report.kept,
            report.rewritten,
            report.removed,
        )
        return report

    def _recover_blocking(self) -> RecoveryReport:
        self._writer.ensure_dir()
        try:
            body = self._checkpoint.load()
        except CorruptCheckpoint as error:
            aside = self._checkpoint.move_aside()
            log.error("%s; moved it to %s and rebuilt prepared claims from the CDI specs", error, aside)
            return self._rebuild_from_specs("corrupt")
        if body is None:
            return self._rebuild_from_specs("missing")
        if body.boot_id != self._checkpoint.boot_id:
            # Devices, MIG instances and their minors from before the reboot are gone.
            removed = sum(self._writer.remove(uid) for uid in self._writer.claim_uids_on_disk())
            self._claims = {}
            self._checkpoint.write_now(self._claims)
            return RecoveryReport(checkpoint="rebooted", removed=removed)
        return self._reconcile(body.claims)

    def _holdings(self) -> list[Holding]:
        return [
            Holding(claim_uid=uid, device_uuid=device.visible_uuid, share=device.share)
            for uid, claim in self._claims.items()
            if claim.state == "prepared"
            for device in claim.allocation.devices
            if device.share is not None
        ]

    def _rebuild_from_specs(self, status: str) -> RecoveryReport:
        claims: dict[str, CheckpointedClaim] = {}
        removed = 0
        for uid in self._writer.claim_uids_on_disk():
            try:
                claims[uid] = CheckpointedClaim(state="prepared", allocation=self._writer.read(uid))
            except (OSError, ValueError) as error:
                log.warning("removing unreadable CDI spec of claim %s: %s", uid, error)
                removed += self._writer.remove(uid)
        self._claims = claims
        self._checkpoint.write_now(claims)
        return RecoveryReport(checkpoint=status, kept=len(claims), removed=removed)

    def _reconcile(self, recorded: dict[str, CheckpointedClaim]) -> RecoveryReport:
        claims: dict[str, CheckpointedClaim] = {}
        rewritten = removed = 0
        for uid, claim in recorded.items():
            if claim.state == "preparing":
                # Kubelet never got an answer for it and will ask again: start from a clean slate.
                removed += self._writer.remove(uid)
                continue
            if not self._writer.exists(uid):
                self._writer.write(claim.allocation)
                rewritten += 1
            claims[uid] = claim
        for uid in self._writer.claim_uids_on_disk():
            if uid not in claims:
                removed += self._writer.remove(uid)
        self._claims = claims
        self._checkpoint.write_now(claims)
        return RecoveryReport(checkpoint="loaded", kept=len(claims), rewritten=rewritten, removed=removed)

    # --- kubelet calls --------------------------------------------------------------------------

    async def prepare(self, claims: Iterable[ClaimRef]) -> dict[str, PrepareOutcome]:
        unique = {claim.uid: claim for claim in claims}
        outcomes = await asyncio.gather(*(self._prepare_guarded(claim) for claim in unique.values()))
        return dict(zip(unique, outcomes, strict=True))

    async def unprepare(self, claims: Iterable[ClaimRef]) -> dict[str, str]:
        unique = {claim.uid: claim for claim in claims}
        errors = await asyncio.gather(*(self._unprepare_guarded(claim) for claim in unique.values()))
        return dict(zip(unique, errors, strict=True))

    @contextlib.asynccontextmanager
    async def _claim_lock(self, uid: str) -> AsyncIterator[None]:
        entry = self._locks.setdefault(uid, _ClaimLock())
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if entry.users == 0:
                del self._locks[uid]

    async def _prepare_guarded(self, claim: ClaimRef) -> PrepareOutcome:
        try:
            validate_claim_uid(claim.uid)
            started = time.perf_counter()
            async with self._claim_lock(claim.uid):
                allocation, fresh = await self._prepare_locked(claim)
                finished = time.perf_counter()
                # under the claim's lock, so that an unprepare's removal cannot come before it
                await self._report(allocation)
            outcome = PrepareOutcome(devices=self._prepared_devices(allocation))
        except (InvalidName, AllocationUnavailable, InvalidCdiSpec) as error:
            log.warning("claim %s/%s (%s) not prepared: %s", claim.namespace, claim.name, claim.uid, error)
            return PrepareOutcome(error=str(error))
        except Exception as error:
            log.exception("claim %s/%s (%s) not prepared", claim.namespace, claim.name, claim.uid)
            return PrepareOutcome(error=f"internal error while preparing: {error}")
        if fresh:
            duration_ms = (finished - started) * 1000
            await self._emit(
                ClaimPrepared(
                    key=self._node_key,
                    producer=self._producer,
                    node=self.node,
                    namespace=claim.namespace,
                    name=claim.name,
                    uid=claim.uid,
                    devices=outcome.devices,
                    duration_ms=duration_ms,
                )
            )
        return outcome

    async def _prepare_locked(self, claim: ClaimRef) -> tuple[ResolvedAllocation, bool]:
        known = self._claims.get(claim.uid)
        if known is not None and known.state == "prepared":
            if not await asyncio.to_thread(self._writer.exists, claim.uid):
                await asyncio.to_thread(self._writer.write, known.allocation)
            return known.allocation, False
        allocation = await self._source.resolve(claim, timeout_s=self._resolve_timeout_s)
        if allocation.claim.uid != claim.uid:
            raise AllocationUnavailable(f"allocation source answered for claim {allocation.claim.uid}")
        spec = self._writer.render(allocation)  # refuse a bad spec before anything is recorded
        await self._share(allocation)
        try:
            await self._join_domain(allocation)
        except BaseException:
            if self._sharing is not None:
                await asyncio.shield(self._sharing.release(claim.uid))
            raise
        self._claims[claim.uid] = CheckpointedClaim(state="preparing", allocation=allocation)
        await self._checkpoint.save(self._claims)
        try:
            await asyncio.to_thread(self._writer.write, allocation, spec)
        except BaseException:
            self._claims.pop(claim.uid, None)
            await asyncio.shield(self._checkpoint.save(self._claims))
            if self._sharing is not None:
                await asyncio.shield(self._sharing.release(claim.uid))
            if self._imex is not None:
                await asyncio.shield(self._imex.leave(claim.uid))
            raise
        self._claims[claim.uid] = CheckpointedClaim(state="prepared", allocation=allocation)
        await self._checkpoint.save(self._claims)
        return allocation, True

    async def _share(self, allocation: ResolvedAllocation) -> None:
        """Start (or join) the control daemon of each shared device before its spec is written."""
        shares = [d for d in allocation.devices if d.share is not None]
        if not shares:
            return
        if self._sharing is None:
            raise AllocationUnavailable(
                f"claim {allocation.claim.uid} holds a share of {shares[0].device}, but device sharing "
                "is not configured on this node"
            )
        try:
            for device in shares:
                assert device.share is not None
                await self._sharing.acquire(allocation.claim.uid, device.visible_uuid, device.share)
        except (SharingError, SharingConflict, MpsControlError, InvalidDeviceUuid, LookupError) as error:
            await self._sharing.release(allocation.claim.uid)
            raise AllocationUnavailable(f"the share of {device.device} cannot be prepared: {error}") from None

    async def _join_domain(self, allocation: ResolvedAllocation) -> None:
        """The IMEX daemon of the claim's NVLink domain serving on this node before its spec (with
        the domain's channel) is written."""
        grant = allocation.imex
        if grant is None:
            return
        if self._imex is None:
            raise AllocationUnavailable(
                f"claim {allocation.claim.uid} is in NVLink domain {grant.domain}, but IMEX is not "
                "configured on this node"
            )
        try:
            await self._imex.join(allocation.claim.uid, grant)
        except ImexError as error:
            raise AllocationUnavailable(str(error)) from None

    def _prepared_devices(self, allocation: ResolvedAllocation) -> list[PreparedDevice]:
        kind = self._writer.kind
        return [
            PreparedDevice(
                request=device.request,
                pool=device.pool,
                device=device.device,
                cdi_device_ids=[cdi_device_id(kind, allocation.claim.uid, device.device)],
                share_id=device.share.id if device.share is not None else "",
            )
            for device in allocation.devices
        ]

    async def _unprepare_guarded(self, claim: ClaimRef) -> str:
        try:
            validate_claim_uid(claim.uid)
            async with self._claim_lock(claim.uid):
                known = await self._unprepare_locked(claim)
                # whether or not this node knew the claim: entries it wrote before a reboot go too
                await self._report_gone(claim)
        except InvalidName as error:
            log.warning("claim %s not unprepared: %s", claim.uid, error)
            return str(error)
        except Exception as error:
            log.exception("claim %s/%s (%s) not unprepared", claim.namespace, claim.name, claim.uid)
            return f"internal error while unpreparing: {error}"
        if known:
            await self._emit(
                ClaimUnprepared(
                    key=self._node_key,
                    producer=self._producer,
                    node=self.node,
                    namespace=claim.namespace,
                    name=claim.name,
                    uid=claim.uid,
                )
            )
        return ""

    async def _unprepare_locked(self, claim: ClaimRef) -> bool:
        # Spec first, then what preparing made, record last: a crash in between leaves a record
        # whose spec is rewritten on restart, and kubelet, which got no answer, asks again.
        await asyncio.to_thread(self._writer.remove, claim.uid)
        known = self._claims.get(claim.uid)
        if known is None:
            return False
        await self._source.release(known.allocation)
        if self._sharing is not None:
            # the device's daemon stops after its last share; its compute mode is restored
            await self._sharing.release(claim.uid)
        if self._imex is not None:
            # the domain's IMEX daemon stops after its last claim on the node
            await self._imex.leave(claim.uid)
        del self._claims[claim.uid]
        await self._checkpoint.save(self._claims)
        return True

    async def refresh_status(self) -> None:
        """Report every prepared claim again (after the node's GPU health changed, or at start)."""
        if self._status is None:
            return
        for uid in list(self._claims):
            async with self._claim_lock(uid):
                known = self._claims.get(uid)
                if known is not None and known.state == "prepared":
                    await self._report(known.allocation)

    async def _report(self, allocation: ResolvedAllocation) -> None:
        if self._status is None:
            return
        try:
            await self._status.prepared(allocation)
        except Exception:
            # the devices are ready whatever becomes of the report
            log.exception("could not report the status of claim %s", allocation.claim.uid)

    async def _report_gone(self, claim: ClaimRef) -> None:
        if self._status is None:
            return
        try:
            await self._status.unprepared(claim)
        except Exception:
            log.exception("could not report claim %s unprepared", claim.uid)

    async def _emit(self, event: ClaimEvent) -> None:
        if self._on_event is None:
            return
        try:
            await self._on_event(event)
        except Exception:
            # The claim is prepared on the node whatever happens to the notification.
            log.exception("could not publish %s for claim %s", event.type_name(), event.uid)
