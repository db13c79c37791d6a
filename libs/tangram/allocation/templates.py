"""A node's devices derived from those of an earlier node of the same shape.

Building every MIG placement's attributes from the hardware costs milliseconds per node; nodes of
one shape advertise the same devices except for identities (GPU and MIG UUIDs, NVLink domain and
clique ids), so the devices are built once per shape and re-identified for every other node.
"""

from __future__ import annotations

import msgspec

from tangram.dra import node_devices
from tangram.dra.model import AttributeValue, CounterSet, Device, NodeDevices
from tangram.dra.names import qualified
from tangram.events.inventory import GpuInfo, NodeHardware

# Which attributes are optional varies between nodes of one shape, so it is part of the template key.
TemplateKey = tuple[str, tuple[tuple[bool, bool], ...]]


def template_key(signature: str, hw: NodeHardware) -> TemplateKey:
    gpus = sorted(hw.gpus, key=lambda g: g.index)
    return signature, tuple((g.nvlink_domain is None, g.clique_id is None) for g in gpus)


class DeviceTemplates:
    """Per template key, the devices of a node with no MIG instances, to re-identify."""

    def __init__(self, driver: str) -> None:
        self.driver = driver
        self._templates: dict[TemplateKey, _Template] = {}

    def devices(self, signature: str, hw: NodeHardware) -> NodeDevices:
        key = template_key(signature, hw)
        template = self._templates.get(key)
        if template is None:
            bare = msgspec.structs.replace(
                hw, gpus=[msgspec.structs.replace(g, mig_instances=[]) for g in hw.gpus]
            )
            built = node_devices(bare, driver=self.driver, shared=True)
            template = _Template({g.index: g for g in hw.gpus}, tuple(built.devices), built.counter_sets)
            self._templates[key] = template
        source_gpus = template.gpus
        gpus = {g.index: g for g in hw.gpus}
        names = _AttributeNames(self.driver)
        instances = {
            (g.index, m.profile_id, m.placement.start): m.uuid for g in hw.gpus for m in g.mig_instances
        }
        devices: list[Device] = []
        for device in template.devices:
            gpu = gpus[device.gpu_index]
            mig_uuid = (
                instances.get((gpu.index, device.profile_id, device.placement.start))
                if device.placement is not None and device.profile_id is not None
                else None
            )
            if _same_identity(source_gpus[device.gpu_index], gpu) and mig_uuid is None:
                devices.append(device)
                continue
            attributes: dict[str, AttributeValue] = dict(device.attributes)
            if names.uuid in attributes and device.kind == "gpu":
                attributes[names.uuid] = gpu.uuid
            if names.parent in attributes:
                attributes[names.parent] = gpu.uuid
            if gpu.nvlink_domain is not None:
                attributes[names.nvlink_domain] = gpu.nvlink_domain
            if gpu.clique_id is not None:
                attributes[names.clique_id] = gpu.clique_id
            if mig_uuid is not None:
                attributes[names.uuid] = mig_uuid
            devices.append(msgspec.structs.replace(device, gpu_uuid=gpu.uuid, attributes=attributes))
        return NodeDevices(
            node=hw.node,
            driver=self.driver,
            pool=hw.node,
            devices=devices,
            counter_sets=list(template.counter_sets),
        )


class _Template:
    __slots__ = ("counter_sets", "devices", "gpus")

    def __init__(
        self, gpus: dict[int, GpuInfo], devices: tuple[Device, ...], counter_sets: list[CounterSet]
    ) -> None:
        self.gpus = gpus
        self.devices = devices
        self.counter_sets = tuple(counter_sets)


def _same_identity(a: GpuInfo, b: GpuInfo) -> bool:
    return a.uuid == b.uuid and a.nvlink_domain == b.nvlink_domain and a.clique_id == b.clique_id


class _AttributeNames:
    __slots__ = ("clique_id", "nvlink_domain", "parent", "uuid")

    def __init__(self, driver: str) -> None:
        self.uuid = qualified(driver, "uuid")
        self.parent = qualified(driver, "parentUUID")
        self.nvlink_domain = qualified(driver, "nvlinkDomain")
        self.clique_id = qualified(driver, "cliqueId")
