"""The IMEX channel of a group's NVLink domain, as the allocator writes it into each member claim's
allocation (an opaque config of kind `ImexChannel`) and the node reads it back. Pure.

Only the allocator writes it: a claim (or a DeviceClass) that carries this kind itself is refused,
by the allocator when it decides and by the node when kube-scheduler allocated the claim and copied
the claim's configs into the allocation. Pods on different trays of a GB200 NVL rack reach each
other's GPU memory over NVLink only through an IMEX channel served by IMEX daemons whose nodes
config lists exactly the domain's nodes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tangram.dra.config import TOPOLOGY_API_VERSION, describe_validation_error

IMEX_KIND = "ImexChannel"
MAX_IMEX_CHANNEL = 2047  # /dev/nvidia-caps-imex-channels/channel0..2047 (the driver's default count)
MAX_DOMAIN_NODES = 1024
IMEX_CHANNEL_DIR = "/dev/nvidia-caps-imex-channels"
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_DOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


class ImexChannel(BaseModel):
    """One group's NVLink domain: its channel, in its fabric clique, on exactly `nodes`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    apiVersion: Literal["gpu.tangram.dev/v1alpha1"] = TOPOLOGY_API_VERSION  # type: ignore[assignment]
    kind: Literal["ImexChannel"] = IMEX_KIND  # type: ignore[assignment]
    domain: str = Field(pattern=_DOMAIN.pattern)  # "<namespace>/<group>"
    clique: str = Field(min_length=1, max_length=128)
    channel: int = Field(ge=0, le=MAX_IMEX_CHANNEL)
    nodes: tuple[str, ...] = Field(min_length=1, max_length=MAX_DOMAIN_NODES)

    @field_validator("nodes")
    @classmethod
    def _node_names(cls, nodes: tuple[str, ...]) -> tuple[str, ...]:
        for node in nodes:
            if not _NODE_NAME.match(node):
                raise ValueError(f"{node!r} is not a node name")
        if list(nodes) != sorted(set(nodes)):
            raise ValueError("nodes must be sorted and without repeats")
        return nodes

    @property
    def device_path(self) -> str:
        return f"{IMEX_CHANNEL_DIR}/channel{self.channel}"


def parse_imex_channel(parameters: Mapping[str, Any], where: str) -> ImexChannel:
    try:
        return ImexChannel.model_validate(dict(parameters))
    except ValidationError as err:
        raise ValueError(describe_validation_error(err, where)) from None


def imex_config(channel: ImexChannel, driver: str) -> dict[str, Any]:
    """The entry of status.allocation.devices.config that carries the channel (every request)."""
    return {
        "source": "FromClaim",
        "opaque": {"driver": driver, "parameters": channel.model_dump(mode="json")},
    }


def imex_of(configs: Iterable[Any], driver: str) -> ImexChannel | None:
    """The channel an allocation's configs carry; None when none does. ValueError naming the entry
    when one is malformed."""
    for index, entry in enumerate(configs):
        opaque = entry.get("opaque") if isinstance(entry, Mapping) else None
        if not isinstance(opaque, Mapping) or opaque.get("driver") != driver:
            continue
        parameters = opaque.get("parameters")
        if isinstance(parameters, Mapping) and parameters.get("kind") == IMEX_KIND:
            return parse_imex_channel(parameters, f"config[{index}].opaque.parameters")
    return None


def free_channel(taken: Iterable[int]) -> int | None:
    """The lowest channel number not taken; None when all are."""
    used = set(taken)
    return next((n for n in range(MAX_IMEX_CHANNEL + 1) if n not in used), None)
