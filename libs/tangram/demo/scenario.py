"""The claims the demo submits: a scripted opening, then random arrivals and departures."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from tangram import DRIVER_NAME

GPU_CLASS = DRIVER_NAME
MIG_CLASS = f"mig.{DRIVER_NAME}"


@dataclass(frozen=True)
class DemoClaim:
    namespace: str
    name: str
    spec: dict[str, Any]
    hold: bool = False  # kept until the end (otherwise released during churn)


def whole_gpus(count: int, *, nvlink: bool = False) -> dict[str, Any]:
    devices: dict[str, Any] = {
        "requests": [{"name": "gpus", "exactly": {"deviceClassName": GPU_CLASS, "count": count}}]
    }
    if nvlink:
        devices["config"] = [
            {
                "requests": ["gpus"],
                "opaque": {
                    "driver": DRIVER_NAME,
                    "parameters": {
                        "apiVersion": f"{DRIVER_NAME}/v1alpha1",
                        "kind": "TopologyConfig",
                        "interconnect": "NVLink",
                    },
                },
            }
        ]
    return {"devices": devices}


def mig(profile_prefix: str) -> dict[str, Any]:
    """A MIG instance whose profile name starts with e.g. "1g." or "3g." (any product)."""
    expression = f'device.attributes["{DRIVER_NAME}"].profile.startsWith("{profile_prefix}")'
    return {
        "devices": {
            "requests": [
                {
                    "name": "mig",
                    "exactly": {
                        "deviceClassName": MIG_CLASS,
                        "selectors": [{"cel": {"expression": expression}}],
                    },
                }
            ]
        }
    }


def opening() -> list[DemoClaim]:
    return [
        DemoClaim("ml", "llm-tensor-parallel", whole_gpus(4, nvlink=True), hold=True),
        DemoClaim("ml", "embedder", mig("1g.")),
        DemoClaim("ml", "reranker", mig("3g.")),
        # No default demo machine starts with a 2g instance (hgx-h200 has a 3g and a 1g), so this
        # claim always has one created live, however the rest of the run goes.
        DemoClaim("ml", "summarizer", mig("2g.")),
        DemoClaim("ml", "fine-tune", whole_gpus(2, nvlink=True)),
        DemoClaim("ml", "too-big", whole_gpus(16)),
    ]


def churn(rng: random.Random, number: int) -> DemoClaim:
    kind = rng.choice(["1g.", "1g.", "2g.", "3g.", "gpu1", "gpu2"])
    if kind.startswith("gpu"):
        return DemoClaim("batch", f"job-{number}", whole_gpus(int(kind[3:]), nvlink=kind == "gpu2"))
    return DemoClaim("inference", f"svc-{number}", mig(kind))
