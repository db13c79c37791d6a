"""A small fleet with something of everything: MIG instances held and warm, whole GPUs, a failed claim."""

from __future__ import annotations

import msgspec

from tangram.events import (
    AllocatedDevice,
    ClaimAllocated,
    ClaimFailed,
    ClaimPrepared,
    ClaimRequested,
    Event,
    MigInstance,
    MigPlacement,
    NodeInventory,
)
from tests.allocator.helpers import gpus, hardware, mig

NODE = "gpu-node-1"


def _instance(n: int, profile: str, profile_id: int, start: int, size: int) -> MigInstance:
    return MigInstance(
        uuid=f"MIG-0000000{n}-aaaa-bbbb-cccc-dddddddddddd",
        profile_id=profile_id,
        profile=profile,
        placement=MigPlacement(start=start, size=size),
        gpu_instance_id=n,
        compute_instance_id=0,
    )


def _device(
    gpu_uuid: str, gpu_index: int, name: str, profile: str | None = None, start: int = 0, size: int = 0
) -> AllocatedDevice:
    return AllocatedDevice(
        request="mig" if profile else "gpus",
        driver="gpu.tangram.dev",
        pool=NODE,
        device=name,
        gpu_index=gpu_index,
        gpu_uuid=gpu_uuid,
        profile=profile,
        placement=MigPlacement(start=start, size=size) if profile else None,
    )


def fleet_events() -> list[Event]:
    hw = hardware("hgx-h200", NODE)
    gpu0 = msgspec.structs.replace(
        hw.gpus[0],
        mig_instances=[
            _instance(1, "1g.18gb", 19, 0, 1),
            _instance(2, "1g.18gb", 19, 2, 1),  # no claim holds it: warm
            _instance(3, "3g.71gb", 9, 4, 4),
        ],
    )
    hw = msgspec.structs.replace(hw, gpus=[gpu0, *hw.gpus[1:]])
    u0, u1, u2 = (g.uuid for g in hw.gpus[:3])
    events: list[Event] = [NodeInventory(key=NODE, hardware=hw)]

    def claim(n: int, name: str, spec: dict[str, object]) -> str:
        uid = f"00000000-0000-4000-8000-{n:012d}"
        events.append(ClaimRequested(key=uid, namespace="ml", name=name, uid=uid, spec=spec))
        return uid

    embedder = claim(1, "embedder", mig("1g.18gb"))
    events.append(
        ClaimAllocated(
            key=embedder,
            namespace="ml",
            name="embedder",
            uid=embedder,
            node=NODE,
            devices=[_device(u0, 0, "gpu-0-mig-1g-18gb-0", "1g.18gb", 0, 1)],
        )
    )
    events.append(
        ClaimPrepared(key=NODE, node=NODE, namespace="ml", name="embedder", uid=embedder, devices=[])
    )
    reranker = claim(2, "reranker", mig("3g.71gb"))
    events.append(
        ClaimAllocated(
            key=reranker,
            namespace="ml",
            name="reranker",
            uid=reranker,
            node=NODE,
            devices=[_device(u0, 0, "gpu-0-mig-3g-71gb-4", "3g.71gb", 4, 4)],
        )
    )
    llm = claim(3, "llm", gpus(2))
    events.append(
        ClaimAllocated(
            key=llm,
            namespace="ml",
            name="llm",
            uid=llm,
            node=NODE,
            devices=[_device(u1, 1, "gpu-1"), _device(u2, 2, "gpu-2")],
        )
    )
    events.append(ClaimPrepared(key=NODE, node=NODE, namespace="ml", name="llm", uid=llm, devices=[]))
    big = claim(4, "too-big", gpus(16))
    events.append(
        ClaimFailed(
            key=big,
            namespace="ml",
            name="too-big",
            uid=big,
            reason="0/1 nodes fit: 1 node: not enough free GPUs or MIG slices",
        )
    )
    return events
