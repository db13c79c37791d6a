"""Partition commands of one node, applied through the executor: one operation at a time per GPU,
GPUs in parallel, each command id answered once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import pynvml

from services.partitioner import results
from tangram.bus import Poison, Retry
from tangram.events import (
    ClaimAllocated,
    ClaimFailed,
    ClaimReleased,
    Event,
    MigPlacement,
    NodeHardware,
    NodeInventory,
    PartitionApplied,
    PartitionRequested,
    subject_token,
)
from tangram.partitioning import (
    CleanMode,
    CreatedInstance,
    Finding,
    InstanceKey,
    InstanceNotFound,
    MigExecutor,
    PartitionError,
    PartitionLedger,
    PartitionResult,
    keep_warm,
    nvml_error_name,
    reconcile,
    should_disable_mig,
    to_clean,
)
from tangram.partitioning.metrics import (
    FAILURES,
    INSTANCES,
    ORPHANS,
    RECONFIGURE_SECONDS,
    WAITING_FOR_RELEASE,
)

log = logging.getLogger("tangram.partitioner")

Publish = Callable[[Event], Awaitable[object]]
_INSUFFICIENT = nvml_error_name(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)


@dataclass
class _GpuSlot:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    pending: int = 0  # commands for this GPU being worked on or waiting for the lock
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def finished(self) -> None:
        self.pending -= 1
        self.changed.set()
        self.changed = asyncio.Event()


class Partitioner:
    def __init__(
        self,
        *,
        node: str,
        executor: MigExecutor,
        ledger: PartitionLedger,
        read_hardware: Callable[[], NodeHardware],
        publish: Publish,
        producer: str,
        warm_pool: Mapping[str, int] | None = None,
        claim_release_wait_s: float = 2.0,
        stop: asyncio.Event | None = None,
        log_lag_s: float = 120.0,
    ) -> None:
        self.node = node
        self.executor = executor
        self.ledger = ledger
        self._read_hardware = read_hardware
        self._publish = publish
        self._producer = producer
        self._warm_pool = dict(warm_pool or {})
        self._claim_release_wait_s = claim_release_wait_s
        self._stop = stop or asyncio.Event()
        # How long a command waits for a release the allocator must have logged before it (a NATS
        # outage delays the log); past it, the claim is taken to be really live and the command refused.
        self._log_lag_s = log_lag_s
        self._slots: dict[str, _GpuSlot] = {}
        self._in_flight: dict[str, asyncio.Event] = {}
        self._inventory_dirty = asyncio.Event()
        self._log_changed = asyncio.Event()
        self._generation = 0
        self._cleanups: set[asyncio.Task[None]] = set()

    def observe(self, event: Event) -> None:
        """Folds an event of the log (the follow's handler) and wakes commands waiting on it."""
        orphans = self._orphans_of(event)
        self.ledger.observe(event)
        self._log_changed.set()
        self._log_changed = asyncio.Event()
        for made in orphans:
            self._remove_later(made)

    def _orphans_of(self, event: Event) -> list[PartitionApplied]:
        """Instances made for a claim by commands its decision does not name: an allocator that
        died between sending a claim's commands and its decision decides again after restart,
        maybe elsewhere; what the first commands made belongs to no one."""
        if not isinstance(event, ClaimAllocated | ClaimFailed | ClaimReleased):
            return []
        if isinstance(event, ClaimAllocated):
            named = set(event.partitions) if event.node == self.node else set()
        else:
            allocation = self.ledger.allocation(event.uid)
            named = set(allocation.partitions) if allocation is not None else set()
        return [made for made in self.ledger.created_for(event.uid) if made.command_id not in named]

    def _orphan_now(self, made: PartitionApplied) -> bool:
        """A create that finished after its claim's decision or end was read, and that the
        decision does not name (the decision was read while the create ran)."""
        allocation = self.ledger.allocation(made.claim_uid)
        if allocation is not None:
            return made.command_id not in allocation.partitions
        return self.ledger.has_ended(made.claim_uid)

    def _remove_later(self, made: PartitionApplied) -> None:
        task = asyncio.create_task(self._remove_orphan(made))
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def close(self) -> None:
        for task in list(self._cleanups):
            task.cancel()
        await asyncio.gather(*self._cleanups, return_exceptions=True)

    async def _remove_orphan(self, made: PartitionApplied) -> None:
        key = InstanceKey.of(made.gpu_uuid, made.placement)
        observed = await asyncio.to_thread(self.executor.find, made.gpu_uuid, made.placement)
        if observed is None or observed.mig_uuid != made.mig_uuid or observed.in_use:
            return
        reason = (
            f"{made.profile} {made.mig_uuid} made for claim {made.claim_uid} by a command its "
            "decision does not name"
        )
        try:
            await self._clean(Finding("orphan", key, reason, made.claim_uid, observed))
        except Exception:
            log.exception(
                "orphan instance not removed; the next start's reconciliation will",
                extra={"mig_uuid": made.mig_uuid},
            )

    def _slot(self, gpu_uuid: str) -> _GpuSlot:
        return self._slots.setdefault(gpu_uuid, _GpuSlot())

    # ---- commands ---------------------------------------------------------------------------------------

    async def handle(self, event: Event) -> None:
        """The consumer's handler: return to ack; Poison for what can never be a command of this node."""
        if not isinstance(event, PartitionRequested):
            raise Poison(f"{event.type_name()} is not a partition command")
        if event.node != self.node:
            raise Poison(f"command {event.command_id} is for node {event.node!r}, this is {self.node!r}")
        if self.ledger.outcome(event.command_id) is not None:
            log.info("command already answered", extra={"command_id": event.command_id})
            return
        running = self._in_flight.get(event.command_id)
        if running is not None:
            await running.wait()
            if self.ledger.outcome(event.command_id) is None:
                raise Retry(f"command {event.command_id}: the first delivery did not finish")
            return
        done = self._in_flight[event.command_id] = asyncio.Event()
        slot = self._slot(event.gpu_uuid)
        slot.pending += 1
        try:
            result = await self._apply(event, slot)
            await self._publish(result)
            self.ledger.record(result)
            self._account(event, result)
            if (
                isinstance(result, PartitionApplied)
                and result.action == "create"
                and self._orphan_now(result)
            ):
                self._remove_later(result)
        finally:
            slot.finished()
            done.set()
            del self._in_flight[event.command_id]

    def _account(self, command: PartitionRequested, result: PartitionResult) -> None:
        if isinstance(result, PartitionApplied):
            RECONFIGURE_SECONDS.labels(command.action).observe(result.duration_ms / 1000)
            self._inventory_dirty.set()
            log.info(
                "partition applied",
                extra={
                    "command_id": command.command_id,
                    "action": command.action,
                    "mig_uuid": result.mig_uuid,
                },
            )
        else:
            FAILURES.labels(command.action, result.nvml_error or "none").inc()
            log.warning(
                "partition failed",
                extra={
                    "command_id": command.command_id,
                    "nvml_error": result.nvml_error,
                    "reason": result.reason,
                },
            )

    async def _apply(self, command: PartitionRequested, slot: _GpuSlot) -> PartitionResult:
        started = time.perf_counter()
        try:
            if command.action == "create":
                return await self._create(command, slot, started)
            if command.action == "disable-mig":
                return await self._disable_mig(command, slot, started)
            return await self._destroy(command, slot, started)
        except PartitionError as exc:
            return results.failed(command, exc, producer=self._producer)

    @staticmethod
    def _ms(started: float) -> float:
        return round((time.perf_counter() - started) * 1000, 3)

    async def _create(self, command: PartitionRequested, slot: _GpuSlot, started: float) -> PartitionResult:
        uid = command.claim_uid
        if uid and not await self._awaited_decision(uid, command):
            raise PartitionError(
                f"claim {uid} is decided without command {command.command_id} (sent before the "
                "allocator restarted and decided again), has ended, or may have ended and been "
                "forgotten (the command is older than a deleted claim forgotten since): nothing is created"
            )
        for attempt in range(2):
            async with slot.lock:
                try:
                    made = await self._create_locked(command)
                    return results.created(command, made, producer=self._producer, ms=self._ms(started))
                except PartitionError as exc:
                    # A destroy fetched by another worker may free these slices: let it run first.
                    if exc.nvml_error != _INSUFFICIENT or slot.pending <= 1 or attempt:
                        raise
            while slot.pending > 1:
                await slot.changed.wait()
        raise AssertionError("unreachable")

    async def _create_locked(self, command: PartitionRequested) -> CreatedInstance:
        executor = self.executor
        key = InstanceKey.of(command.gpu_uuid, command.placement)
        await self._clear_released(command)
        existing = await asyncio.to_thread(executor.find, command.gpu_uuid, command.placement)
        if existing is not None:
            owner = self.ledger.owner(key)
            if existing.empty and owner is None:
                log.warning(
                    "removing a GPU instance without compute instance", extra={"gpu_uuid": key.gpu_uuid}
                )
                await asyncio.to_thread(executor.destroy, command.gpu_uuid, placement=command.placement)
            elif (
                existing.profile_id == command.profile_id
                and not existing.empty
                and owner in (None, command.claim_uid)
                and (owner == command.claim_uid or not existing.in_use)
            ):
                # Created by an earlier delivery whose result was lost, or kept warm: reuse it.
                if command.claim_uid:
                    self.ledger.adopt(key, command.claim_uid)
                return await asyncio.to_thread(executor.describe, existing)
            else:
                holder = (
                    f"claim {owner}" if owner else ("running processes" if existing.in_use else "no claim")
                )
                raise PartitionError(
                    f"slices {key.start}+{key.size} of GPU {key.gpu_uuid} hold {existing.profile} "
                    f"{existing.mig_uuid or '(no compute instance)'} ({holder})",
                    nvml_error=_INSUFFICIENT,
                )
        return await asyncio.to_thread(
            executor.create, command.gpu_uuid, command.profile_id, command.placement
        )

    async def _clear_released(self, command: PartitionRequested) -> None:
        """Make room for a create among instances of claims that are gone.

        The allocator creates only on slices it has freed: a claim still holding them here is one
        whose release this node has not read yet (after a NATS outage the log can lag), so it is
        waited for. An instance Tangram made for a claim that is gone, still there because its
        destroy command has not arrived (a redelivery after an outage comes late), is destroyed
        now instead of failing the new claim; its destroy then finds nothing left to do.
        """
        executor = self.executor
        for instance in await asyncio.to_thread(executor.observe, command.gpu_uuid):
            if not instance.overlaps(command.placement):
                continue
            key = InstanceKey.of(command.gpu_uuid, instance.placement)
            owner = self.ledger.owner(key)
            if owner is not None and owner != command.claim_uid:
                await self._wait_until_released(owner, why=f"create {command.command_id}")
                owner = self.ledger.owner(key)
            created = self.ledger.created(key)
            made_for = created.claim_uid if created is not None else ""
            released_leftover = (
                owner is None
                and made_for not in ("", command.claim_uid)
                and not self.ledger.is_warm(key)
                and not instance.in_use
                and (instance.placement != command.placement or instance.profile_id != command.profile_id)
            )
            if released_leftover:
                log.info(
                    "destroying a released claim's instance in the way of a create",
                    extra={"gpu_uuid": key.gpu_uuid, "mig_uuid": instance.mig_uuid, "claim": made_for},
                )
                with contextlib.suppress(InstanceNotFound):
                    await asyncio.to_thread(executor.destroy, command.gpu_uuid, placement=instance.placement)

    async def _destroy(self, command: PartitionRequested, slot: _GpuSlot, started: float) -> PartitionResult:
        key = InstanceKey.of(command.gpu_uuid, command.placement)
        owner = self.ledger.owner(key)
        if owner is not None and owner == command.claim_uid and not self.ledger.prepared_outside(owner):
            # The allocator destroys a claim's instance only once it has freed the claim: the
            # release is in the log (or about to be), only not read here yet.
            await self._wait_until_released(owner, why=f"destroy {command.command_id}")
        owner = await self._wait_for_release(key, command.claim_uid)
        if owner is not None:
            raise PartitionError(
                f"the {command.profile} instance at slices {key.start}+{key.size} of GPU {key.gpu_uuid} "
                f"belongs to live claim {owner}"
            )
        executor = self.executor
        async with slot.lock:
            existing = await asyncio.to_thread(executor.find, command.gpu_uuid, command.placement)
            if existing is None:
                return results.destroyed(command, None, producer=self._producer, ms=self._ms(started))
            if command.mig_uuid and existing.mig_uuid and existing.mig_uuid != command.mig_uuid:
                raise PartitionError(
                    f"slices {key.start}+{key.size} of GPU {key.gpu_uuid} hold {existing.mig_uuid}, "
                    f"not {command.mig_uuid} named by the command",
                    nvml_error=nvml_error_name(pynvml.NVML_ERROR_NOT_FOUND),
                )
            warm_now = self.ledger.warm_counts()[existing.profile]
            if (
                not existing.empty
                and not existing.in_use
                and keep_warm(existing.profile, pool=self._warm_pool, warm_now=warm_now)
            ):
                instance = await asyncio.to_thread(executor.describe, existing)
                log.info("instance kept warm instead of destroyed", extra={"mig_uuid": instance.mig_uuid})
                return results.kept(command, instance, producer=self._producer, ms=self._ms(started))
            try:
                gone = await asyncio.to_thread(
                    executor.destroy, command.gpu_uuid, placement=command.placement
                )
            except InstanceNotFound:
                gone = None
            await self._maybe_disable_mig(command.gpu_uuid)
            return results.destroyed(command, gone, producer=self._producer, ms=self._ms(started))

    async def _disable_mig(
        self, command: PartitionRequested, slot: _GpuSlot, started: float
    ) -> PartitionResult:
        """A whole-GPU claim landed on a GPU in MIG mode: turn MIG off, touching no instance."""
        executor = self.executor
        async with slot.lock:
            if not await asyncio.to_thread(executor.mig_enabled, command.gpu_uuid):
                return results.mig_disabled(command, producer=self._producer, ms=self._ms(started))
            if await asyncio.to_thread(executor.needs_reset, command.gpu_uuid):
                raise PartitionError(
                    f"GPU {command.gpu_uuid} needs a GPU reset to leave MIG mode",
                    nvml_error=nvml_error_name(pynvml.NVML_ERROR_RESET_REQUIRED),
                )
            await self._clear_released(command)  # the command's placement spans the whole GPU
            left = await asyncio.to_thread(executor.observe, command.gpu_uuid)
            if left:
                held = ", ".join(
                    f"{o.profile} at slices {o.placement.start}+{o.placement.size}" for o in left
                )
                raise PartitionError(
                    f"GPU {command.gpu_uuid} still has MIG instances ({held}); MIG mode stays on",
                    nvml_error=nvml_error_name(pynvml.NVML_ERROR_IN_USE),
                )
            await asyncio.to_thread(executor.disable_mig, command.gpu_uuid)
            return results.mig_disabled(command, producer=self._producer, ms=self._ms(started))

    async def _wait_until_released(self, claim_uid: str, *, why: str) -> None:
        """Until this node's view of the log no longer holds the claim live (at most `log_lag_s`);
        at stop, Retry: the command is redelivered to the next process."""
        with WAITING_FOR_RELEASE.track_inprogress():
            await self._until_released(claim_uid, why=why)

    async def _until_released(self, claim_uid: str, *, why: str) -> None:
        waited = time.monotonic()
        warned = waited
        while self.ledger.is_live(claim_uid) and time.monotonic() - waited < self._log_lag_s:
            if self._stop.is_set():
                raise Retry(f"{why}: stopping before the release of claim {claim_uid} was read")
            changed = asyncio.ensure_future(self._log_changed.wait())
            stopping = asyncio.ensure_future(self._stop.wait())
            try:
                await asyncio.wait(
                    {changed, stopping},
                    timeout=min(5.0, self._log_lag_s),
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                for waiter in (changed, stopping):
                    waiter.cancel()
                await asyncio.gather(changed, stopping, return_exceptions=True)
            if time.monotonic() - warned >= 30.0:
                warned = time.monotonic()
                log.warning(
                    "still waiting to read a claim's release",
                    extra={"claim": claim_uid, "for": why, "waited_s": round(warned - waited, 1)},
                )

    def _decided_with(self, claim_uid: str, command: PartitionRequested) -> bool:
        """The claim's decision, as this node has read it, names the command (or the claim is the
        node's own, decided outside the allocator, and has not ended: nor, the command being older
        than a claim forgotten since, may it have ended and been forgotten)."""
        allocation = self.ledger.allocation(claim_uid)
        if allocation is not None:
            return command.command_id in allocation.partitions
        return not self.ledger.has_ended(claim_uid) and not self.ledger.may_have_forgotten(command.time)

    async def _awaited_decision(self, claim_uid: str, command: PartitionRequested) -> bool:
        """Whether the claim is decided with the command, its decision waited for a moment: the
        command and the decision come on different streams, and a claim that failed once (for
        capacity, or while its preemption went on) is decided again with the command on its way."""
        deadline = time.monotonic() + self._claim_release_wait_s
        while not self._decided_with(claim_uid, command):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._log_changed.wait(), remaining)
            except TimeoutError:
                return False
        return True

    async def _wait_for_release(self, key: InstanceKey, releasing: str) -> str | None:
        """The live claim holding the instance; a release on its way through the log is waited for.

        A claim kube-scheduler allocated stays live until its node has unprepared it, and the node
        sends the destroy of its instance before saying so: that claim may destroy its own.
        """
        deadline = time.monotonic() + self._claim_release_wait_s
        while (owner := self.ledger.owner(key)) is not None:
            if owner == releasing and self.ledger.prepared_outside(owner):
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                await asyncio.wait_for(self._log_changed.wait(), remaining)
            except TimeoutError:
                break
        return owner

    async def _maybe_disable_mig(self, gpu_uuid: str) -> None:
        remaining = len(await asyncio.to_thread(self.executor.observe, gpu_uuid))
        needs_reset = await asyncio.to_thread(self.executor.needs_reset, gpu_uuid)
        if should_disable_mig(
            remaining_instances=remaining,
            whole_gpu_claimed=self.ledger.whole_gpu_claimed(gpu_uuid),
            needs_reset=needs_reset,
        ) and await asyncio.to_thread(self.executor.disable_mig, gpu_uuid):
            log.info("MIG mode disabled for a whole-GPU claim", extra={"gpu_uuid": gpu_uuid})

    # ---- start-up reconciliation ---------------------------------------------------------------------------

    async def reconcile(self, mode: CleanMode) -> list[Finding]:
        observed = await asyncio.to_thread(self.executor.observe_all)
        findings = reconcile(observed, self.ledger)
        for finding in findings:
            ORPHANS.labels(finding.kind).inc()
            if finding.kind == "adopted":
                self.ledger.adopt(finding.key, finding.claim_uid)
            level = logging.INFO if finding.kind in ("adopted", "warm", "foreign") else logging.WARNING
            log.log(level, "reconcile: %s", finding.reason, extra={"finding": finding.kind})
        for finding in to_clean(findings, mode):
            await self._clean(finding)
        await self.publish_inventory()
        return findings

    async def _clean(self, finding: Finding) -> None:
        key = finding.key
        placement = MigPlacement(start=key.start, size=key.size)
        async with self._slot(key.gpu_uuid).lock:
            if finding.observed is not None and finding.observed.mig_uuid:
                # Found outside the lock: another command may have replaced it since.
                now = await asyncio.to_thread(self.executor.find, key.gpu_uuid, placement)
                if now is None or now.mig_uuid != finding.observed.mig_uuid:
                    return
            try:
                gone = await asyncio.to_thread(self.executor.destroy, key.gpu_uuid, placement=placement)
            except PartitionError as exc:
                log.error("reconcile: cannot clean %s: %s", finding.reason, exc.reason)
                return
        log.warning("reconcile: destroyed %s", finding.reason)
        created = self.ledger.created(key)
        if finding.kind == "orphan" and created is not None:
            command = PartitionRequested(
                key=subject_token(self.node),
                command_id=f"reconcile-{gone.mig_uuid or created.mig_uuid}",
                node=self.node,
                action="destroy",
                gpu_uuid=key.gpu_uuid,
                gpu_index=gone.gpu_index,
                profile=gone.profile,
                profile_id=finding.observed.profile_id if finding.observed else -1,
                placement=placement,
                claim_uid=finding.claim_uid,
            )
            result = results.destroyed(command, gone, producer=self._producer, ms=0.0)
            await self._publish(result)
            self.ledger.record(result)

    # ---- inventory ---------------------------------------------------------------------------------------

    async def publish_inventory(self) -> None:
        self._inventory_dirty.clear()
        hardware = await asyncio.to_thread(self._read_hardware)
        # Monotonic across restarts, so the newest publication of any process wins.
        self._generation = max(self._generation + 1, time.time_ns() // 1_000_000)
        await self._publish(
            NodeInventory(
                key=subject_token(self.node),
                producer=self._producer,
                hardware=hardware,
                generation=self._generation,
            )
        )
        INSTANCES.clear()
        counts: dict[str, int] = {}
        for gpu in hardware.gpus:
            for instance in gpu.mig_instances:
                counts[instance.profile] = counts.get(instance.profile, 0) + 1
        for profile, count in counts.items():
            INSTANCES.labels(profile).set(count)

    async def inventory_loop(self, stop: asyncio.Event) -> None:
        """Publishes the inventory after changes, coalescing bursts; a last one at stop if due."""
        while not stop.is_set():
            waiters = [asyncio.create_task(self._inventory_dirty.wait()), asyncio.create_task(stop.wait())]
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()
                await asyncio.gather(*waiters, return_exceptions=True)
            if self._inventory_dirty.is_set():
                try:
                    await self.publish_inventory()
                except Exception:
                    log.exception("inventory publication failed; retrying with the next change")
