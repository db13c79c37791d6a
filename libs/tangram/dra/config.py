"""Tangram's opaque device configuration (`opaque.parameters` of driver gpu.tangram.dev). Pure.

Read by the allocator when it decides and by the kubelet plugin when it prepares a claim that
kube-scheduler allocated, so both accept and refuse the same parameters with the same messages.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tangram.quantity import ceil_quantity

TOPOLOGY_API_VERSION = "gpu.tangram.dev/v1alpha1"
TOPOLOGY_KIND = "TopologyConfig"
SHARING_KIND = "SharingConfig"
PARAMETER_KINDS = (TOPOLOGY_KIND, SHARING_KIND)


class TopologyConfig(BaseModel):
    """Tangram's opaque parameters: what DRA cannot say about how GPUs of a claim are connected."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    apiVersion: Literal["gpu.tangram.dev/v1alpha1"]
    kind: Literal["TopologyConfig"]
    interconnect: Literal["NVLink", "Any"] = "Any"
    minPairBandwidthGBps: float = Field(default=0.0, ge=0)
    placement: Literal["Pack", "Spread"] = "Pack"


class SharingConfig(BaseModel):
    """How a claim shares a device with others (class shared.gpu.tangram.dev).

    Only the claim's own share can be described: limits, strategy and slice length. Paths,
    environment and other clients' limits are the node's to set, so no field names them and any
    unknown field is refused.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    apiVersion: Literal["gpu.tangram.dev/v1alpha1"]
    kind: Literal["SharingConfig"]
    strategy: Literal["MPS", "TimeSlicing"] = "MPS"
    # The share's device memory, in bytes (a quantity such as "10Gi" is accepted), for servers
    # without consumable capacity; where `capacity.requests.memory` is given it wins.
    memory: int | None = Field(default=None, gt=0)
    computePercent: int | None = Field(default=None, ge=1, le=100)
    timeSlice: Literal["Default", "Short", "Medium", "Long"] = "Default"

    @field_validator("memory", mode="before")
    @classmethod
    def _quantity(cls, value: Any) -> Any:
        if isinstance(value, str):
            return ceil_quantity(value)
        return value

    @model_validator(mode="after")
    def _strategy_fields(self) -> SharingConfig:
        if self.strategy == "TimeSlicing" and self.computePercent is not None:
            raise ValueError("computePercent needs strategy MPS: time-slicing cannot limit compute")
        if self.strategy == "MPS" and self.timeSlice != "Default":
            raise ValueError("timeSlice needs strategy TimeSlicing")
        return self


def describe_validation_error(err: ValidationError, prefix: str) -> str:
    """One line per problem, each naming the field: `spec.devices.requests[0].exactly.count: ...`."""
    lines = []
    for problem in err.errors():
        path = prefix
        for part in problem["loc"]:
            if isinstance(part, int):
                path += f"[{part}]"
            elif part not in ("function-after", "function-before") and not str(part).startswith("function-"):
                path += f".{part}"
        message = problem["msg"].removeprefix("Value error, ")
        lines.append(f"{path}: {message}")
    return "; ".join(lines)


def parse_topology_config(parameters: dict[str, Any], where: str) -> TopologyConfig:
    try:
        return TopologyConfig.model_validate(parameters)
    except ValidationError as err:
        raise ValueError(describe_validation_error(err, where)) from None


def parse_sharing_config(parameters: dict[str, Any], where: str) -> SharingConfig:
    try:
        return SharingConfig.model_validate(parameters)
    except ValidationError as err:
        raise ValueError(describe_validation_error(err, where)) from None
