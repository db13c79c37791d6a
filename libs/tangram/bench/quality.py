"""`tangram bench quality`: placement quality against first-fit, best-fit and an exact ILP optimum.

Each instance is a mixed fleet (NVSwitch, NVLink-bridged pairs, no NVLink; at least 8 nodes of
3 kinds, names shuffled so that name order says nothing) and a trace: `fill` traces only arrive,
`churn` traces first run arrivals and departures at 50% load, then only arrive. Either way the
arrivals ask for `--saturation` times the fleet's GPUs. Every policy replays the trace until its
first failure; the claims it admitted before (and their GPUs) are compared with the longest
prefix of the same trace whose claims alive an exact ILP (HiGHS) fits at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import combinations
from typing import Any, TypeVar

from tangram.allocation import POLICIES, Allocated, Claim, DeviceClass, FleetState, NvlinkTally, Policy
from tangram.bench.traces import (
    BENCH_MIX,
    Arrival,
    ClaimShape,
    Op,
    build_fleet,
    claim_spec,
    fleet_gpus,
    saturating_trace,
    shipped_classes,
)
from tangram.dra import partitionable, whole_gpu_advertised
from tangram.events.inventory import NodeHardware, renamed_machine

Node = TypeVar("Node")
CHURN_LOAD = 0.5  # share of the fleet's GPUs the claims alive ask for while a churn trace churns
TARGETS = {"fill_claims_ratio": 0.97, "churn_claims_ratio": 0.90}
# Mixed fleets of at least 8 nodes of three kinds: NVSwitch (8-GPU NVLink sets, MIG), NVLink-bridged
# pairs (MIG), and L40S without NVLink or MIG.
FLEETS: tuple[tuple[tuple[str, int], ...], ...] = (
    (("hgx-h200", 2), ("h100-nvl-4x2", 3), ("l40s-8", 3)),
    (("hgx-h200", 3), ("h100-nvl-4x2", 3), ("l40s-8", 4)),
    (("hgx-h200", 2), ("h100-nvl-4x2", 4), ("l40s-8", 2)),
    (("hgx-h200", 3), ("h100-nvl-4x2", 2), ("l40s-8", 3)),
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
def stdout_to_stderr() -> Iterator[None]:
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

    with stdout_to_stderr():
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


def shuffled_names(nodes: list[NodeHardware], seed: int) -> list[NodeHardware]:
    """The same fleet under random names, so that name order says nothing about the hardware."""
    rng = random.Random(seed * 104729 + 7)  # noqa: S311 - reproducible names, not a secret
    names = [f"node-{rng.getrandbits(32):08x}" for _ in nodes]
    return [renamed_machine(hw, name) for hw, name in zip(nodes, names, strict=True)]


def replay(
    nodes: list[NodeHardware], ops: list[Op], classes: Mapping[str, DeviceClass], policy: Policy
) -> dict[str, Any]:
    """One policy over the trace on a fresh fleet, up to its first failure: what it admitted."""
    fleet = FleetState()
    for hw in nodes:
        fleet.apply_inventory(hw)
    alive: dict[str, ClaimShape] = {}
    nvlink = NvlinkTally()
    arrivals = 0
    admitted_gpus = 0.0
    failed_at: int | None = None
    for op in ops:
        if not isinstance(op, Arrival):
            fleet.release(op.uid)
            alive.pop(op.uid, None)
            continue
        claim = Claim(namespace="bench", name=op.uid, uid=op.uid, spec=claim_spec(op.shape))
        decision = fleet.allocate(claim, classes, policy)
        if not isinstance(decision, Allocated):
            failed_at = arrivals
            break
        arrivals += 1
        admitted_gpus += op.shape.gpus()
        alive[op.uid] = op.shape
        nvlink.count(decision)
    metrics = fleet.metrics()
    return {
        "arrivals_before_first_failure": arrivals,
        "failed": failed_at is not None,
        "claims": arrivals,  # admitted before the first failure
        "gpus": round(admitted_gpus, 3),  # their GPUs (MIG devices as their share of a GPU)
        "claims_alive": len(alive),
        "gpus_alive": round(sum(shape.gpus() for shape in alive.values()), 3),
        "stranded_gpus": metrics.stranded_gpus,
        "free_gpus": metrics.free_gpus,
        "nvlink": dataclasses.asdict(nvlink),
    }


def _alive_after(ops: list[Op], arrivals: int) -> list[ClaimShape]:
    """The claims alive the moment the `arrivals`-th arrival came (with the departures between the
    arrivals; those listed after it happen later, so its claim met the claims they end)."""
    alive: dict[str, ClaimShape] = {}
    seen = 0
    for op in ops:
        if seen == arrivals:
            break
        if isinstance(op, Arrival):
            seen += 1
            alive[op.uid] = op.shape
        else:
            alive.pop(op.uid, None)
    return list(alive.values())


def optimal_prefix(
    nodes: Sequence[Node],
    ops: list[Op],
    feasible_at: int,
    *,
    capacity_gpus: float,
    time_limit_s: float,
    solve: Callable[..., Optimum] = optimal_admitted,
) -> tuple[int, bool, float]:
    """The most arrivals, past `feasible_at` (known to fit), whose claims alive all fit at once.

    Binary search over the arrivals of the trace's arrival-only tail (feasibility is monotone
    there), each step an exact ILP (`solve`: optimal_admitted by default). `feasible_at` is at
    least the end of the churn phase: unless a policy's failure during the churn is shown to be unavoidable
    (failing_too), the optimum is taken to fit every claim alive during the churn, so with
    departures this is an upper bound on any placement that never moves a claim.
    Returns (arrivals, proven, seconds).
    """
    total = sum(isinstance(op, Arrival) for op in ops)
    lo, hi = feasible_at, total + 1
    for arrivals in range(feasible_at + 1, total + 1):
        if sum(shape.gpus() for shape in _alive_after(ops, arrivals)) > capacity_gpus + 1e-9:
            hi = arrivals
            break
    proven = True
    seconds = 0.0
    while hi - lo > 1:
        middle = (lo + hi) // 2
        alive = _alive_after(ops, middle)
        optimum = solve(nodes, alive, time_limit_s=time_limit_s)
        seconds += optimum.seconds
        if optimum.admitted >= len(alive):
            lo = middle
        elif optimum.proven or optimum.bound < len(alive) - 0.5:
            hi = middle
        else:
            proven = False  # unknown: counted as not fitting, so the optimum is understated
            hi = middle
    return lo, proven, round(seconds, 3)


def failing_too(
    nodes: Sequence[Node],
    ops: list[Op],
    results: Any,
    churn_claims: int,
    *,
    time_limit_s: float,
    solve: Callable[..., Optimum] = optimal_admitted,
) -> tuple[int, bool, float] | None:
    """Where a policy failed during the churn, whether no placement at all fits the claims alive
    with the failing claim: then the optimum's first failure is there too (the earliest such)."""
    seconds = 0.0
    failures = sorted({r["arrivals_before_first_failure"] for r in results if r["failed"]})
    for arrivals in failures:
        if arrivals >= churn_claims:
            break
        alive = _alive_after(ops, arrivals + 1)
        optimum = solve(nodes, alive, time_limit_s=time_limit_s)
        seconds += optimum.seconds
        if optimum.proven and optimum.admitted < len(alive):
            return arrivals, True, round(seconds, 3)
    return None


def run_instance(
    fleet_spec: tuple[tuple[str, int], ...],
    seed: int,
    classes: Mapping[str, DeviceClass],
    policies: list[Policy],
    *,
    churn_claims: int,
    saturation: float,
    time_limit_s: float,
) -> dict[str, Any]:
    nodes = shuffled_names(build_fleet(list(fleet_spec)), seed)
    capacity = fleet_gpus(nodes)
    ops = saturating_trace(
        seed, capacity, churn_claims=churn_claims, churn_load=CHURN_LOAD, saturation=saturation, mix=BENCH_MIX
    )
    results = {policy: replay(nodes, ops, classes, policy) for policy in policies}
    packing = [packing_node(hw) for hw in nodes]
    found = failing_too(packing, ops, results.values(), churn_claims, time_limit_s=time_limit_s)
    if found is not None:
        best, proven, seconds = found
    else:
        known = max(churn_claims, *(r["arrivals_before_first_failure"] for r in results.values()))
        best, proven, seconds = optimal_prefix(
            packing, ops, known, capacity_gpus=capacity, time_limit_s=time_limit_s
        )
    arrived = [op.shape for op in ops if isinstance(op, Arrival)][:best]
    optimum = {
        "arrivals_before_first_failure": best,
        "claims": best,
        "gpus": round(sum(shape.gpus() for shape in arrived), 3),
        "proven": proven,
        "seconds": seconds,
    }
    for result in results.values():
        result["claims_ratio"] = round(result["claims"] / optimum["claims"], 4) if optimum["claims"] else 1.0
        result["gpus_ratio"] = round(result["gpus"] / optimum["gpus"], 4) if optimum["gpus"] else 1.0
    return {
        "trace": "churn" if churn_claims else "fill",
        "fleet": dict(fleet_spec),
        "node_names": sorted(hw.node for hw in nodes),
        "gpus": capacity,
        "seed": seed,
        "saturation": saturation,
        "arrivals": sum(isinstance(op, Arrival) for op in ops),
        "departures": sum(not isinstance(op, Arrival) for op in ops),
        "optimum": optimum,
        "policies": results,
    }


def summarize(instances: list[dict[str, Any]], policies: list[Policy]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for trace in ("fill", "churn", "all"):
        chosen = [i for i in instances if trace in ("all", i["trace"])]
        if not chosen:
            continue
        optimum_claims = sum(i["optimum"]["claims"] for i in chosen)
        optimum_gpus = sum(i["optimum"]["gpus"] for i in chosen)
        per_policy: dict[str, Any] = {}
        for policy in policies:
            rows = [i["policies"][policy] for i in chosen]
            nvlink = NvlinkTally()
            for row in rows:
                nvlink.add(NvlinkTally(**row["nvlink"]))
            claims = sum(r["claims"] for r in rows)
            gpus = sum(r["gpus"] for r in rows)
            per_policy[policy] = {
                "claims": claims,
                "gpus": round(gpus, 3),
                "claims_ratio": round(claims / optimum_claims, 4) if optimum_claims else 1.0,
                "gpus_ratio": round(gpus / optimum_gpus, 4) if optimum_gpus else 1.0,
                "mean_instance_claims_ratio": round(sum(r["claims_ratio"] for r in rows) / len(rows), 4),
                "worst_instance_claims_ratio": min(r["claims_ratio"] for r in rows),
                "stranded_gpus": round(sum(r["stranded_gpus"] for r in rows), 3),
                **nvlink.report(),
            }
        out[trace] = {
            "instances": len(chosen),
            "optimum": {"claims": optimum_claims, "gpus": round(optimum_gpus, 3)},
            "all_proven": all(i["optimum"]["proven"] for i in chosen),
            "policies": per_policy,
        }
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--instances", type=int, default=8, help="instances per trace kind, fill and churn (default 8)"
    )
    parser.add_argument(
        "--churn-claims", type=int, default=300, help="arrivals with departures before a churn trace fills"
    )
    parser.add_argument(
        "--saturation",
        type=float,
        default=1.3,
        help="a trace asks for this many times the fleet's GPUs (default 1.3)",
    )
    parser.add_argument("--time-limit", type=float, default=30.0, help="ILP time limit per solve, s")


def bench(args: argparse.Namespace) -> dict[str, Any]:
    if (
        args.instances < 1
        or args.churn_claims < 1
        or args.time_limit <= 0
        or not 1.0 <= args.saturation <= 2.0
    ):
        raise ValueError(
            "--instances and --churn-claims must be positive, --time-limit > 0, --saturation in [1, 2]"
        )
    classes = shipped_classes()
    policies = list(POLICIES)
    instances = [
        run_instance(
            FLEETS[n % len(FLEETS)],
            args.seed + n,
            classes,
            policies,
            churn_claims=churn,
            saturation=args.saturation,
            time_limit_s=args.time_limit,
        )
        for churn in (0, args.churn_claims)
        for n in range(args.instances)
    ]
    summary = summarize(instances, policies)
    tangram = {trace: summary[trace]["policies"]["tangram"] for trace in summary}
    first_fit = summary["all"]["policies"]["first-fit"]
    return {
        "benchmark": "quality",
        "seed": args.seed,
        "metric": "claims (and their GPUs) admitted before the first failure, against the longest "
        "prefix of the same trace whose claims alive an exact ILP (HiGHS) fits at every failure checked",
        "targets": TARGETS,
        "meets_targets": {
            "fill_claims_ratio": tangram["fill"]["claims_ratio"] >= TARGETS["fill_claims_ratio"],
            "churn_claims_ratio": tangram["churn"]["claims_ratio"] >= TARGETS["churn_claims_ratio"],
            "above_first_fit": tangram["all"]["mean_instance_claims_ratio"]
            > first_fit["mean_instance_claims_ratio"],
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
