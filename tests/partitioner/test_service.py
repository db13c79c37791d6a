"""The partitioner service over a real nats-server, on a simulated node shared through a state file."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import msgspec
import pytest

from services.partitioner.settings import PartitionerSettings, parse_settings
from tangram.bus import Bus
from tangram.events import (
    AllocatedDevice,
    ClaimAllocated,
    ClaimReleased,
    MigPlacement,
    NodeInventory,
    PartitionApplied,
)
from tangram.local.natsserver import NatsServer
from tangram.nvml import SimNvml, calls
from tangram.partitioning import CleanMode, MigExecutor
from tests.partitioner.helpers import MINORS, NODE, Inbox, command, gpu_uuid, running, sim, subscribe


def _settings(server: NatsServer, state: Path, *, clean_orphans: CleanMode = "empty") -> PartitionerSettings:
    return PartitionerSettings(
        nats_urls=(server.url,),
        node_name=NODE,
        sim_machine="dgx-h100",
        state_file=state,
        clean_orphans=clean_orphans,
    )


@pytest.mark.timeout(600)  # fifty commands, one at a time, on a loaded machine
async def test_command_through_nats_is_applied_and_latency_measured(
    bus: Bus, nats_server: NatsServer, tmp_path: Path
) -> None:
    state = tmp_path / "node.json"
    view = sim("dgx-h100", state)
    results = await subscribe(bus, "tangram.node.node-a.partition.*")
    inventories = await subscribe(bus, "tangram.inventory.node-a")
    async with running(bus, _settings(nats_server, state)):
        first = await inventories.next(NodeInventory)  # published by the start-up reconciliation
        assert isinstance(first, NodeInventory) and first.hardware.node == NODE
        request = command("cmd-0", view, gpu=3, profile="3g.40gb", profile_id=9, start=4, size=4)
        await bus.publish(request)
        applied = await results.next(PartitionApplied)
        assert isinstance(applied, PartitionApplied)
        assert (applied.command_id, applied.event_id, applied.action) == ("cmd-0", "cmd-0-result", "create")
        assert (applied.gpu_uuid, applied.gpu_index, applied.profile) == (gpu_uuid(view, 3), 3, "3g.40gb")
        assert (applied.gpu_instance_id, applied.compute_instance_id, applied.claim_uid) == (2, 0, "claim-1")
        assert (applied.gi_cap_minor, applied.ci_cap_minor) == (3 + 3 * 135 + 18, 3 + 3 * 135 + 18 + 1)
        [seen] = MigExecutor(view, minors=MINORS).observe(3)  # the other process's view of the node
        assert seen.mig_uuid == applied.mig_uuid
        after = await inventories.next(NodeInventory)
        assert isinstance(after, NodeInventory)
        assert [m.uuid for m in after.hardware.gpus[3].mig_instances] == [applied.mig_uuid]

        # The same command again (a redelivery or a duplicate publish) changes nothing.
        await bus.publish(msgspec.structs.replace(request, event_id="another-delivery"))
        latencies = await _fifty_commands(bus, view, results)
        assert len(MigExecutor(view, minors=MINORS).observe(3)) == 1
    p50 = statistics.median(latencies)
    p99 = statistics.quantiles(latencies, n=100)[98]
    print(f"\npartition command -> applied over NATS, {len(latencies)} commands:", end=" ")
    print(f"p50 {p50:.1f} ms, p99 {p99:.1f} ms")


async def _fifty_commands(bus: Bus, view: SimNvml, results: Inbox) -> list[float]:
    """25 creates of 1g instances over GPUs 0-2 and 4-7, then their 25 destroys, one at a time."""
    places = [(gpu, start) for gpu in (0, 1, 2, 4, 5, 6, 7) for start in range(7)][:25]
    latencies = []
    for action in ("create", "destroy"):
        for gpu, start in places:
            request = command(
                f"{action}-{gpu}-{start}", view, action=action, gpu=gpu, profile="1g.10gb", profile_id=19,
                start=start, size=1, claim_uid="",
            )  # fmt: skip
            began = time.perf_counter()
            await bus.publish(request)
            result = await results.next(PartitionApplied)
            latencies.append((time.perf_counter() - began) * 1000)
            assert isinstance(result, PartitionApplied)
            assert (result.command_id, result.action) == (request.command_id, action)
    return latencies


async def test_restart_reconciles_leftovers_and_orphans(
    bus: Bus, nats_server: NatsServer, tmp_path: Path
) -> None:
    state = tmp_path / "node.json"
    view = sim("dgx-h100", state)
    executor = MigExecutor(view, minors=MINORS)
    # An instance Tangram created for a claim that has been released since ...
    orphan = executor.create(1, 14, MigPlacement(start=0, size=2))
    # ... one a live claim holds ...
    kept = executor.create(1, 14, MigPlacement(start=2, size=2))
    # ... and a GPU instance a crash left without its compute instance.
    calls.create_gpu_instance(view, view.nvmlDeviceGetHandleByIndex(1), 9, 4, 4)
    for uid, made in (("gone", orphan), ("live", kept)):
        await bus.publish(_allocated(uid, made.gpu_uuid, made.placement))
        await bus.publish(
            PartitionApplied(
                key=NODE, command_id=f"create-{uid}", node=NODE, action="create", gpu_uuid=made.gpu_uuid,
                gpu_index=1, profile=made.profile, placement=made.placement, claim_uid=uid,
                mig_uuid=made.mig_uuid, gpu_instance_id=made.gpu_instance_id, compute_instance_id=0,
            )
        )  # fmt: skip
    await bus.publish(ClaimReleased(key="gone", namespace="ns", name="gone", uid="gone"))
    results = await subscribe(bus, "tangram.node.node-a.partition.applied")
    async with running(bus, _settings(nats_server, state, clean_orphans="all")):
        cleaned = await results.next(PartitionApplied)
        assert isinstance(cleaned, PartitionApplied)
        assert (cleaned.command_id, cleaned.action, cleaned.claim_uid) == (
            f"reconcile-{orphan.mig_uuid}",
            "destroy",
            "gone",
        )
        left = executor.observe(1)
        assert [(o.mig_uuid, o.empty) for o in left] == [(kept.mig_uuid, False)]


def _allocated(uid: str, gpu: str, placement: MigPlacement) -> ClaimAllocated:
    """The decision names its create command, as the allocator's does: a create it does not name is
    an orphan, whichever of the two the partitioner happens to read first."""
    device = AllocatedDevice(
        request="r", driver="gpu.tangram.dev", pool=NODE, device="d", gpu_index=1, gpu_uuid=gpu,
        profile="2g.20gb", profile_id=14, placement=placement, partition_command=f"create-{uid}",
    )  # fmt: skip
    return ClaimAllocated(
        key=uid, namespace="ns", name=uid, uid=uid, node=NODE, devices=[device], partitions=[f"create-{uid}"]
    )


def test_settings_from_flags() -> None:
    settings = parse_settings(
        [
            "--node-name",
            "n1",
            "--sim",
            "hgx-h200",
            "--warm-pool",
            "1g.18gb=2,3g.71gb=1",
            "--clean-orphans",
            "all",
        ]
    )
    assert (settings.sim_machine, settings.real, settings.clean_orphans) == ("hgx-h200", False, "all")
    assert settings.warm_pool == {"1g.18gb": 2, "3g.71gb": 1}
