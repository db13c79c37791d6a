"""`tangram bench allocator`: decisions per second and decision latency at fleet scale.

Every policy runs the same generated trace on its own freshly built fleet, in the same process.
Memory is read from /proc/self/statm (resident set now) around the fleet build and the run, and
the process high-water mark from getrusage(RUSAGE_SELF).ru_maxrss.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

from tangram.allocation import POLICIES, Allocated, Claim, DeviceClass, FleetState, NvlinkTally, Policy
from tangram.bench.traces import (
    FLEET_MIX,
    Arrival,
    Op,
    build_fleet,
    churn_trace,
    claim_spec,
    fleet_gpus,
    mean_demand,
    shipped_classes,
)
from tangram.dra import node_devices
from tangram.events.inventory import NodeHardware
from tangram.stats import percentile

TARGET_DECISIONS_PER_S = 2000.0
TARGET_P99_MS = 5.0
MIB = 1024 * 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=1000, help="nodes in the fleet (default 1000)")
    parser.add_argument(
        "--gpus-per-node", type=int, default=8, help="GPUs per node: only the machine's own count is valid"
    )
    parser.add_argument("--claims", type=int, default=20_000, help="claim arrivals in the trace")
    parser.add_argument("--machine", default="hgx-h200", help="simulated machine of every node")
    parser.add_argument(
        "--mixed",
        action="store_true",
        help="a heterogeneous fleet of --nodes: 40%% hgx-h200, 30%% h100-nvl-4x2, 30%% l40s-8",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--load", type=float, default=0.75, help="share of the fleet's GPUs the claims alive ask for"
    )
    parser.add_argument(
        "--policies", default=",".join(POLICIES), help="comma-separated policies (default: all)"
    )
    parser.add_argument(
        "--keep-instances", action="store_true", help="keep the machine's pre-created MIG instances"
    )


def rss_now_bytes() -> int | None:
    """Resident set size now (Linux); None where /proc is not there."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * resource.getpagesize()


def _peak_rss_bytes() -> int:
    # ru_maxrss is KiB on Linux, bytes on macOS.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _mib(value: int | None) -> float | None:
    return None if value is None else round(value / MIB, 1)


def run_policy(
    nodes: list[NodeHardware], ops: list[Op], classes: dict[str, DeviceClass], policy: Policy
) -> dict[str, Any]:
    """Build the fleet, replay the trace; every arrival is one timed decision."""
    gc.collect()
    before = rss_now_bytes()
    started = time.perf_counter()
    fleet = FleetState()
    for hw in nodes:
        fleet.apply_inventory(hw)
    build_s = time.perf_counter() - started
    # A long-lived allocator freezes its startup heap too (services/allocator after rebuild), so a
    # full collection of the fleet's objects does not land inside the decisions being timed.
    gc.collect()
    gc.freeze()
    built = rss_now_bytes()
    specs: dict[str, dict[str, Any]] = {}
    timings: list[float] = []
    admitted = failed = 0
    nvlink = NvlinkTally()
    clock = time.perf_counter
    run_started = clock()
    for op in ops:
        if not isinstance(op, Arrival):
            fleet.release(op.uid)
            continue
        spec = specs.get(op.shape.label)
        if spec is None:
            spec = specs[op.shape.label] = claim_spec(op.shape)
        claim = Claim(namespace="bench", name=op.uid, uid=op.uid, spec=spec)
        t0 = clock()
        decision = fleet.allocate(claim, classes, policy)
        timings.append(clock() - t0)
        if isinstance(decision, Allocated):
            admitted += 1
            nvlink.count(decision)
        else:
            failed += 1
    run_s = clock() - run_started
    after = rss_now_bytes()
    metrics = fleet.metrics()
    decide_s = sum(timings)
    result = {
        "decisions": len(timings),
        "decisions_per_s": round(len(timings) / decide_s, 1) if decide_s > 0 else 0.0,
        "trace_ops_per_s": round(len(ops) / run_s, 1) if run_s > 0 else 0.0,
        "p50_decision_ms": round(percentile(timings, 0.50) * 1000, 3) if timings else 0.0,
        "p99_decision_ms": round(percentile(timings, 0.99) * 1000, 3) if timings else 0.0,
        "max_decision_ms": round(max(timings, default=0.0) * 1000, 3),
        "admitted": admitted,
        "failed": failed,
        **nvlink.report(),
        "free_gpus_at_end": metrics.free_gpus,
        "stranded_gpus_at_end": metrics.stranded_gpus,
        "fleet_build_s": round(build_s, 3),
        "fleet_rss_mib": _mib(built - before) if built is not None and before is not None else None,
        "run_rss_growth_mib": _mib(after - built) if after is not None and built is not None else None,
        "process_peak_rss_mib": _mib(_peak_rss_bytes()),
    }
    gc.unfreeze()
    del fleet
    return result


def _policies(text: str) -> list[Policy]:
    chosen: list[Policy] = []
    for name in (part.strip() for part in text.split(",")):
        if name not in POLICIES:
            raise ValueError(f"--policies: unknown policy {name!r} (known: {', '.join(POLICIES)})")
        chosen.append(name)
    return chosen


def _devices(nodes: list[NodeHardware], machines: list[tuple[str, int]]) -> int:
    """Devices advertised by the fleet: the nodes of each machine are built one after another."""
    total = 0
    first = 0
    for _, count in machines:
        total += len(node_devices(nodes[first]).devices) * count
        first += count
    return total


MIXED_FLEET = (("hgx-h200", 0.4), ("h100-nvl-4x2", 0.3), ("l40s-8", 0.3))


def _machines(args: argparse.Namespace) -> list[tuple[str, int]]:
    if not args.mixed:
        return [(args.machine, args.nodes)]
    counts = [(machine, int(args.nodes * share)) for machine, share in MIXED_FLEET]
    first, count = counts[0]
    counts[0] = (first, count + args.nodes - sum(c for _, c in counts))
    return [(machine, count) for machine, count in counts if count > 0]


def _check(args: argparse.Namespace, nodes: list[NodeHardware]) -> None:
    if args.nodes < 1 or args.claims < 1:
        raise ValueError("--nodes and --claims must be positive")
    if not 0 < args.load <= 2:
        raise ValueError("--load must be in (0, 2]")
    per_node = len(nodes[0].gpus)
    if args.gpus_per_node != per_node:
        raise ValueError(
            f"--gpus-per-node {args.gpus_per_node}: machine {args.machine!r} has {per_node} GPUs"
        )


def bench(args: argparse.Namespace) -> dict[str, Any]:
    policies = _policies(args.policies)
    started = time.perf_counter()
    machines = _machines(args)
    nodes = build_fleet(machines, keep_instances=args.keep_instances)
    hardware_s = time.perf_counter() - started
    _check(args, nodes)
    gpus = fleet_gpus(nodes)
    mean_alive = args.load * gpus / mean_demand(FLEET_MIX)
    ops = churn_trace(args.seed, args.claims, mean_alive, FLEET_MIX)
    classes = shipped_classes()
    results = {policy: run_policy(nodes, ops, classes, policy) for policy in policies}
    out: dict[str, Any] = {
        "benchmark": "allocator",
        "machine": "mixed" if args.mixed else args.machine,
        "fleet": dict(machines),
        "nodes": args.nodes,
        "gpus": gpus,
        "devices": _devices(nodes, machines),
        "claims": args.claims,
        "seed": args.seed,
        "load": args.load,
        "mean_claims_alive": round(mean_alive, 1),
        "hardware_build_s": round(hardware_s, 3),
        "memory_measure": "rss from /proc/self/statm; peak from getrusage ru_maxrss",
        "targets": {"decisions_per_s": TARGET_DECISIONS_PER_S, "p99_decision_ms": TARGET_P99_MS},
        "policies": results,
    }
    if "tangram" in results:
        tangram = results["tangram"]
        out["meets_targets"] = (
            tangram["decisions_per_s"] >= TARGET_DECISIONS_PER_S
            and tangram["p99_decision_ms"] < TARGET_P99_MS
        )
        out["ratios"] = {
            f"tangram/{baseline}": {
                key: round(tangram[key] / results[baseline][key], 3) if results[baseline][key] else None
                for key in ("decisions_per_s", "p99_decision_ms", "admitted")
            }
            for baseline in results
            if baseline != "tangram"
        }
    return out


def run(args: argparse.Namespace) -> int:
    try:
        result = bench(args)
    except (ValueError, OSError) as error:
        print(f"tangram bench allocator: {error}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0
