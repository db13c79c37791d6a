"""One hand-written instance of every event type."""

from __future__ import annotations

from tangram.events import (
    AllocatedDevice,
    ClaimAllocated,
    ClaimFailed,
    ClaimPreempting,
    ClaimPrepared,
    ClaimReleased,
    ClaimRequested,
    ClaimUnprepared,
    DeadLetter,
    DeviceHealthChanged,
    Event,
    GpuInfo,
    GpuLink,
    MigInstance,
    MigPlacement,
    MigProfile,
    NodeHardware,
    NodeInventory,
    PartitionApplied,
    PartitionFailed,
    PartitionRequested,
    PreemptionVictim,
    PreparedDevice,
)

UID = "0c3b1f9e-7d4a-4a55-9a57-1f0a4f6b2c10"
NODE = "node-a"
PLACEMENT = MigPlacement(start=4, size=4)

HARDWARE = NodeHardware(
    node=NODE,
    driver_version="580.95.05",
    cuda_driver_version="13.0",
    gpus=[
        GpuInfo(
            index=0,
            uuid="GPU-11111111-2222-3333-4444-555555555555",
            name="NVIDIA H200",
            product="H200-141GB",
            architecture="hopper",
            cuda_compute_capability="9.0",
            pci_bus_id="00000000:18:00.0",
            minor=0,
            memory_mib=143771,
            multiprocessors=132,
            numa_node=0,
            pcie_root="pci0000:15",
            nvlink_domain="node-a-nvswitch",
            mig_capable=True,
            mig_enabled=True,
            memory_slices=8,
            compute_slices=7,
            mig_profiles=[
                MigProfile(
                    profile_id=9,
                    profile_index=2,
                    name="3g.71gb",
                    compute_slices=3,
                    memory_slices=4,
                    memory_mib=71168,
                    multiprocessors=60,
                    instance_count=2,
                    placements=[MigPlacement(start=0, size=4), PLACEMENT],
                )
            ],
            mig_instances=[
                MigInstance(
                    uuid="MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
                    profile_id=9,
                    profile="3g.71gb",
                    placement=PLACEMENT,
                    gpu_instance_id=2,
                    compute_instance_id=0,
                )
            ],
        )
    ],
    links=[GpuLink(a=0, b=1, nvlinks=18, bandwidth_gbps=900.0, pcie_level=50)],
)


def every_event() -> list[Event]:
    return [
        NodeInventory(key=NODE, hardware=HARDWARE, generation=3),
        ClaimRequested(key=UID, namespace="ml", name="llm", uid=UID, spec={"devices": {"requests": []}}),
        ClaimAllocated(
            key=UID,
            namespace="ml",
            name="llm",
            uid=UID,
            node=NODE,
            devices=[
                AllocatedDevice(
                    request="gpu",
                    driver="gpu.tangram.dev",
                    pool=NODE,
                    device="gpu-0-mig-3g-71gb-4",
                    gpu_index=0,
                    gpu_uuid=HARDWARE.gpus[0].uuid,
                    profile="3g.71gb",
                    profile_id=9,
                    placement=PLACEMENT,
                )
            ],
            partitions=["cmd-1"],
        ),
        ClaimFailed(key=UID, namespace="ml", name="llm", uid=UID, reason="0/3 nodes fit"),
        ClaimReleased(key=UID, namespace="ml", name="llm", uid=UID),
        ClaimPreempting(
            key=UID,
            namespace="ml",
            name="llm",
            uid=UID,
            node=NODE,
            priority=1000,
            victims=[
                PreemptionVictim(
                    namespace="batch", name="sweep-7", uid="5d0c6a1e-2b7f-4c39-8e1d-9a4b3c2d1e07", priority=0
                )
            ],
            reason="0/3 nodes fit",
        ),
        PartitionRequested(
            key=NODE,
            command_id="cmd-1",
            node=NODE,
            action="create",
            gpu_uuid=HARDWARE.gpus[0].uuid,
            gpu_index=0,
            profile="3g.71gb",
            profile_id=9,
            placement=PLACEMENT,
            claim_uid=UID,
        ),
        PartitionApplied(
            key=NODE,
            command_id="cmd-1",
            node=NODE,
            action="create",
            gpu_uuid=HARDWARE.gpus[0].uuid,
            gpu_index=0,
            profile="3g.71gb",
            placement=PLACEMENT,
            claim_uid=UID,
            mig_uuid="MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
            gpu_instance_id=2,
            compute_instance_id=0,
            gi_cap_minor=21,
            ci_cap_minor=22,
            duration_ms=41.5,
        ),
        PartitionFailed(
            key=NODE,
            command_id="cmd-2",
            node=NODE,
            action="create",
            gpu_uuid=HARDWARE.gpus[0].uuid,
            profile="3g.71gb",
            placement=PLACEMENT,
            nvml_error="NVML_ERROR_INSUFFICIENT_RESOURCES",
            reason="placement 4:4 overlaps an existing instance",
        ),
        ClaimPrepared(
            key=NODE,
            node=NODE,
            namespace="ml",
            name="llm",
            uid=UID,
            devices=[
                PreparedDevice(
                    request="gpu",
                    pool=NODE,
                    device="gpu-0-mig-3g-71gb-4",
                    cdi_device_ids=[f"gpu.tangram.dev/claim={UID}-gpu-0-mig-3g-71gb-4"],
                )
            ],
        ),
        ClaimUnprepared(key=NODE, node=NODE, namespace="ml", name="llm", uid=UID),
        DeviceHealthChanged(
            key=NODE, node=NODE, gpu_uuid=HARDWARE.gpus[0].uuid, healthy=False, reason="XID 79", xid=79
        ),
        DeadLetter(
            key="allocator",
            consumer="allocator",
            original_subject="tangram.claim.requested.x",
            original_stream="TANGRAM_CLAIMS",
            original_sequence=7,
            deliveries=1,
            reason="undecodable event: bad",
            data=b"\x00\xffnot json",
            headers={"Nats-Msg-Id": "abc"},
        ),
    ]
