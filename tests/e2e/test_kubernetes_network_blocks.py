"""A group of pods spread over nodes is kept under one network block, read from the Nodes' labels
on the real control plane.

Three nodes of 8 GPUs (GPU 0 of each keeps MIG instances Kubernetes does not know of): n1 and n2
are alike (L40S) and first by name, n3 is another machine (H100) in n1's block. A group of two pods
of 7 GPUs each takes n1 and n3, the two nodes of block x; without the labels it takes the two alike
nodes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from services.discovery.topology import NETWORK_BLOCK_LABEL
from tangram.local.controlplane import ControlPlane
from tangram.local.processes import SimNode
from tests.e2e.kubecluster import Node, gang_member, started_fleet, wait_for_pod

pytestmark = [pytest.mark.timeout(600), pytest.mark.controlplane]


@pytest.fixture
async def fleet(controlplane: ControlPlane, kube: Any, unique: str) -> AsyncIterator[list[Node]]:
    suffix = unique.rsplit("-", 1)[-1]
    machines = {f"n1-{suffix}": "l40s-8", f"n2-{suffix}": "l40s-8", f"n3-{suffix}": "dgx-h100"}
    blocks = {f"n1-{suffix}": "x", f"n2-{suffix}": "y", f"n3-{suffix}": "x"}
    sims = [SimNode(name, machine) for name, machine in machines.items()]
    labels = {name: {NETWORK_BLOCK_LABEL: f"block-{block}"} for name, block in blocks.items()}
    async with started_fleet(controlplane, kube, unique, sims, decide=True, labels=labels) as nodes:
        yield nodes


async def test_a_group_of_pods_lands_under_one_network_block(fleet: list[Node]) -> None:
    first = fleet[0]
    suffix = first.namespace.rsplit("-", 1)[-1]
    for i in (1, 2):
        await gang_member(first, f"train-{i}", 7, "train", 2)
    placed = sorted([(await wait_for_pod(first, f"train-{i}", "Running")).spec.node_name for i in (1, 2)])
    assert placed == [f"n1-{suffix}", f"n3-{suffix}"]
