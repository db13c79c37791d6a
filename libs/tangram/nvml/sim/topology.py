"""NVML's topology calls on the simulated node: PCIe ancestry, NVLink, peer-to-peer and the fabric."""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml

from tangram.nvml.sim import handles, wiring
from tangram.nvml.sim.core import SimCore, fail, pci_info

_FABRIC_STATES = {
    "not-started": pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED,
    "in-progress": pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS,
}


class SimTopologyCalls(SimCore):
    # ---- topology ---------------------------------------------------------------------------------

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: Any, device2: Any) -> int:
        a, b = self._gpu_index(device1), self._gpu_index(device2)
        with self._op("nvmlDeviceGetTopologyCommonAncestor"):
            return wiring.pcie_level(self.machine.gpus[a.gpu], self.machine.gpus[b.gpu])

    def _link(self, device: Any, link: int, function: str) -> wiring.LinkEnd:
        d = self._gpu_index(device)
        with self._op(function) as state:
            self._alive(state, d.gpu)
            spec = self._products[d.gpu].nvlink
            if spec is None or not 0 <= link < spec.links:
                raise fail(
                    pynvml.NVML_ERROR_NOT_SUPPORTED if spec is None else pynvml.NVML_ERROR_INVALID_ARGUMENT
                )
            end = wiring.link_end(self.machine, d.gpu, link)
            if end is None:
                raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return end

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        try:
            self._link(device, link, "nvmlDeviceGetNvLinkState")
        except pynvml.NVMLError as exc:
            if (
                exc.value != pynvml.NVML_ERROR_NOT_SUPPORTED
                or self._products[handles.decode(device).gpu].nvlink is None
            ):
                raise
            return int(pynvml.NVML_FEATURE_DISABLED)
        return int(pynvml.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Any, link: int) -> Any:
        end = self._link(device, link, "nvmlDeviceGetNvLinkRemotePciInfo")
        return pci_info(end.remote_pci_bus_id, 0 if end.remote_is_switch else None)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        end = self._link(handle, link, "nvmlDeviceGetNvLinkRemoteDeviceType")
        kind = (
            pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
            if end.remote_is_switch
            else pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
        )
        return int(kind)

    def nvmlDeviceGetP2PStatus(self, device1: Any, device2: Any, p2pIndex: int) -> int:
        a, b = self._gpu_index(device1), self._gpu_index(device2)
        with self._op("nvmlDeviceGetP2PStatus"):
            nvlinked = wiring.nvlink_connected(self.machine, a.gpu, b.gpu)
            if p2pIndex == pynvml.NVML_P2P_CAPS_INDEX_NVLINK:
                return int(pynvml.NVML_P2P_STATUS_OK if nvlinked else pynvml.NVML_P2P_STATUS_NOT_SUPPORTED)
            level = wiring.pcie_level(self.machine.gpus[a.gpu], self.machine.gpus[b.gpu])
            if nvlinked or level < 50:
                return int(pynvml.NVML_P2P_STATUS_OK)
            return int(pynvml.NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED)

    def nvmlDeviceGetGpuFabricInfoV(self, device: Any, gpuFabricInfo: Any) -> int:
        d = self._gpu_index(device)
        info = handles.out_value(gpuFabricInfo)
        with self._op("nvmlDeviceGetGpuFabricInfoV"):
            product = self._products[d.gpu]
            if product.architecture not in ("hopper", "blackwell"):
                raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            fabric = self.machine.fabric
            if fabric is None or not self.machine.switch_attached(d.gpu):
                info.state, info.status = (
                    pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED,
                    pynvml.NVML_ERROR_NOT_SUPPORTED,
                )
                return int(pynvml.NVML_SUCCESS)
            if fabric.state != "completed":
                # registration with the fabric manager not done: no cluster, no clique yet
                info.state = _FABRIC_STATES[fabric.state]
                info.status = pynvml.NVML_ERROR_NOT_READY
                return int(pynvml.NVML_SUCCESS)
            raw = bytes.fromhex(fabric.cluster_uuid.replace("-", ""))
            ctypes.memmove(info.clusterUuid, raw, len(raw))
            info.state, info.status = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_SUCCESS
            info.cliqueId = fabric.clique_id
            degraded = (
                pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE
                if fabric.degraded_bandwidth
                else pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE
            )
            if hasattr(info, "healthMask"):  # v2 and later of the struct
                info.healthMask = degraded << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW
            return int(pynvml.NVML_SUCCESS)

    def pcie_root_of(self, pci_bus_id: str) -> str | None:
        return self._pcie_roots.get(pci_bus_id.lower())
