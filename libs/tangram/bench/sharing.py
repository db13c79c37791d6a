"""`tangram bench sharing`: small inference claims sharing GPUs, against whole-GPU allocation, a
first-fit sharing baseline and an exact ILP optimum (HiGHS) of the same trace prefix.

The fleet is an inference fleet (L40S nodes, H100 NVL nodes; names shuffled). The trace asks for
shares of 2-24 GiB (some with a compute percentage) and some exclusive 1-2 GPU claims, with
departures while it churns at half load, then arrivals only until the claims alive ask for
`--saturation` times the fleet (a share counted as its memory over 48 GiB). Every policy replays
the trace until its first failure:

- `tangram`: Tangram's sharing (packs shares onto GPUs already shared, keeps NVLink pairs and
  whole GPUs for exclusive claims, carves MIG instances sized for shares);
- `first-fit`: shares on the first device that has room, in node and device order;
- `whole-gpu`: no sharing, as before Tangram shared: every share takes a whole GPU.

Reported per policy: claims admitted before the first failure, GPUs in use then, and the memory
stranded then (memory of the GPUs in use that no claim holds: a whole GPU given to a 6 GiB share
strands the rest). The optimum is the longest prefix of the same trace whose claims alive an
exact ILP fits at once, with the same share hosts (whole GPUs, MIG placements without media
extensions) and the same rule that a GPU is either held whole or hosts shares.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tangram.allocation import Allocated, Claim, DeviceClass, FleetState, Policy
from tangram.bench.packing import Optimum, exact_solver
from tangram.bench.quality import failing_too, optimal_prefix, shuffled_names
from tangram.bench.traces import (
    Arrival,
    ClaimShape,
    Op,
    build_fleet,
    claim_spec,
    fleet_gpus,
    saturating_trace,
    shipped_classes,
)
from tangram.dra import node_devices
from tangram.events.inventory import NodeHardware

MIB = 2**20
FLEET: tuple[tuple[str, int], ...] = (("l40s-8", 3), ("h100-nvl-4x2", 2))
CHURN_LOAD = 0.5
# Embedders, rerankers and small LLMs (2-24 GiB, a few with a compute percentage), and some
# exclusive claims of 1 or 2 GPUs.
SHARING_MIX: tuple[tuple[ClaimShape, float], ...] = (
    (ClaimShape("share", memory_gib=2), 0.08),
    (ClaimShape("share", memory_gib=4), 0.14),
    (ClaimShape("share", memory_gib=6), 0.10),
    (ClaimShape("share", memory_gib=8), 0.12),
    (ClaimShape("share", memory_gib=12), 0.10),
    (ClaimShape("share", memory_gib=16), 0.08),
    (ClaimShape("share", memory_gib=24), 0.06),
    (ClaimShape("share", memory_gib=4, percent=25), 0.07),
    (ClaimShape("share", memory_gib=8, percent=25), 0.06),
    (ClaimShape("share", memory_gib=12, percent=50), 0.04),
    (ClaimShape("gpu", 1), 0.10),
    (ClaimShape("gpu", 2), 0.05),
)
SharingPolicy = str  # "tangram" | "first-fit" | "whole-gpu"
POLICIES: tuple[SharingPolicy, ...] = ("tangram", "first-fit", "whole-gpu")
_ALLOCATOR_POLICY: dict[SharingPolicy, Policy] = {
    "tangram": "tangram",
    "first-fit": "first-fit",
    "whole-gpu": "tangram",
}


# --- replaying a policy --------------------------------------------------------------------------


def as_claimed(shape: ClaimShape, policy: SharingPolicy) -> ClaimShape:
    """Without sharing, a share is a claim of one whole GPU."""
    return ClaimShape("gpu", 1) if policy == "whole-gpu" and shape.kind == "share" else shape


def replay(
    nodes: list[NodeHardware], ops: list[Op], classes: Mapping[str, DeviceClass], policy: SharingPolicy
) -> dict[str, Any]:
    """The policy over the trace on a fresh fleet, up to its first failure."""
    fleet = FleetState()
    for hw in nodes:
        fleet.apply_inventory(hw)
    gpu_memory = {(hw.node, g.index): g.memory_mib * MIB for hw in nodes for g in hw.gpus}
    alive: dict[str, tuple[ClaimShape, Allocated]] = {}
    admitted = 0
    failed = False
    for op in ops:
        if not isinstance(op, Arrival):
            fleet.release(op.uid)
            alive.pop(op.uid, None)
            continue
        spec = claim_spec(as_claimed(op.shape, policy))
        decision = fleet.allocate(
            Claim(namespace="bench", name=op.uid, uid=op.uid, spec=spec), classes, _ALLOCATOR_POLICY[policy]
        )
        if not isinstance(decision, Allocated):
            failed = True
            break
        admitted += 1
        alive[op.uid] = (op.shape, decision)
    held: Counter[tuple[str, int]] = Counter()  # bytes claims hold, per GPU in use
    for shape, decision in alive.values():
        for device in decision.devices:
            key = (decision.node, device.gpu_index)
            if device.share is not None:
                held[key] += device.share.memory_bytes
            elif shape.kind == "share":  # a share given a whole GPU holds only its memory
                held[key] += shape.memory_gib * 2**30
            else:
                held[key] += gpu_memory[key]
    stranded = sum(gpu_memory[key] - min(used, gpu_memory[key]) for key, used in held.items())
    return {
        "claims": admitted,
        "failed": failed,
        "arrivals_before_first_failure": admitted,
        "shares_alive": sum(shape.kind == "share" for shape, _ in alive.values()),
        "exclusive_alive": sum(shape.kind != "share" for shape, _ in alive.values()),
        "gpus_used": len(held),
        "memory_stranded_gib": round(stranded / 2**30, 2),
    }


# --- the exact optimum ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ShareHost:
    gpu: int
    rows: tuple[int, ...]  # the GPU's rows it covers: memory slices, or (-1,) for a GPU without MIG
    memory: int  # MiB


@dataclass(frozen=True, slots=True)
class SharingNode:
    name: str
    whole: tuple[tuple[int, tuple[int, ...]], ...]  # GPUs handed out whole, with the rows they cover
    hosts: tuple[ShareHost, ...]


def sharing_node(hw: NodeHardware) -> SharingNode:
    """The node as the allocator sees it with sharing: whole GPUs and share hosts, from the same
    devices (node_devices with share hosts), so the optimum plays by the same rules."""
    devices = node_devices(hw, shared=True).devices
    slices = {g.index: g.memory_slices for g in hw.gpus}

    def rows(gpu: int, covered: range | None) -> tuple[int, ...]:
        if not slices[gpu]:
            return (-1,)
        return tuple(covered if covered is not None else range(slices[gpu]))

    whole = tuple((d.gpu_index, rows(d.gpu_index, None)) for d in devices if d.kind == "gpu" and not d.shared)
    hosts = tuple(
        ShareHost(
            gpu=d.gpu_index,
            rows=rows(
                d.gpu_index,
                range(d.placement.start, d.placement.start + d.placement.size) if d.placement else None,
            ),
            memory=next(v for k, v in d.capacity.items() if k.endswith("/memory")) // MIB,
        )
        for d in devices
        if d.shared
    )
    return SharingNode(name=hw.node, whole=whole, hosts=hosts)


def optimal_sharing(
    nodes: list[SharingNode], claims: list[ClaimShape], *, time_limit_s: float = 30.0
) -> Optimum:
    """The most of `claims` the fleet holds at once (an exact ILP, HiGHS).

    - n[s,h] integer: shares of shape s on host h; sum_s n[s,h] * memory(s) <= memory(h) * open[h]
      and sum_s n[s,h] * percent(s) <= 100 * open[h];
    - exclusive shape e of k GPUs: on each node, slots j with y[e,n,j] in {0,1} and x[e,n,j,g]
      in {0,1}: sum_g x = k * y (no NVLink asked in this mix);
    - per GPU row (memory slice, or the GPU without MIG): whole uses + open hosts covering it <= 1;
    - supply: per shape, no more than the claims of that shape; maximise the claims held.
    """
    import highspy  # noqa: PLC0415 - the solver is needed by this benchmark only

    h = exact_solver(time_limit_s)
    demand = Counter(claims)
    objective: list[Any] = []
    uses: dict[tuple[str, int, int], list[Any]] = {}
    shares = sorted((s for s in demand if s.kind == "share"), key=lambda s: s.label)
    supply: dict[ClaimShape, list[Any]] = {s: [] for s in demand}
    for node in nodes:
        for host in node.hosts:
            fitting = [s for s in shares if s.memory_gib * 1024 <= host.memory]
            if not fitting:
                continue
            opened = h.addBinary()
            for row in host.rows:
                uses.setdefault((node.name, host.gpu, row), []).append(opened)
            counts = {
                s: h.addIntegral(lb=0, ub=min(demand[s], host.memory // (s.memory_gib * 1024)))
                for s in fitting
            }
            h.addConstr(sum(n * (s.memory_gib * 1024) for s, n in counts.items()) - host.memory * opened <= 0)
            limited = [(s, n) for s, n in counts.items() if s.percent]
            if limited:
                h.addConstr(sum(n * s.percent for s, n in limited) - 100 * opened <= 0)
            for s, n in counts.items():
                supply[s].append(n)
        for shape in (s for s in demand if s.kind == "gpu"):
            gpus = dict(node.whole)
            previous = None
            for _ in range(min(demand[shape], len(gpus) // shape.count)):
                y = h.addBinary()
                xs = {g: h.addBinary() for g in gpus}
                h.addConstr(sum(xs.values()) - shape.count * y == 0)
                for g, x in xs.items():
                    for row in gpus[g]:
                        uses.setdefault((node.name, g, row), []).append(x)
                if previous is not None:
                    h.addConstr(previous - y >= 0)
                previous = y
                supply[shape].append(y)
    for shape, variables in supply.items():
        if variables:
            h.addConstr(sum(variables) <= demand[shape])
            objective.extend(variables)
    for variables in uses.values():
        if len(variables) > 1:
            h.addConstr(sum(variables) <= 1)
    if not objective:
        return Optimum(admitted=0, proven=True, bound=0.0, seconds=0.0)
    started = time.perf_counter()
    h.maximize(sum(objective))
    seconds = time.perf_counter() - started
    info = h.getInfo()
    return Optimum(
        admitted=round(h.getObjectiveValue()),
        proven=h.getModelStatus() == highspy.HighsModelStatus.kOptimal,
        bound=float(info.mip_dual_bound),
        seconds=round(seconds, 3),
    )


# --- the benchmark -------------------------------------------------------------------------------


def run_instance(
    seed: int,
    classes: Mapping[str, DeviceClass],
    *,
    churn_claims: int,
    saturation: float,
    time_limit_s: float,
) -> dict[str, Any]:
    nodes = shuffled_names(build_fleet(list(FLEET)), seed)
    capacity = fleet_gpus(nodes)
    ops = saturating_trace(
        seed,
        capacity,
        churn_claims=churn_claims,
        churn_load=CHURN_LOAD,
        saturation=saturation,
        mix=SHARING_MIX,
    )
    results = {policy: replay(nodes, ops, classes, policy) for policy in POLICIES}
    packing = [sharing_node(hw) for hw in nodes]
    found = failing_too(
        packing, ops, results.values(), churn_claims, time_limit_s=time_limit_s, solve=optimal_sharing
    )
    if found is not None:
        best, proven, seconds = found
    else:
        known = max(churn_claims, *(r["claims"] for r in results.values()))
        best, proven, seconds = optimal_prefix(
            packing, ops, known, capacity_gpus=float("inf"), time_limit_s=time_limit_s, solve=optimal_sharing
        )
    for result in results.values():
        result["claims_ratio_to_optimum"] = round(result["claims"] / best, 4) if best else 1.0
    arrivals = [op.shape for op in ops if isinstance(op, Arrival)]
    return {
        "seed": seed,
        "fleet": dict(FLEET),
        "node_names": sorted(hw.node for hw in nodes),
        "gpus": capacity,
        "arrivals": len(arrivals),
        "share_arrivals": sum(s.kind == "share" for s in arrivals),
        "departures": len(ops) - len(arrivals),
        "optimum": {"claims": best, "proven": proven, "seconds": seconds},
        "policies": results,
    }


def summarize(instances: list[dict[str, Any]]) -> dict[str, Any]:
    optimum = sum(i["optimum"]["claims"] for i in instances)
    per_policy: dict[str, Any] = {}
    for policy in POLICIES:
        rows = [i["policies"][policy] for i in instances]
        claims = sum(r["claims"] for r in rows)
        per_policy[policy] = {
            "claims": claims,
            "claims_ratio_to_optimum": round(claims / optimum, 4) if optimum else 1.0,
            "gpus_used": sum(r["gpus_used"] for r in rows),
            "memory_stranded_gib": round(sum(r["memory_stranded_gib"] for r in rows), 2),
        }
    tangram = per_policy["tangram"]

    def ratio(a: float, b: float) -> float:
        return round(a / b, 4) if b else 0.0

    return {
        "instances": len(instances),
        "optimum": {"claims": optimum, "all_proven": all(i["optimum"]["proven"] for i in instances)},
        "policies": per_policy,
        "ratios": {
            "claims_vs_whole_gpu": ratio(tangram["claims"], per_policy["whole-gpu"]["claims"]),
            "claims_vs_first_fit": ratio(tangram["claims"], per_policy["first-fit"]["claims"]),
            "claims_vs_optimum": tangram["claims_ratio_to_optimum"],
            "stranded_vs_first_fit": ratio(
                tangram["memory_stranded_gib"], per_policy["first-fit"]["memory_stranded_gib"]
            ),
            "stranded_vs_whole_gpu": ratio(
                tangram["memory_stranded_gib"], per_policy["whole-gpu"]["memory_stranded_gib"]
            ),
        },
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--instances", type=int, default=4, help="traces, one seed each (default 4)")
    parser.add_argument("--churn-claims", type=int, default=200, help="arrivals with departures first")
    parser.add_argument(
        "--saturation",
        type=float,
        default=1.5,
        help="a trace asks for this many times the fleet (default 1.5)",
    )
    parser.add_argument("--time-limit", type=float, default=30.0, help="ILP time limit per solve, s")


def bench(args: argparse.Namespace) -> dict[str, Any]:
    if (
        args.instances < 1
        or args.churn_claims < 0
        or args.time_limit <= 0
        or not 1.0 <= args.saturation <= 3.0
    ):
        raise ValueError(
            "--instances must be positive, --churn-claims >= 0, --time-limit > 0, --saturation in [1, 3]"
        )
    classes = shipped_classes()
    instances = [
        run_instance(
            args.seed + n,
            classes,
            churn_claims=args.churn_claims,
            saturation=args.saturation,
            time_limit_s=args.time_limit,
        )
        for n in range(args.instances)
    ]
    return {
        "benchmark": "sharing",
        "seed": args.seed,
        "metric": "claims admitted before the first failure (and GPUs used, memory stranded then), "
        "against whole-GPU allocation, first-fit sharing, and the longest prefix of the same trace "
        "whose claims alive an exact ILP (HiGHS) fits at once",
        "summary": summarize(instances),
        "instances": instances,
    }


def run(args: argparse.Namespace) -> int:
    try:
        result = bench(args)
    except (ValueError, OSError) as error:
        print(f"tangram bench sharing: {error}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0
