"""What a prepared claim is made of: its devices, resolved down to device files and UUIDs."""

from __future__ import annotations

import msgspec

from tangram.dra.imex import IMEX_CHANNEL_DIR, ImexChannel
from tangram.events.catalogue import DeviceShare


class ClaimRef(msgspec.Struct, frozen=True, kw_only=True):
    """A claim as kubelet names it."""

    namespace: str
    name: str
    uid: str


class ResolvedDevice(msgspec.Struct, frozen=True, kw_only=True):
    """One allocated device, with everything needed to expose it to a container."""

    request: str  # "<request>" or "<request>/<subrequest>"
    pool: str
    device: str  # ResourceSlice device name
    gpu_index: int
    gpu_uuid: str
    gpu_minor: int  # /dev/nvidia<minor> of the (parent) GPU
    mig_uuid: str = ""  # empty for a whole GPU
    profile: str = ""  # MIG profile name, empty for a whole GPU
    gi_cap_minor: int = -1  # /dev/nvidia-caps/nvidia-cap<N> of the GPU instance
    ci_cap_minor: int = -1  # ... of the compute instance
    share: DeviceShare | None = None  # a share of the device (MPS or time-slicing), not all of it
    # the MIG device's GPU instance id on its GPU (what DCGM labels GPU_I_ID); -1 for a whole GPU
    gpu_instance_id: int = -1

    @property
    def is_mig(self) -> bool:
        return bool(self.mig_uuid)

    @property
    def visible_uuid(self) -> str:
        return self.mig_uuid or self.gpu_uuid


class ImexGrant(msgspec.Struct, frozen=True, kw_only=True):
    """A claim's part of a group's NVLink domain: its IMEX channel, shared by the domain's nodes."""

    domain: str  # "<namespace>/<group>"
    channel: int
    nodes: list[str]

    @property
    def directory_name(self) -> str:
        namespace, _, group = self.domain.partition("/")
        return f"{namespace}_{group}"

    @property
    def device_path(self) -> str:
        return f"{IMEX_CHANNEL_DIR}/channel{self.channel}"


class ResolvedAllocation(msgspec.Struct, frozen=True, kw_only=True):
    claim: ClaimRef
    devices: list[ResolvedDevice]
    imex: ImexGrant | None = None  # the IMEX channel of the claim's NVLink domain, if it is in one
    # the pods the claim was reserved for when it was prepared (`status.reservedFor`, in Kubernetes)
    pods: list[str] = []


def imex_grant(channel: ImexChannel | None) -> ImexGrant | None:
    if channel is None:
        return None
    return ImexGrant(domain=channel.domain, channel=channel.channel, nodes=list(channel.nodes))
