"""`tangram bench kubernetes`: one workload of pods with claims, decided in a real Kubernetes.

Each decider gets a fresh control plane (etcd, kube-apiserver, kube-controller-manager and
kube-scheduler of the pinned release), the same simulated nodes (Tangram's services per node,
discovery publishing ResourceSlices) and a kubelet stand-in per node that prepares the claims of
the pods bound to it over the real DRA socket. The workload is the allocator benchmarks' seeded
trace (`tangram.bench.traces`): pods whose claims come from ResourceClaimTemplates (MIG 1g/2g/3g,
whole 1/2/4/8 GPUs, the multi-GPU ones in one NVLink domain), arriving and departing at half the
fleet's GPUs, then arriving only until they ask for `--saturation` times the fleet's GPUs.

Pods are driven one at a time: a pod is created and its decision awaited (bound to a node, or
found unplaceable), a departing pod is awaited until prepared, then deleted and awaited until its
claim is gone, so every decision sees the capacity the trace says is free. A pod that cannot be
placed is deleted and the trace goes on; the first one marks what the run admitted. The nodes
start from clean machines (no MIG instance). Deciders:

- `kube-scheduler`: kube-scheduler allocates the claims from the published slices;
- `tangram`: the allocator, started in its Kubernetes mode, decides the claims of pods that carry
  the scheduling gate (admission adds it in a cluster; here the pods are created with it), writes
  their `status.allocation` and lifts the gate; kube-scheduler then binds the pod to that node.

What each run reports is measured the same way for both: the allocations are read back from the
API server and laid on the nodes' hardware (`FleetState`) to count stranded GPUs and NVLink sets.

The parts: `pods` (the workload and its manifests), `deciders`, `runner` (one run against a
control plane) and `report` (a run's figures, the ratios, the table); this module is the command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import sys
import time
from typing import Any

from tangram.allocation import NvlinkTally
from tangram.bench.kubernetes.deciders import (
    DECIDERS,
    allocator_decides_in_kubernetes,
    kube_scheduler_decider,
    tangram_decider,
)
from tangram.bench.kubernetes.pods import (
    KUBE_MIX,
    MACHINES,
    RUN_LABEL,
    fleet,
    node_hardware,
    pod_manifest,
    pod_name,
    template_manifest,
    template_spec,
    workload,
)
from tangram.bench.kubernetes.report import (
    PlacementTally,
    PodRecord,
    ratios,
    run_report,
    synthetic_ratios,
    synthetic_table,
    table,
)
from tangram.bench.kubernetes.runner import run_decider
from tangram.bench.kubernetes.synthetic import (
    ONE_GPU,
    WORKLOADS,
    Phase,
    mixed_phases,
    run_synthetic,
    scheduler_perf_phases,
    sharing_phases,
    synthetic_fleet,
)
from tangram.bench.kubernetes.syntheticnodes import instant_result
from tangram.bench.kubesim import BenchError, control_plane, stopped_by_signal
from tangram.bench.traces import Arrival, fleet_gpus
from tangram.kubernetes.api import KubeApiError
from tangram.local.controlplane import ControlPlaneError

__all__ = [
    "KUBE_MIX",
    "MACHINES",
    "ONE_GPU",
    "RUN_LABEL",
    "BenchError",
    "NvlinkTally",
    "Phase",
    "PlacementTally",
    "PodRecord",
    "add_arguments",
    "allocator_decides_in_kubernetes",
    "bench",
    "deciders_of",
    "fleet",
    "instant_result",
    "kube_scheduler_decider",
    "mixed_phases",
    "node_hardware",
    "pod_manifest",
    "pod_name",
    "ratios",
    "run",
    "run_decider",
    "run_report",
    "run_synthetic",
    "scheduler_perf_phases",
    "sharing_phases",
    "synthetic_fleet",
    "synthetic_ratios",
    "table",
    "tangram_decider",
    "template_manifest",
    "template_spec",
    "workload",
]

MAX_NODES = 16  # each node is three service processes on this machine
MAX_SYNTHETIC_NODES = 1000  # a Node and its ResourceSlices each, no process
MAX_PODS = 10_000
# The components' own request rate at scale, as scheduler_perf runs them unthrottled: at their
# defaults (20 a second for the controller that makes each pod's claim) the control plane, not
# the decider, sets the pace.
SYNTHETIC_CLIENT_QPS = 1000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nodes", type=int, default=2, help=f"simulated nodes, cycling {', '.join(MACHINES)}"
    )
    parser.add_argument(
        "--pods", type=int, default=100, help="pods that arrive while others depart (the churn)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--saturation",
        type=float,
        default=1.3,
        help="after the churn, pods arrive until they ask for this many times the fleet's GPUs",
    )
    parser.add_argument(
        "--deciders",
        default=",".join(DECIDERS),
        help=f"comma-separated, run in this order (default {','.join(DECIDERS)}: both, side by side)",
    )
    parser.add_argument(
        "--synthetic-nodes",
        action="store_true",
        help="nodes as Node objects with slices and inventories only, no process and no prepare "
        f"(as scheduler_perf runs them; up to {MAX_SYNTHETIC_NODES}): a pod counts once bound",
    )
    parser.add_argument(
        "--workload",
        choices=WORKLOADS,
        default="mixed",
        help="with --synthetic-nodes: scheduler-perf (l40s-8 nodes, 1-GPU pods until full, then "
        "steady churn at half full), mixed (hgx-h200, h100-nvl-4x2, l40s-8; MIG and NVLink claims "
        "past saturation) or sharing (l40s-8, h100-nvl-4x2; shares of GPUs by memory, and exclusive "
        "claims, past saturation)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=50,
        help="with --synthetic-nodes: pod creations and deletions in flight at once",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="with --synthetic-nodes: at most this many pod operations a second (0: as fast as "
        "--concurrency allows)",
    )
    parser.add_argument(
        "--steady",
        type=int,
        default=None,
        help="scheduler-perf: deletions-and-creations of the steady phase (default: one per node)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")


def deciders_of(text: str) -> list[str]:
    chosen = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in DECIDERS]
    if not chosen or unknown or len(set(chosen)) != len(chosen):
        raise BenchError(f"--deciders: a comma-separated list of {', '.join(DECIDERS)}, each once")
    return chosen


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    limit = MAX_SYNTHETIC_NODES if args.synthetic_nodes else MAX_NODES
    if (
        not 1 <= args.nodes <= limit
        or not 0 <= args.pods <= MAX_PODS
        or not 0.1 <= args.saturation <= 3.0
        or not 1 <= args.concurrency <= 1000
        or not 0 <= args.rate <= 10_000
    ):
        raise BenchError(
            f"--nodes in [1, {limit}], --pods in [0, {MAX_PODS}], --saturation in [0.1, 3], "
            "--concurrency in [1, 1000], --rate in [0, 10000]"
        )
    if args.workload != "mixed" and not args.synthetic_nodes:
        raise BenchError(f"--workload {args.workload} runs on --synthetic-nodes")
    chosen = deciders_of(args.deciders)
    if "tangram" in chosen and not allocator_decides_in_kubernetes():
        raise BenchError(
            "--deciders tangram: this allocator has no Kubernetes mode (services.allocator --kubernetes) yet"
        )
    if args.synthetic_nodes:
        return await _bench_synthetic(args, chosen)
    nodes = fleet(args.nodes)
    hardware = node_hardware(nodes)
    capacity = fleet_gpus(hardware)
    ops = workload(args.seed, capacity, pods=args.pods, saturation=args.saturation)
    runs: dict[str, Any] = {}
    for name in chosen:
        async with control_plane() as (plane, api):
            decider = tangram_decider(plane.kubeconfig) if name == "tangram" else kube_scheduler_decider()
            started = time.monotonic()
            runs[name] = await run_decider(
                api, plane.kubeconfig, nodes, ops, decider, namespace=f"bench-{secrets.token_hex(3)}"
            )
            runs[name]["run_s"] = round(time.monotonic() - started, 1)
    result: dict[str, Any] = {
        "benchmark": "kubernetes",
        "seed": args.seed,
        "nodes": dict(nodes),
        "gpus": capacity,
        "churn_pods": args.pods,
        "saturation": args.saturation,
        "trace_pods": sum(isinstance(op, Arrival) for op in ops),
        "trace_deletions": sum(not isinstance(op, Arrival) for op in ops),
        "runs": runs,
    }
    if "tangram" in runs and "kube-scheduler" in runs:
        result["tangram_over_kube_scheduler"] = ratios(runs["tangram"], runs["kube-scheduler"])
    return result


async def _bench_synthetic(args: argparse.Namespace, chosen: list[str]) -> dict[str, Any]:
    """Each decider on its own fresh control plane, the same synthetic fleet and workload."""
    nodes = synthetic_fleet(args.nodes, args.workload)
    capacity = fleet_gpus(node_hardware(nodes))
    if args.workload == "scheduler-perf":
        steady = args.nodes if args.steady is None else args.steady
        phases = scheduler_perf_phases(int(capacity), steady=steady, seed=args.seed)
    elif args.workload == "sharing":
        phases = sharing_phases(capacity, pods=args.pods, saturation=args.saturation, seed=args.seed)
    else:
        phases = mixed_phases(capacity, pods=args.pods, saturation=args.saturation, seed=args.seed)
    runs: dict[str, Any] = {}
    for name in chosen:
        async with control_plane(client_qps=SYNTHETIC_CLIENT_QPS) as (plane, api):
            decider = tangram_decider(plane.kubeconfig) if name == "tangram" else kube_scheduler_decider()
            started = time.monotonic()
            runs[name] = await run_synthetic(
                api,
                plane,
                nodes,
                phases,
                decider,
                namespace=f"bench-{secrets.token_hex(3)}",
                concurrency=args.concurrency,
                rate=args.rate,
            )
            runs[name]["run_s"] = round(time.monotonic() - started, 1)
            runs[name]["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    machines = sorted({m for _, m in nodes})
    result: dict[str, Any] = {
        "benchmark": "kubernetes",
        "synthetic_nodes": True,
        "workload": args.workload,
        "seed": args.seed,
        "nodes": len(nodes),
        "machines": {m: sum(1 for _, x in nodes if x == m) for m in machines},
        "gpus": capacity,
        "concurrency": args.concurrency,
        "rate": args.rate,
        "components_client_qps": SYNTHETIC_CLIENT_QPS,
        "phases": {p.name: len(p.ops) for p in phases},
        "runs": runs,
    }
    if "tangram" in runs and "kube-scheduler" in runs:
        result["tangram_over_kube_scheduler"] = synthetic_ratios(runs["tangram"], runs["kube-scheduler"])
    return result


def run(args: argparse.Namespace) -> int:
    # The kubelet stand-ins log each prepare they retry; the report counts the pods never prepared.
    logging.getLogger("tangram.local.kubelet").setLevel(logging.ERROR)
    try:
        result = asyncio.run(stopped_by_signal(bench(args)))
    except (BenchError, ControlPlaneError, KubeApiError, OSError) as error:
        print(f"tangram bench kubernetes: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    shown = synthetic_table(result) if result.get("synthetic_nodes") else table(result)
    print(json.dumps(result) if args.json else shown)
    return 0
