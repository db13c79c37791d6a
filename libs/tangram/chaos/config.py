"""What a chaos run is asked for: its claims, seed, time limit, nodes, NATS servers and fault pace."""

from __future__ import annotations

from dataclasses import dataclass

from tangram.local.processes import SimNode

DEFAULT_NODES = (SimNode("node-a", "hgx-h200"), SimNode("node-b", "dgx-h100"))


@dataclass(frozen=True)
class ChaosConfig:
    claims: int = 300
    seed: int = 1
    duration_limit_s: float = 900.0  # no new claim after this; the checks still run
    nodes: tuple[SimNode, ...] = DEFAULT_NODES
    nats_servers: int = 3
    concurrency: int = 12  # claims alive at once
    fault_interval_s: float = 1.0  # mean time between faults
    keep_at_end: int = 6  # claims left prepared at the end
