"""Tangram's opaque device configuration (`opaque.parameters` of driver gpu.tangram.dev). Pure.

Read by the allocator when it decides and by the kubelet plugin when it prepares a claim that
kube-scheduler allocated, so both accept and refuse the same parameters with the same messages.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

TOPOLOGY_API_VERSION = "gpu.tangram.dev/v1alpha1"
TOPOLOGY_KIND = "TopologyConfig"


class TopologyConfig(BaseModel):
    """Tangram's opaque parameters: what DRA cannot say about how GPUs of a claim are connected."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    apiVersion: Literal["gpu.tangram.dev/v1alpha1"]
    kind: Literal["TopologyConfig"]
    interconnect: Literal["NVLink", "Any"] = "Any"
    minPairBandwidthGBps: float = Field(default=0.0, ge=0)
    placement: Literal["Pack", "Spread"] = "Pack"


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
