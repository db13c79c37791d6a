"""What the nodes of a chaos run show: their simulated GPUs as each node's state file holds them,
the MIG instances on them, and the CDI specs of the claims prepared there."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass

from tangram.dra.names import mig_device_name
from tangram.events import ClaimAllocated
from tangram.local.processes import LocalCluster, SimNode
from tangram.nvml import SimNvml, parse_mig_minors, render_mig_minors
from tangram.partitioning import MigExecutor


@dataclass(frozen=True)
class NodeView:
    """The nodes of a run as seen from outside their services, for the faults and the checks."""

    cluster: LocalCluster
    nodes: tuple[SimNode, ...]

    def sim(self, node: str) -> SimNvml:
        machine = next(n.machine for n in self.nodes if n.name == node)
        nvml = SimNvml.from_machine(machine, state_file=self.cluster.state_file(node))
        nvml.nvmlInit()
        return nvml

    def gpu_uuids(self, node: str) -> list[str]:
        nvml = self.sim(node)
        return [
            nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))
            for i in range(nvml.nvmlDeviceGetCount())
        ]

    def mig_uuids(self, node: SimNode) -> set[str]:
        nvml = self.sim(node.name)
        found = set()
        for index in range(nvml.nvmlDeviceGetCount()):
            device = nvml.nvmlDeviceGetHandleByIndex(index)
            for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(device)):
                with contextlib.suppress(Exception):
                    found.add(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetMigDeviceHandleByIndex(device, slot)))
        return found

    def mig_devices(self, node: str) -> dict[str, str]:
        """MIG device uuid -> its DRA device name, for every MIG device on the node's GPUs."""
        executor = MigExecutor(self.sim(node), minors=parse_mig_minors(render_mig_minors()))
        return {
            instance.mig_uuid: mig_device_name(instance.gpu_index, instance.profile, instance.placement.start)
            for instance in executor.observe_all()
            if instance.mig_uuid
        }

    def reused_instances(self, live: Mapping[str, ClaimAllocated]) -> dict[str, set[str]]:
        """Per node, the instances live claims hold that no create of theirs made: each device
        given without a partition command sits on the instance found at its placement."""
        found: dict[str, set[str]] = {}
        for allocation in live.values():
            slots = {
                (device.gpu_index, device.placement.start)
                for device in allocation.devices
                if device.placement is not None and not device.partition_command
            }
            if not slots:
                continue
            executor = MigExecutor(self.sim(allocation.node), minors=parse_mig_minors(render_mig_minors()))
            for gpu_index, start in slots:
                found.setdefault(allocation.node, set()).update(
                    instance.mig_uuid
                    for instance in executor.observe(gpu_index)
                    if instance.placement.start == start and instance.mig_uuid
                )
        return found

    def cdi_uids(self, node: str) -> set[str]:
        return {path.stem.rsplit("_", 1)[-1] for path in self.cluster.cdi_dir(node).glob("*.json")}
