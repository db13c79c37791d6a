"""Partition commands through the Partitioner (results collected in place of the bus)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pynvml
import pytest

from tangram.bus import Poison
from tangram.events import (
    AllocatedDevice,
    ClaimAllocated,
    ClaimFailed,
    MigPlacement,
    NodeInventory,
    PartitionApplied,
    PartitionFailed,
)
from tangram.nvml import calls
from tangram.partitioning import MigExecutor, PartitionLedger
from tests.partitioner.helpers import MINORS, NODE, Collected, command, gpu_uuid, partitioner, sim


def _results(collected: Collected) -> list[PartitionApplied | PartitionFailed]:
    return [e for e in collected.events if isinstance(e, PartitionApplied | PartitionFailed)]


async def test_create_publishes_applied_with_the_instance() -> None:
    nvml = sim("hgx-h200")
    collected = Collected()
    p = partitioner(nvml, collected)
    await p.handle(command("c-1", nvml, gpu=2, profile="3g.71gb", profile_id=9, start=4, size=4))
    [applied] = _results(collected)
    assert isinstance(applied, PartitionApplied)
    assert (applied.event_id, applied.command_id, applied.action, applied.node) == (
        "c-1-result",
        "c-1",
        "create",
        NODE,
    )
    assert (applied.gpu_uuid, applied.gpu_index, applied.profile) == (gpu_uuid(nvml, 2), 2, "3g.71gb")
    assert (applied.gpu_instance_id, applied.compute_instance_id) == (2, 0)
    assert (applied.gi_cap_minor, applied.ci_cap_minor) == (3 + 2 * 135 + 2 * 9, 3 + 2 * 135 + 2 * 9 + 1)
    assert applied.claim_uid == "claim-1" and applied.mig_uuid.startswith("MIG-")
    assert p.ledger.outcome("c-1") == applied


async def test_overlap_gives_a_clean_failure_event() -> None:
    nvml = sim("hgx-h200")  # GPU 0: 3g.71gb at 0, 1g.18gb at 4
    collected = Collected()
    await partitioner(nvml, collected).handle(
        command("c-2", nvml, gpu=0, profile="2g.35gb", profile_id=14, start=2, size=2)
    )
    [failed] = _results(collected)
    assert isinstance(failed, PartitionFailed)
    assert failed.nvml_error == "NVML_ERROR_INSUFFICIENT_RESOURCES"
    assert failed.event_id == "c-2-result" and failed.action == "create"
    assert failed.placement == MigPlacement(start=2, size=2)
    assert "creating 2g.35gb at slices 2+2" in failed.reason and "taken by another instance" in failed.reason


async def test_same_placement_taken_by_another_claim_is_refused() -> None:
    nvml = sim("dgx-h100")
    collected = Collected()
    p = partitioner(nvml, collected)
    p.observe(_allocated("claim-1", nvml, 1, start=0, size=2, partitions=("c-a",)))
    await p.handle(command("c-a", nvml, gpu=1, profile="2g.20gb", profile_id=14, start=0, size=2))
    await p.handle(
        command("c-b", nvml, gpu=1, profile="2g.20gb", profile_id=14, start=0, size=2, claim_uid="claim-2")
    )
    applied, failed = _results(collected)
    assert isinstance(applied, PartitionApplied) and isinstance(failed, PartitionFailed)
    assert failed.nvml_error == "NVML_ERROR_INSUFFICIENT_RESOURCES"
    assert "(claim claim-1)" in failed.reason


async def test_duplicate_command_is_applied_once() -> None:
    nvml = sim("dgx-h100")
    collected = Collected()
    p = partitioner(nvml, collected)
    request = command("dup", nvml, gpu=0, profile="1g.10gb", profile_id=19, start=3, size=1)
    await asyncio.gather(p.handle(request), p.handle(request))
    await p.handle(request)
    [applied] = _results(collected)
    assert len(MigExecutor(nvml, minors=MINORS).observe(0)) == 1
    # A restarted partitioner that folded the result from the log does nothing either.
    ledger = PartitionLedger(NODE)
    ledger.observe(applied)
    again = Collected()
    await partitioner(nvml, again, ledger=ledger).handle(request)
    assert again.events == []


async def test_result_lost_before_publish_is_answered_from_the_existing_instance() -> None:
    nvml = sim("dgx-h100")
    made = MigExecutor(nvml, minors=MINORS).create(0, 14, MigPlacement(start=2, size=2))
    collected = Collected()
    await partitioner(nvml, collected).handle(
        command("lost", nvml, gpu=0, profile="2g.20gb", profile_id=14, start=2, size=2)
    )
    [applied] = _results(collected)
    assert isinstance(applied, PartitionApplied)
    assert (applied.mig_uuid, applied.gpu_instance_id) == (made.mig_uuid, made.gpu_instance_id)
    assert len(MigExecutor(nvml, minors=MINORS).observe(0)) == 1


async def test_destroy_in_use_is_refused_with_in_use() -> None:
    nvml = sim("hgx-h200")
    collected = Collected()
    p = partitioner(nvml, collected)
    nvml.sim_attach_process(0, gpu_instance_id=1, compute_instance_id=0)  # the 3g.71gb at 0
    await p.handle(
        command(
            "d-1",
            nvml,
            action="destroy",
            gpu=0,
            profile="3g.71gb",
            profile_id=9,
            start=0,
            size=4,
            claim_uid="",
        )
    )
    [failed] = _results(collected)
    assert isinstance(failed, PartitionFailed)
    assert (failed.nvml_error, failed.action) == ("NVML_ERROR_IN_USE", "destroy")
    assert "compute processes run on it" in failed.reason
    assert len(MigExecutor(nvml, minors=MINORS).observe(0)) == 2


async def test_destroy_of_an_instance_held_by_a_live_claim_is_refused() -> None:
    nvml = sim("dgx-h100")
    collected = Collected()
    p = partitioner(nvml, collected)
    p.observe(_allocated("claim-1", nvml, 0, start=0, size=4, partitions=("c",)))
    await p.handle(command("c", nvml, profile="3g.40gb", profile_id=9, start=0, size=4))
    await p.handle(command("d", nvml, action="destroy", profile="3g.40gb", profile_id=9, start=0, size=4))
    failed = _results(collected)[-1]
    assert isinstance(failed, PartitionFailed)
    assert failed.reason.endswith("belongs to live claim claim-1") and failed.nvml_error == ""


async def test_destroy_then_other_instances_unchanged_and_inventory_published() -> None:
    nvml = sim("hgx-h200")
    collected = Collected()
    p = partitioner(nvml, collected)
    before = {o.placement.start: o for o in MigExecutor(nvml, minors=MINORS).observe(0)}
    await p.handle(command("c", nvml, gpu=0, profile="1g.35gb", profile_id=15, start=6, size=2, claim_uid=""))
    await p.handle(
        command(
            "d",
            nvml,
            action="destroy",
            gpu=0,
            profile="2g.35gb",
            profile_id=14,
            start=6,
            size=2,
            claim_uid="",
        )
    )
    created, destroyed = _results(collected)
    assert isinstance(created, PartitionApplied) and isinstance(destroyed, PartitionApplied)
    assert (destroyed.action, destroyed.mig_uuid, destroyed.gpu_instance_id) == (
        "destroy",
        created.mig_uuid,
        -1,
    )
    after = {o.placement.start: o for o in MigExecutor(nvml, minors=MINORS).observe(0)}
    assert after == before
    await p.publish_inventory()
    [inventory] = collected.of(NodeInventory)
    assert isinstance(inventory, NodeInventory)
    assert [(m.profile, m.placement.start) for m in inventory.hardware.gpus[0].mig_instances] == [
        ("3g.71gb", 0),
        ("1g.18gb", 4),
    ]


async def test_warm_pool_keeps_freed_instances_up_to_the_count() -> None:
    nvml = sim("dgx-h100")
    collected = Collected()
    p = partitioner(nvml, collected, warm_pool={"1g.10gb": 1})
    for start in (0, 1):
        await p.handle(command(f"c{start}", nvml, profile="1g.10gb", profile_id=19, start=start, size=1))
    for start in (0, 1):
        await p.handle(
            command(
                f"d{start}", nvml, action="destroy", profile="1g.10gb", profile_id=19, start=start, size=1
            )
        )
    kept, gone = _results(collected)[2:]
    assert isinstance(kept, PartitionApplied) and isinstance(gone, PartitionApplied)
    assert (kept.action, kept.gpu_instance_id, kept.compute_instance_id) == ("destroy", 7, 0)
    assert (gone.action, gone.gpu_instance_id) == ("destroy", -1)
    assert [o.placement.start for o in MigExecutor(nvml, minors=MINORS).observe(0)] == [0]
    # A create for the kept instance's exact placement reuses it.
    await p.handle(command("again", nvml, profile="1g.10gb", profile_id=19, start=0, size=1, claim_uid="c9"))
    reused = _results(collected)[-1]
    assert isinstance(reused, PartitionApplied) and reused.mig_uuid == kept.mig_uuid


async def test_whole_gpu_claim_turns_mig_off_after_the_last_instance() -> None:
    nvml = sim("dgx-h100")
    collected = Collected()
    p = partitioner(nvml, collected)
    await p.handle(command("c", nvml, gpu=7, profile="7g.80gb", profile_id=0, start=0, size=8))
    p.observe(_allocated("whole", nvml, 7, start=None, size=0))
    await p.handle(
        command("d", nvml, action="destroy", gpu=7, profile="7g.80gb", profile_id=0, start=0, size=8)
    )
    assert nvml.nvmlDeviceGetMigMode(nvml.nvmlDeviceGetHandleByIndex(7))[0] == pynvml.NVML_DEVICE_MIG_DISABLE


async def test_commands_for_another_node_are_poison() -> None:
    nvml = sim("dgx-h100")
    p = partitioner(nvml, Collected())
    with pytest.raises(Poison, match="is for node 'node-b'"):
        await p.handle(command("x", nvml, profile="1g.10gb", profile_id=19, start=0, size=1, node="node-b"))


async def test_restart_after_crash_between_gpu_and_compute_instance_leaves_nothing(tmp_path: Path) -> None:
    state = tmp_path / "node.json"
    first = sim("dgx-h100", state)
    collected = Collected()
    # The process creating it dies after the GPU instance and before the compute instance.
    first.nvmlDeviceSetMigMode(first.nvmlDeviceGetHandleByIndex(0), pynvml.NVML_DEVICE_MIG_ENABLE)
    calls.create_gpu_instance(first, first.nvmlDeviceGetHandleByIndex(0), 9, 0, 4)
    # ... and a create whose compute instance fails is rolled back by the executor.
    first.sim_fail_next("nvmlGpuInstanceCreateComputeInstance", pynvml.NVML_ERROR_UNKNOWN)
    await partitioner(first, collected).handle(
        command("x", first, profile="3g.40gb", profile_id=9, start=4, size=4)
    )
    assert isinstance(_results(collected)[0], PartitionFailed)
    restarted = sim("dgx-h100", state)
    p = partitioner(restarted, collected)
    findings = await p.reconcile("empty")
    assert [(f.kind, f.key.start) for f in findings] == [("empty", 0)]
    assert MigExecutor(restarted, minors=MINORS).observe(0) == []
    inventory = collected.of(NodeInventory)[-1]
    assert isinstance(inventory, NodeInventory) and inventory.hardware.gpus[0].mig_instances == []
    # The redelivered command now succeeds on the freed slices.
    await p.handle(command("y", restarted, profile="3g.40gb", profile_id=9, start=0, size=4))
    assert isinstance(_results(collected)[-1], PartitionApplied)


def _allocated(
    uid: str, nvml: object, gpu: int, *, start: int | None, size: int, partitions: tuple[str, ...] = ()
) -> ClaimAllocated:
    device = AllocatedDevice(
        request="r",
        driver="gpu.tangram.dev",
        pool=NODE,
        device="d",
        gpu_index=gpu,
        gpu_uuid=gpu_uuid(nvml, gpu),  # type: ignore[arg-type]
        placement=None if start is None else MigPlacement(start=start, size=size),
    )
    return ClaimAllocated(
        key=uid, namespace="ns", name=uid, uid=uid, node=NODE, devices=[device], partitions=list(partitions)
    )


async def test_disable_mig_turns_mig_off_on_an_empty_gpu_and_is_idempotent() -> None:
    nvml = sim("hgx-h200")
    executor = MigExecutor(nvml, minors=MINORS)
    made = executor.create(3, 19, MigPlacement(start=0, size=1))  # MIG on for GPU 3 ...
    executor.destroy(3, placement=made.placement)  # ... and empty again
    collected = Collected()
    p = partitioner(nvml, collected)
    off = command("off-1", nvml, action="disable-mig", gpu=3, profile="", profile_id=-1, start=0, size=8)
    await p.handle(off)
    await p.handle(
        command("off-2", nvml, action="disable-mig", gpu=3, profile="", profile_id=-1, start=0, size=8)
    )
    first, second = _results(collected)
    assert isinstance(first, PartitionApplied) and isinstance(second, PartitionApplied)
    assert (first.action, first.command_id, second.command_id) == ("disable-mig", "off-1", "off-2")
    assert executor.mig_enabled(3) is False


async def test_disable_mig_refuses_while_instances_remain_and_touches_none() -> None:
    nvml = sim("hgx-h200")  # GPU 0: 3g.71gb at 0, 1g.18gb at 4
    executor = MigExecutor(nvml, minors=MINORS)
    before = [o.mig_uuid for o in executor.observe(0)]
    collected = Collected()
    await partitioner(nvml, collected).handle(
        command("off-0", nvml, action="disable-mig", gpu=0, profile="", profile_id=-1, start=0, size=8)
    )
    [failed] = _results(collected)
    assert isinstance(failed, PartitionFailed)
    assert failed.nvml_error == "NVML_ERROR_IN_USE"
    assert "still has MIG instances (3g.71gb at slices 0+4, 1g.18gb at slices 4+1)" in failed.reason
    assert executor.mig_enabled(0) is True
    assert [o.mig_uuid for o in executor.observe(0)] == before


async def test_a_claim_that_failed_first_and_was_allocated_later_gets_its_instance_made() -> None:
    # a claim fails for want of capacity (or waits for its preemption), then is allocated: its MIG
    # create must not be refused as though the claim had ended
    nvml = sim("hgx-h200")
    collected = Collected()
    ledger = PartitionLedger(NODE)
    p = partitioner(nvml, collected, ledger=ledger)
    ledger.observe(
        ClaimFailed(key="claim-1", namespace="ns", name="claim-1", uid="claim-1", reason="0/1 nodes fit")
    )
    assert ledger.has_ended("claim-1")
    create = command("c-9", nvml, gpu=2, profile="1g.18gb", profile_id=19, start=0, size=1)
    ledger.observe(_allocated("claim-1", nvml, 2, start=0, size=1, partitions=("c-9",)))
    assert not ledger.has_ended("claim-1")
    await p.handle(create)
    [applied] = _results(collected)
    assert isinstance(applied, PartitionApplied) and applied.claim_uid == "claim-1"


async def test_a_create_that_comes_before_the_decision_naming_it_waits_for_that_decision() -> None:
    # the claim failed once (waiting for its preemption); the create of its new decision arrives on
    # the node's stream before that decision arrives on the claims stream
    nvml = sim("hgx-h200")
    collected = Collected()
    p = partitioner(nvml, collected, claim_release_wait_s=30.0)
    p.observe(
        ClaimFailed(key="claim-1", namespace="ns", name="claim-1", uid="claim-1", reason="0/1 nodes fit")
    )
    create = command("c-9", nvml, gpu=2, profile="1g.18gb", profile_id=19, start=0, size=1)
    handling = asyncio.create_task(p.handle(create))
    await asyncio.sleep(0)
    assert not handling.done() and _results(collected) == []
    p.observe(_allocated("claim-1", nvml, 2, start=0, size=1, partitions=("c-9",)))
    await asyncio.wait_for(handling, 10)
    [applied] = _results(collected)
    assert isinstance(applied, PartitionApplied) and applied.claim_uid == "claim-1"


async def test_a_create_for_a_claim_decided_without_it_is_refused_once_the_wait_is_over() -> None:
    nvml = sim("hgx-h200")
    collected = Collected()
    p = partitioner(nvml, collected, claim_release_wait_s=0.05)
    p.observe(_allocated("claim-1", nvml, 2, start=0, size=1, partitions=("c-other",)))
    await p.handle(command("c-9", nvml, gpu=2, profile="1g.18gb", profile_id=19, start=0, size=1))
    [failed] = _results(collected)
    assert isinstance(failed, PartitionFailed) and "is decided without command c-9" in failed.reason
