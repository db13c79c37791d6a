"""Who decides the pods of `tangram bench kubernetes`: kube-scheduler alone, or Tangram's allocator
in its Kubernetes mode with kube-scheduler binding."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

DECIDERS = ("kube-scheduler", "tangram")


@dataclass(frozen=True)
class Decider:
    name: str
    allocator_args: tuple[str, ...] = ()  # how the allocator of the LocalCluster is started
    gated: bool = False  # pods carry Tangram's scheduling gate
    # Where the decider says a pod cannot be placed: the pod's PodScheduled condition
    # (kube-scheduler) or Warning Events on the pod or its claim (Tangram).
    failure_events: bool = False


def kube_scheduler_decider() -> Decider:
    return Decider(name="kube-scheduler")


# >>> The switch for Tangram deciding. It holds only what Tangram's side provides: the allocator's
# >>> `--kubernetes` mode (it writes status.allocation of gated pods' claims and lifts the gate) and
# >>> the scheduling gate admission adds. Everything else is the same run as kube-scheduler's.
def tangram_decider(kubeconfig: Path) -> Decider:
    return Decider(
        name="tangram",
        allocator_args=("--kubernetes", "--kubeconfig", str(kubeconfig)),
        gated=True,
        failure_events=True,
    )


def allocator_decides_in_kubernetes() -> bool:
    """Whether this allocator has its Kubernetes mode (`python -m services.allocator --kubernetes`)."""
    try:
        shown = subprocess.run(
            [sys.executable, "-m", "services.allocator", "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--kubernetes" in shown.stdout
