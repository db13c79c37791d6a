"""The fault kinds of a chaos run on Kubernetes, in a seeded order. No I/O."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Literal

KubeFaultKind = Literal[
    "kill-leader-allocator",  # kill -9 of the allocator that leads, then restarted
    "kill-standby-allocator",  # kill -9 of the one standing by, then restarted
    "kill-webhook",  # kill -9 of the admission webhook, then restarted
    "kill-node-service",  # kill -9 of a node's discovery, partitioner or cdi service, then restarted
    "restart-apiserver",  # kill -9 of the control plane (etcd, kube-apiserver, ...), restarted on its data
    "delete-pod-in-flight",  # a pod deleted while its claim is being decided, written or prepared
    "delete-claim-allocated",  # a claim deleted while allocated and its pod running
]

KUBE_FAULT_KINDS: tuple[KubeFaultKind, ...] = (
    "kill-leader-allocator",
    "kill-standby-allocator",
    "kill-webhook",
    "kill-node-service",
    "restart-apiserver",
    "delete-pod-in-flight",
    "delete-claim-allocated",
)


def kube_fault_order(rng: random.Random) -> Iterator[KubeFaultKind]:
    """Every kind once per round, each round in a seeded order."""
    while True:
        kinds = list(KUBE_FAULT_KINDS)
        rng.shuffle(kinds)
        yield from kinds
