"""Simulated machines: YAML descriptions of whole nodes (GPUs, PCIe, NUMA, NVLink wiring, fabric).

Shipped machines live next to this module; `load_machine` also accepts a path to a user's file.

A machine description is bounded: at most MAX_MACHINE_BYTES of YAML, MAX_GPUS_PER_MACHINE GPUs and
MAX_NVSWITCHES NVSwitches (a DGX-2 has 16 GPUs on 12 NVSwitches; a GB200 NVL72 rack is 72 GPUs,
whose nine switch trays hold 18 NVSwitch chips). `parse_machine`, which every machine file goes
through, refuses anything larger before validating it, so every computation over a machine (the
simulator's answers, a node's inventory, the allocator's tables) runs on a bounded input.
"""

from __future__ import annotations

import re
import uuid
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from tangram.hardware.catalogue import PRODUCTS, GpuProduct
from tangram.inputs import InputError, read_yaml

_PCI_BUS_ID = r"^[0-9a-fA-F]{8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$"

MAX_GPUS_PER_MACHINE = 128
MAX_NVSWITCHES = 18  # the NVSwitch chips of a GB200 NVL72 rack's nine switch trays
MAX_MACHINE_BYTES = 1024 * 1024  # a 128-GPU machine with MIG instances takes about 64 KiB


class MachineError(ValueError):
    """A machine description that cannot be used; the message names the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MigInstanceSpec(_Strict):
    profile: str  # profile name as NVIDIA spells it for the product: "3g.40gb"
    start: int = Field(ge=0)


class GpuSpec(_Strict):
    product: str
    pci_bus_id: Annotated[str, Field(pattern=_PCI_BUS_ID)]
    numa_node: int | None = Field(default=None, ge=0)
    pcie_root: str  # PCI root complex, e.g. "pci0000:15"
    pcie_switch: str | None = None  # the PCIe switch the GPU sits behind, if any
    uuid: str | None = None
    minor: int | None = Field(default=None, ge=0)
    mig_enabled: bool = False
    mig_instances: list[MigInstanceSpec] = []

    @property
    def spec(self) -> GpuProduct:
        return PRODUCTS[self.product]

    @model_validator(mode="after")
    def _check(self) -> GpuSpec:
        if self.product not in PRODUCTS:
            raise ValueError(f"unknown GPU product {self.product!r}; known: {', '.join(sorted(PRODUCTS))}")
        product = PRODUCTS[self.product]
        if self.mig_enabled and not product.mig_capable:
            raise ValueError(f"{self.product} is not MIG-capable; mig_enabled must be false")
        if self.mig_instances and not self.mig_enabled:
            raise ValueError("mig_instances need mig_enabled: true")
        used: set[int] = set()
        for inst in self.mig_instances:
            profile = product.profile_by_name(inst.profile)
            if profile is None:
                names = ", ".join(p.name for p in product.mig_profiles)
                raise ValueError(f"unknown MIG profile {inst.profile!r} for {self.product}; known: {names}")
            if inst.start not in profile.starts:
                raise ValueError(
                    f"{inst.profile} cannot start at memory slice {inst.start}; starts: {profile.starts}"
                )
            slices = set(range(inst.start, inst.start + profile.memory_slices))
            if slices & used:
                raise ValueError(f"{inst.profile} at {inst.start} overlaps another instance")
            used |= slices
        return self


class SwitchWiring(_Strict):
    gpus: list[int]  # GPU indexes whose links all end at this machine's NVSwitches
    switches: int = Field(ge=1)


class NvlinkWiring(_Strict):
    switch: SwitchWiring | None = None
    bridges: list[tuple[int, int]] = []


class FabricSpec(_Strict):
    """What NVML's fabric info says of every switch-attached GPU of the machine (GB200 NVL): the
    NVLink domain (cluster UUID, one per rack) and the fabric-manager partition (clique id)."""

    cluster_uuid: Annotated[str, Field(pattern=r"^[0-9a-fA-F-]{36}$")]
    clique_id: int = Field(ge=0)
    # how far the fabric manager got registering the GPUs: a tray whose registration never
    # completes (a failed tray) is in no clique
    state: Literal["completed", "in-progress", "not-started"] = "completed"
    degraded_bandwidth: bool = False  # some NVLinks of the tray are down: the domain runs slower


class MachineSpec(_Strict):
    name: str
    description: str = ""
    driver_version: Annotated[str, Field(pattern=r"^\d+\.\d+(\.\d+)?$")]
    cuda_driver_version: int = Field(default=12080, ge=1000)  # as NVML reports it: 12080 = 12.8
    gpus: list[GpuSpec] = Field(min_length=1)
    nvlink: NvlinkWiring = NvlinkWiring()
    fabric: FabricSpec | None = None

    # Lookups by GPU index, filled by the validator: the simulator asks them on every NVLink call.
    _peers: dict[int, int] = PrivateAttr(default_factory=dict)
    _switched: frozenset[int] = PrivateAttr(default=frozenset())

    @model_validator(mode="after")
    def _check(self) -> MachineSpec:
        count = len(self.gpus)
        bus_ids = [g.pci_bus_id.lower() for g in self.gpus]
        if len(set(bus_ids)) != count:
            raise ValueError("two GPUs share a pci_bus_id")
        peers: dict[int, int] = {}
        for a, b in self.nvlink.bridges:
            for i in (a, b):
                if not 0 <= i < count:
                    raise ValueError(f"nvlink.bridges: GPU index {i} out of range 0..{count - 1}")
                if self.gpus[i].spec.nvlink is None:
                    raise ValueError(f"nvlink.bridges: GPU {i} ({self.gpus[i].product}) has no NVLink")
                if i in peers:
                    raise ValueError(f"nvlink.bridges: GPU {i} is in two bridges")
                peers[i] = b if i == a else a
            if a == b:
                raise ValueError(f"nvlink.bridges: GPU {a} bridged to itself")
        switched: set[int] = set()
        if self.nvlink.switch is not None:
            for i in self.nvlink.switch.gpus:
                if not 0 <= i < count:
                    raise ValueError(f"nvlink.switch.gpus: GPU index {i} out of range 0..{count - 1}")
                if i in peers:
                    raise ValueError(f"nvlink.switch.gpus: GPU {i} is also bridged")
                if self.gpus[i].spec.nvlink is None:
                    raise ValueError(f"nvlink.switch.gpus: GPU {i} ({self.gpus[i].product}) has no NVLink")
                if i in switched:
                    raise ValueError(f"nvlink.switch.gpus: GPU {i} is listed twice")
                switched.add(i)
        self._peers = peers
        self._switched = frozenset(switched)
        return self

    def bridge_peer(self, index: int) -> int | None:
        return self._peers.get(index)

    def switch_attached(self, index: int) -> bool:
        return index in self._switched


# GPU UUIDs and rack cluster UUIDs of simulated racks, stable per node and rack name
_RACK_NAMESPACE = uuid.UUID("6f1d2c8e-3b4a-4e5f-9a7b-1c2d3e4f5a6b")


def rack_tray(
    tray: MachineSpec,
    *,
    node: str,
    rack: str,
    partition: int | None = None,
    state: Literal["completed", "in-progress", "not-started"] = "completed",
    degraded_bandwidth: bool = False,
) -> MachineSpec:
    """The tray `tray` (a machine with a fabric) as node `node` of NVL rack `rack`: its GPUs have
    UUIDs of their own, and its fabric the rack's cluster UUID and the clique of fabric-manager
    partition `partition` (the tray's own clique id when None)."""
    if tray.fabric is None:
        raise MachineError(f"machine {tray.name} has no NVLink fabric: it is no tray of an NVL rack")
    gpus = [
        g.model_copy(update={"uuid": f"GPU-{uuid.uuid5(_RACK_NAMESPACE, f'{rack}/{node}/{i}')}"})
        for i, g in enumerate(tray.gpus)
    ]
    fabric = FabricSpec(
        cluster_uuid=str(uuid.uuid5(_RACK_NAMESPACE, f"rack/{rack}")),
        clique_id=tray.fabric.clique_id if partition is None else partition,
        state=state,
        degraded_bandwidth=degraded_bandwidth,
    )
    return MachineSpec.model_validate(
        {**tray.model_dump(), "gpus": [g.model_dump() for g in gpus], "fabric": fabric.model_dump()}
    )


def _package_dir() -> Path:
    return Path(str(resources.files(__name__)))


def list_machines() -> list[str]:
    """Names of the shipped machines."""
    return sorted(p.stem for p in _package_dir().glob("*.yaml"))


def _format_error(source: str, exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        where = ".".join(str(part) for part in err["loc"]) or "(top level)"
        problems.append(f"{where}: {err['msg']}")
    return f"machine {source}: " + "; ".join(problems)


def _check_bounds(data: dict[Any, Any], source: str) -> None:
    """Refuse a machine past the stated maxima, before anything is validated per GPU."""
    gpus = data.get("gpus")
    if isinstance(gpus, list) and len(gpus) > MAX_GPUS_PER_MACHINE:
        raise MachineError(
            f"machine {source}: {len(gpus)} GPUs, more than the limit of {MAX_GPUS_PER_MACHINE} per machine"
        )
    nvlink = data.get("nvlink")
    switch = nvlink.get("switch") if isinstance(nvlink, dict) else None
    switches = switch.get("switches") if isinstance(switch, dict) else None
    if isinstance(switches, int) and switches > MAX_NVSWITCHES:
        raise MachineError(
            f"machine {source}: nvlink.switch.switches: {switches} NVSwitches, "
            f"more than the limit of {MAX_NVSWITCHES} per machine"
        )


def parse_machine(data: Any, *, source: str = "<data>") -> MachineSpec:
    """A machine description checked against the bounds and validated (the one way files come in)."""
    if not isinstance(data, dict):
        raise MachineError(
            f"machine {source}: expected a mapping at the top level, got {type(data).__name__}"
        )
    _check_bounds(data, source)
    try:
        return MachineSpec.model_validate(data)
    except ValidationError as exc:
        raise MachineError(_format_error(source, exc)) from None


def load_machine(name_or_path: str | Path) -> MachineSpec:
    """A shipped machine by name ("hgx-h200") or a machine YAML file by path."""
    text = str(name_or_path)
    if re.fullmatch(r"[a-z0-9][a-z0-9-]*", text) and (_package_dir() / f"{text}.yaml").is_file():
        path = _package_dir() / f"{text}.yaml"
    else:
        path = Path(text)
        if not path.exists():
            raise MachineError(
                f"no machine named {text[:80]!r} and no such file; shipped: {', '.join(list_machines())}"
            )
    try:
        data = read_yaml(path, "machine", max_bytes=MAX_MACHINE_BYTES)
    except InputError as exc:
        raise MachineError(str(exc)) from None
    return parse_machine(data, source=str(path))


__all__ = [
    "MAX_GPUS_PER_MACHINE",
    "MAX_MACHINE_BYTES",
    "MAX_NVSWITCHES",
    "FabricSpec",
    "GpuSpec",
    "MachineError",
    "MachineSpec",
    "MigInstanceSpec",
    "NvlinkWiring",
    "SwitchWiring",
    "list_machines",
    "load_machine",
    "parse_machine",
]
