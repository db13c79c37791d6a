"""What a chaos run on Kubernetes is asked for."""

from __future__ import annotations

from dataclasses import dataclass

from tangram.chaos.config import DEFAULT_NODES
from tangram.local.controlplane import NEWEST, Release
from tangram.local.processes import SimNode


@dataclass(frozen=True)
class KubeChaosConfig:
    pods: int = 60
    seed: int = 1
    duration_limit_s: float = 900.0  # no new pod after this; the checks still run
    nodes: tuple[SimNode, ...] = DEFAULT_NODES
    concurrency: int = 8  # pods alive at once (besides those a fault makes)
    fault_interval_s: float = 3.0  # mean time between faults
    keep_at_end: int = 6  # pods made once the faults stop, each to be Running or told why it waits
    settle_s: float = 180.0  # the bound, after the faults stop, for every pod to be settled
    release: Release = NEWEST
