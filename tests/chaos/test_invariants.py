"""The chaos checks themselves: a check that cannot fail proves nothing about the run."""

from __future__ import annotations

from tangram.chaos.invariants import leaked_instances
from tangram.events import AllocatedDevice, ClaimAllocated, MigPlacement, PartitionApplied

CREATE = "create-of-claim-1"


def _allocation(uid: str, *, partition_command: str, start: int) -> ClaimAllocated:
    device = AllocatedDevice(
        request="gpu", driver="gpu.tangram.dev", pool="node-a", device=f"gpu-0-mig-1g-18gb-{start}",
        gpu_index=0, gpu_uuid="GPU-0", profile="1g.18gb", profile_id=19,
        placement=MigPlacement(start=start, size=1), partition_command=partition_command,
    )  # fmt: skip
    return ClaimAllocated(
        key=uid, namespace="team", name=uid, uid=uid, node="node-a", devices=[device],
        partitions=[partition_command] if partition_command else [],
    )  # fmt: skip


def _made(mig_uuid: str) -> PartitionApplied:
    return PartitionApplied(
        key="node-a", command_id=CREATE, node="node-a", action="create", gpu_uuid="GPU-0", gpu_index=0,
        profile="1g.18gb", placement=MigPlacement(start=0, size=1), claim_uid="claim-1", mig_uuid=mig_uuid,
    )  # fmt: skip


def test_an_instance_made_for_a_released_claim_is_a_leak() -> None:
    leaked, missing = leaked_instances(
        {"node-a": {"MIG-made"}}, {"node-a": set()}, [_made("MIG-made")], {}, warm={}, reused={}
    )
    assert leaked == ["MIG-made on node-a"]
    assert missing == []


def test_instances_held_by_live_claims_made_or_reused_and_those_there_before_are_not_leaks() -> None:
    live = {
        "claim-1": _allocation("claim-1", partition_command=CREATE, start=0),
        "claim-2": _allocation("claim-2", partition_command="", start=1),
    }
    leaked, missing = leaked_instances(
        {"node-a": {"MIG-made", "MIG-reused", "MIG-before", "MIG-stray"}},
        {"node-a": {"MIG-before"}},
        [_made("MIG-made")],
        live,
        warm={},
        reused={"node-a": {"MIG-reused"}},
    )
    assert leaked == ["MIG-stray on node-a"]
    assert missing == []


def test_a_live_claims_instance_that_is_gone_is_reported_missing() -> None:
    live = {"claim-1": _allocation("claim-1", partition_command=CREATE, start=0)}
    leaked, missing = leaked_instances(
        {"node-a": set()}, {"node-a": set()}, [_made("MIG-made")], live, warm={}, reused={}
    )
    assert leaked == []
    assert missing == ["MIG-made of live claim claim-1 on node-a is gone"]
