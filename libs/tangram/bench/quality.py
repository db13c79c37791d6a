"""`tangram bench quality`: placement quality against first-fit, best-fit and an exact ILP optimum.

Each instance is a small mixed fleet and a trace that churns, then only arrives until the claims
alive ask for the whole fleet (the saturation point). Every policy replays the same trace; the
optimum is the most of the claims alive at saturation that any placement admits at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from tangram.allocation import POLICIES, Allocated, Claim, DeviceClass, FleetState, NvlinkTally, Policy
from tangram.bench.traces import (
    Arrival,
    ClaimShape,
    Op,
    alive_at_end,
    build_fleet,
    claim_spec,
    fleet_gpus,
    saturating_trace,
    shipped_classes,
)
from tangram.dra import partitionable, whole_gpu_advertised
from tangram.events.inventory import NodeHardware

TARGET_OPTIMUM_SHARE = 0.99
FLEETS: tuple[tuple[tuple[str, int], ...], ...] = (
    (("dgx-h100", 1), ("h100-nvl-4x2", 1), ("l40s-8", 1)),
    (("dgx-h100", 1), ("a100-pcie-2x2", 2), ("h100-nvl-4x2", 1)),
    (("hgx-h200", 2), ("a100-pcie-2x2", 1), ("l40s-8", 1)),
    (("h100-nvl-4x2", 2), ("a100-pcie-2x2", 2)),
)


# --- the packing problem -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PackingGpu:
    index: int
    whole: bool  # can be handed out whole
    slices: int  # MIG memory slices; 0 when the GPU cannot be partitioned
    placements: tuple[tuple[int, int, int], ...] = ()  # (compute slices, start, size), no +me profile


@dataclass(frozen=True, slots=True)
class PackingNode:
    name: str
    gpus: tuple[PackingGpu, ...]
    nvlinked: frozenset[tuple[int, int]]  # GPU index pairs (a < b) with at least one NVLink


@dataclass(frozen=True, slots=True)
class Optimum:
    admitted: int
    proven: bool  # the solver proved optimality (no time limit hit)
    bound: float  # the solver's upper bound on the admitted claims
    seconds: float


def packing_node(hw: NodeHardware) -> PackingNode:
    """What a node offers to the packing problem, by the same advertising rules as discovery."""
    gpus = []
    for gpu in sorted(hw.gpus, key=lambda g: g.index):
        if gpu.health != "healthy":
            continue
        cut = partitionable(gpu)
        placements = (
            tuple(
                sorted(
                    {
                        (p.compute_slices, place.start, place.size)
                        for p in gpu.mig_profiles
                        if not p.media_extensions
                        for place in p.placements
                    }
                )
            )
            if cut
            else ()
        )
        gpus.append(
            PackingGpu(
                index=gpu.index,
                whole=whole_gpu_advertised(gpu),
                slices=gpu.memory_slices if cut else 0,
                placements=placements,
            )
        )
    nvlinked = frozenset((min(link.a, link.b), max(link.a, link.b)) for link in hw.links if link.nvlinks > 0)
    return PackingNode(name=hw.node, gpus=tuple(gpus), nvlinked=nvlinked)


@contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """HiGHS prints its banner on file descriptor 1 when first constructed; stdout carries the JSON."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def optimal_admitted(
    nodes: list[PackingNode], claims: list[ClaimShape], *, time_limit_s: float = 60.0
) -> Optimum:
    """The most claims of `claims` that the fleet admits at the same time (an exact ILP, HiGHS).

    Claims of one shape are interchangeable, so the model counts them per shape instead of naming
    each (the same optimum without the symmetry of identical claims):

    - whole-GPU shape s (k GPUs, optionally NVLink): on each node n, slots j = 0..floor(W/k)-1
      (W = GPUs the node hands out whole); y[s,n,j] in {0,1} says slot j holds a claim and
      x[s,n,j,g] in {0,1} that it uses GPU g: sum_g x[s,n,j,g] = k * y[s,n,j]; when the shape
      asks for NVLink, x[s,n,j,g] + x[s,n,j,h] <= 1 for every pair g,h without NVLink (so the set
      is NVLink-connected pairwise); y[s,n,j] >= y[s,n,j+1] breaks the slots' symmetry;
    - MIG shape s (c compute slices, m memory slices): z[s,n,g,p] in {0,1} for each placement p
      of a profile with c compute and m memory slices (media-extension profiles excluded);
    - supply: sum_{n,j} y[s,n,j] <= claims of shape s, and sum_{n,g,p} z[s,n,g,p] <= claims of s;
    - one GPU, per memory slice q: sum of its whole-GPU uses + sum of the placements covering q
      <= 1 (memory slices never overlap, a GPU used whole has no MIG device); a GPU without MIG
      has one such row over its whole-GPU uses;
    - maximise sum y + sum z.
    """
    import highspy  # noqa: PLC0415 - the solver is needed by this benchmark only

    with _stdout_to_stderr():
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit_s))
    h.setOptionValue("mip_rel_gap", 0.0)
    demand = Counter(claims)
    objective: list[Any] = []
    uses: dict[tuple[str, int, int], list[Any]] = {}  # (node, gpu, slice or -1) -> variables
    for shape, count in sorted(demand.items(), key=lambda item: item[0].label):
        supply: list[Any] = []
        for node in nodes:
            if shape.kind == "gpu":
                whole = [g.index for g in node.gpus if g.whole]
                slot_vars: list[Any] = []
                for _ in range(min(count, len(whole) // shape.count)):
                    y = h.addBinary()
                    xs = {g: h.addBinary() for g in whole}
                    h.addConstr(sum(xs.values()) - shape.count * y == 0)
                    if shape.nvlink:
                        for a, b in combinations(whole, 2):
                            if (min(a, b), max(a, b)) not in node.nvlinked:
                                h.addConstr(xs[a] + xs[b] <= 1)
                    for gpu in node.gpus:
                        if gpu.index in xs:
                            for q in range(gpu.slices) if gpu.slices else (-1,):
                                uses.setdefault((node.name, gpu.index, q), []).append(xs[gpu.index])
                    if slot_vars:
                        h.addConstr(slot_vars[-1] - y >= 0)
                    slot_vars.append(y)
                supply.extend(slot_vars)
                continue
            for gpu in node.gpus:
                for compute, start, size in gpu.placements:
                    if compute != shape.compute or size != shape.slices:
                        continue
                    z = h.addBinary()
                    supply.append(z)
                    for q in range(start, start + size):
                        uses.setdefault((node.name, gpu.index, q), []).append(z)
        if supply:
            h.addConstr(sum(supply) <= count)
            objective.extend(supply)
    for variables in uses.values():
        if len(variables) > 1:
            h.addConstr(sum(variables) <= 1)
    started = time.perf_counter()
    if not objective:
        return Optimum(admitted=0, proven=True, bound=0.0, seconds=0.0)
    h.maximize(sum(objective))
    seconds = time.perf_counter() - started
    status = h.getModelStatus()
    info = h.getInfo()
    return Optimum(
        admitted=round(h.getObjectiveValue()),
        proven=status == highspy.HighsModelStatus.kOptimal,
        bound=float(info.mip_dual_bound),
        seconds=round(seconds, 3),
    )


# --- the benchmark -------------------------------------------------------------------------------


def replay(
    nodes: list[NodeHardware], ops: list[Op], classes: Mapping[str, DeviceClass], policy: Policy
) -> dict[str, Any]:
    """One policy over the trace on a fresh fleet; figures read at the end (saturation)."""
    fleet = FleetState()
    for hw in nodes:
        fleet.apply_inventory(hw)
    admitted = failed = 0
    nvlink = NvlinkTally()
    for op in ops:
        if not isinstance(op, Arrival):
            fleet.release(op.uid)
            continue
        claim = Claim(namespace="bench", name=op.uid, uid=op.uid, spec=claim_spec(op.shape))
        decision = fleet.allocate(claim, classes, policy)
        if isinstance(decision, Allocated):
            admitted += 1
            nvlink.count(decision)
        else:
            failed += 1
    metrics = fleet.metrics()
    return {
        "admitted": admitted,
        "failed": failed,
        "alive_admitted_at_saturation": metrics.claims,
        "stranded_gpus": metrics.stranded_gpus,
        "free_gpus": metrics.free_gpus,
        "nvlink": dataclasses.asdict(nvlink),
    }


def run_instance(
    fleet_spec: tuple[tuple[str, int], ...],
    seed: int,
    classes: Mapping[str, DeviceClass],
    policies: list[Policy],
    *,
    churn_claims: int,
    time_limit_s: float,
) -> dict[str, Any]:
    nodes = build_fleet(list(fleet_spec))
    ops = saturating_trace(seed, fleet_gpus(nodes), churn_claims=churn_claims)
    alive = list(alive_at_end(ops).values())
    optimum = optimal_admitted([packing_node(hw) for hw in nodes], alive, time_limit_s=time_limit_s)
    results = {policy: replay(nodes, ops, classes, policy) for policy in policies}
    for result in results.values():
        held = result["alive_admitted_at_saturation"]
        result["optimum_share"] = round(held / optimum.admitted, 4) if optimum.admitted else 1.0
    return {
        "fleet": {machine: count for machine, count in fleet_spec},
        "gpus": fleet_gpus(nodes),
        "seed": seed,
        "arrivals": sum(isinstance(op, Arrival) for op in ops),
        "alive_at_saturation": len(alive),
        "optimum": {
            "admitted": optimum.admitted,
            "proven": optimum.proven,
            "bound": optimum.bound,
            "seconds": optimum.seconds,
        },
        "policies": results,
    }


def summarize(instances: list[dict[str, Any]], policies: list[Policy]) -> dict[str, Any]:
    optimum = sum(i["optimum"]["admitted"] for i in instances)
    out: dict[str, Any] = {}
    for policy in policies:
        rows = [i["policies"][policy] for i in instances]
        held = sum(r["alive_admitted_at_saturation"] for r in rows)
        nvlink = NvlinkTally()
        for row in rows:
            nvlink.add(NvlinkTally(**row["nvlink"]))
        out[policy] = {
            "admitted": sum(r["admitted"] for r in rows),
            "failed": sum(r["failed"] for r in rows),
            "stranded_gpus": round(sum(r["stranded_gpus"] for r in rows), 3),
            **nvlink.report(),
            "alive_admitted_at_saturation": held,
            "optimum_share": round(held / optimum, 4) if optimum else 1.0,
            "worst_instance_optimum_share": min((r["optimum_share"] for r in rows), default=1.0),
        }
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--instances", type=int, default=8, help="fleet/trace instances (default 8)")
    parser.add_argument(
        "--churn-claims", type=int, default=150, help="arrivals with departures before saturating"
    )
    parser.add_argument("--time-limit", type=float, default=60.0, help="ILP time limit per instance, s")


def bench(args: argparse.Namespace) -> dict[str, Any]:
    if args.instances < 1 or args.churn_claims < 0 or args.time_limit <= 0:
        raise ValueError("--instances must be positive, --churn-claims >= 0, --time-limit > 0")
    classes = shipped_classes()
    policies = list(POLICIES)
    instances = [
        run_instance(
            FLEETS[n % len(FLEETS)],
            args.seed + n,
            classes,
            policies,
            churn_claims=args.churn_claims,
            time_limit_s=args.time_limit,
        )
        for n in range(args.instances)
    ]
    summary = summarize(instances, policies)
    tangram = summary["tangram"]
    return {
        "benchmark": "quality",
        "seed": args.seed,
        "targets": {
            "optimum_share": TARGET_OPTIMUM_SHARE,
            "stranded_gpus": "strictly fewer than first-fit",
        },
        "meets_targets": {
            "optimum_share": tangram["optimum_share"] >= TARGET_OPTIMUM_SHARE,
            "fewer_stranded_than_first_fit": tangram["stranded_gpus"] < summary["first-fit"]["stranded_gpus"],
        },
        "summary": summary,
        "instances": instances,
    }


def run(args: argparse.Namespace) -> int:
    try:
        result = bench(args)
    except (ValueError, OSError) as error:
        print(f"tangram bench quality: {error}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0
